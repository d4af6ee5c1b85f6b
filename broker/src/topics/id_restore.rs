//! Restoring a topic's produce ids at boot (docs/delivery.md, "Idempotent produce"): the ids of
//! its snapshot ([`super::id_snapshot`]) still inside the window, then the ids of the messages
//! stored since — each partition's log read from its `scannedTo` (or from the window's first
//! segment, whichever is later) to its end. Without a usable snapshot every partition is read
//! from the window's first segment, as before snapshots existed. After a clean stop the snapshot
//! is current and nothing is read: boot costs what the ids cost, not what the messages do.

use super::id_snapshot::Snapshot;
use super::{Partition, TopicLog};
use crate::storage::StorageError;

/// What restoring one topic's ids did (summed into the "topics restored" log line).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    /// Whether a snapshot was used.
    pub from_snapshot: bool,
    /// Ids taken from the snapshot (those still inside the window).
    pub loaded: u64,
    /// Messages read from the logs.
    pub scanned: u64,
}

impl std::ops::AddAssign for Restored {
    fn add_assign(&mut self, o: Self) {
        self.from_snapshot |= o.from_snapshot;
        self.loaded += o.loaded;
        self.scanned += o.scanned;
    }
}

/// Restores `t`'s ids of the last `window_ms` before `now_ms` from `snapshot` (already checked
/// against `t`, and whose seed `t`'s table was made with) and its logs. Blocking.
pub fn restore(
    t: &TopicLog,
    snapshot: Option<Snapshot>,
    window_ms: u64,
    now_ms: u64,
) -> Result<Restored, StorageError> {
    let horizon = now_ms.saturating_sub(window_ms);
    let mut done = Restored {
        from_snapshot: snapshot.is_some(),
        ..Restored::default()
    };
    let mut scanned_to = Vec::new();
    if let Some(s) = snapshot {
        debug_assert_eq!(s.seed, t.dedup.seed(), "the table is made with its seed");
        t.dedup.reserve(s.len());
        for e in s.entries().filter(|e| e.at_ms >= horizon) {
            t.dedup.remember_key(e.key, e.at_ms, e.partition, e.offset);
            done.loaded += 1;
        }
        scanned_to = s.scanned_to;
    }
    for p in t.partitions() {
        let from = scanned_to.get(p.number as usize).copied().unwrap_or(0);
        done.scanned += scan(t, &p, from, horizon)?;
    }
    tracing::debug!(topic = %t.topic, from_snapshot = done.from_snapshot, ids_loaded = done.loaded, messages_scanned = done.scanned, ids = t.dedup.len(), "produce ids restored");
    Ok(done)
}

/// Remembers the ids `partition` stored from offset `from` on with a timestamp at or after
/// `horizon`; returns how many messages it read. Reads only the segments whose newest message
/// is inside the window. Blocking. (A clustered partition's group calls it when it opens, its
/// log visible up to what its state machine applied: docs/cluster.md, "Produce ids in a cluster".)
pub(crate) fn scan(
    t: &TopicLog,
    partition: &Partition,
    from: u64,
    horizon: u64,
) -> Result<u64, StorageError> {
    #[derive(serde::Deserialize)]
    struct IdAndTime {
        timestamp: u64,
        #[serde(default)]
        id: Option<String>,
    }
    let log = &partition.log;
    let end = log.next_offset();
    if from >= end {
        return Ok(0);
    }
    let mut first = None;
    for s in log.segments().iter().rev().filter(|s| s.end > s.start) {
        if s.end <= from {
            break;
        }
        // A clustered log may show less than it holds (what its state machine applied).
        if s.start >= end {
            continue;
        }
        // Any payload's time, a Kafka record's too (it has no id, but its segment may hold
        // HTTP messages that have).
        let newest = log
            .read(s.end.min(end) - 1)
            .ok()
            .flatten()
            .and_then(|p| mmmq_core::record::payload_timestamp(&p));
        match newest {
            Some(timestamp) if timestamp >= horizon => first = Some(s.start),
            _ => break,
        }
    }
    let Some(first) = first else {
        return Ok(0);
    };
    let (mut at, mut read) = (first.max(from), 0);
    while at < end {
        let entries = log.read_from(at, 1000, 8 << 20)?;
        let Some(last) = entries.last() else { break };
        at = last.offset + 1;
        read += entries.len() as u64;
        for e in entries {
            let Ok(payload) = e.payload else { continue };
            if let Ok(IdAndTime {
                timestamp,
                id: Some(id),
            }) = serde_json::from_slice(&payload)
                && timestamp >= horizon
            {
                t.dedup.remember(&id, timestamp, partition.number, e.offset);
            }
        }
    }
    Ok(read)
}
