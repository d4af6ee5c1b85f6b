//! The durable bounds of a dispatcher's emits from one source partition:
//! `checkpoints/{consumerId}.emits` beside its checkpoint (docs/storage.md, "Storage").
//!
//! `{"bounds":[{"topic":"orders.eu","partition":0,"offset":1200},…]}`: every message the
//! dispatcher's plugin emitted for a source message at or past the durable checkpoint lies in one
//! of these destination partitions, at or past its offset. A destination not listed holds none.
//! Replaced durably (a crash leaves the old record or the new one), and only ever widened before
//! an append, so it is true at every moment.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use mmmq_core::{ConsumerId, Topic};

use crate::storage::{Checkpoints, StorageError};

/// The file extension beside the checkpoint.
pub const EXT: &str = "emits";

/// A destination partition.
pub type Dest = (Topic, u32);

/// Destination partition → the lowest offset an output past the checkpoint may have.
pub type Bounds = BTreeMap<Dest, u64>;

#[derive(Serialize, Deserialize)]
struct Record {
    bounds: Vec<Bound>,
}

#[derive(Serialize, Deserialize)]
struct Bound {
    topic: Topic,
    partition: u32,
    offset: u64,
}

/// Reads the bounds of `id` in `checkpoints` (none if it never emitted). Blocking.
pub fn read(checkpoints: &Checkpoints, id: &ConsumerId) -> Result<Bounds, StorageError> {
    let Some(raw) = checkpoints.read_beside(id, EXT)? else {
        return Ok(Bounds::new());
    };
    let record: Record = serde_json::from_slice(&raw).map_err(|e| StorageError::Inconsistent {
        path: checkpoints.dir().join(format!("{id}.{EXT}")),
        reason: format!("the bounds of a plugin's emits are not readable: {e}"),
    })?;
    Ok(record
        .bounds
        .into_iter()
        .map(|b| ((b.topic, b.partition), b.offset))
        .collect())
}

/// Durably replaces the bounds of `id`. Blocking (two fsyncs).
pub fn write(
    checkpoints: &Checkpoints,
    id: &ConsumerId,
    bounds: &Bounds,
) -> Result<(), StorageError> {
    let record = Record {
        bounds: bounds
            .iter()
            .map(|((topic, partition), &offset)| Bound {
                topic: topic.clone(),
                partition: *partition,
                offset,
            })
            .collect(),
    };
    let raw = serde_json::to_vec(&record).expect("bounds always encode");
    checkpoints.write_beside(id, EXT, &raw)
}

/// Whether `bounds` covers an append to `dest` that lands at or past `next`.
pub fn covers(bounds: &Bounds, dest: &Dest, next: u64) -> bool {
    bounds.get(dest).is_some_and(|&from| from <= next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::OsFs;
    use std::sync::Arc;

    #[test]
    fn bounds_survive_a_round_trip_and_cover_only_what_they_say() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoints::new(dir.path(), Arc::new(OsFs));
        let id = ConsumerId::new("router").unwrap();
        assert!(read(&cp, &id).unwrap().is_empty());
        let dest = (Topic::new("out").unwrap(), 3);
        let bounds = Bounds::from([(dest.clone(), 7)]);
        write(&cp, &id, &bounds).unwrap();
        assert_eq!(read(&cp, &id).unwrap(), bounds);
        assert!(covers(&bounds, &dest, 7) && covers(&bounds, &dest, 9));
        assert!(!covers(&bounds, &dest, 6), "a recreated topic starts lower");
        assert!(!covers(&bounds, &(Topic::new("out").unwrap(), 0), 9));
        std::fs::write(dir.path().join("router.emits"), b"{").unwrap();
        assert!(
            read(&cp, &id)
                .unwrap_err()
                .to_string()
                .contains("router.emits")
        );
    }
}
