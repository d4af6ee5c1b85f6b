//! A partition's snapshot where retention purges (docs/cluster.md, "Retention in a cluster").
//!
//! openraft purges only what a snapshot covers. A partition's snapshot is three values, so it
//! can be taken at any entry this replica applied: retention takes it at the last entry of the
//! segments it deletes, so that the purge ends exactly at a segment's start, and a follower that
//! installs the snapshot continues at that offset, with the leader's log after it — no message
//! retention did not choose is lost on any replica.
//!
//! [`PartitionMachine::retention_target`] decides where (a segment boundary, in what this
//! replica applied and holds durably) and leaves the snapshot's state for the next build
//! (`try_create_snapshot_builder`, which builds nothing else on its own); [`save`] writes a
//! snapshot unless a newer one is there already (a build runs beside an install).

use std::sync::Arc;

use parking_lot::Mutex;

use super::{
    APPLIED, Membership, PartitionMachine, PartitionSnapshot, SNAPSHOT, SnapshotFile, file,
};
use crate::cluster::log_store::{Shared, StoreError, blocking, log_id, write_json};
use crate::cluster::types::LogId;

/// Where a retention purge goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionTarget {
    /// The last entry it removes (the last message before `first_offset`).
    pub last: LogId,
    /// The offset the log starts at afterwards: a segment's start.
    pub first_offset: u64,
}

impl PartitionMachine {
    /// Prepares a purge of the whole segments whose messages all lie before `before`, within
    /// what this replica applied and holds durably: the purge ends at the start of the last such
    /// segment boundary, and the next snapshot built is taken there. `None`: nothing to delete
    /// (or the log is purged that far already).
    pub async fn retention_target(
        &mut self,
        before: u64,
    ) -> Result<Option<RetentionTarget>, StoreError> {
        let log = self.shared.log.clone();
        let limit = before.min(self.state.next_offset).min(log.durable_end());
        let first = log.first_offset();
        let Some(boundary) = log
            .segments()
            .iter()
            .map(|s| s.start)
            .filter(|&s| first < s && s <= limit)
            .max()
        else {
            return Ok(None);
        };
        if self
            .shared
            .purge_point()
            .is_some_and(|(_, next)| next >= boundary)
        {
            return Ok(None);
        }
        let inconsistent = |reason: String| StoreError::Inconsistent {
            dir: log.dir().to_owned(),
            reason,
        };
        let at = boundary - 1;
        let frames = {
            let log = log.clone();
            blocking(move || Ok(log.read_raft_from(at, 1, 1)?)).await?
        };
        let ((term, index), _) = match frames.into_iter().next() {
            Some(f) if f.offset == at => f.entry.map_err(crate::storage::StorageError::from)?,
            _ => return Err(inconsistent(format!("no frame at offset {at}"))),
        };
        let last = log_id(term, index);
        let applied = self.state.last_log_id.is_some_and(|a| a.index >= index);
        if self.shared.offset_of(index) != Some(at) || !applied {
            return Err(inconsistent(format!(
                "the message at offset {at} ({last}) is not an applied entry of the log"
            )));
        }
        let covered = self
            .current
            .lock()
            .as_ref()
            .is_some_and(|s| s.meta.last_log_id >= Some(last));
        if !covered {
            self.retain_at = Some(PartitionSnapshot {
                last_log_id: Some(last),
                membership: self.membership_at(last),
                next_offset: boundary,
            });
        }
        Ok(Some(RetentionTarget {
            last,
            first_offset: boundary,
        }))
    }

    /// The membership in effect at `at` (applied): the state's, unless a later one was applied
    /// since; then the last the log holds up to `at`, or else the snapshot's (it covers every
    /// entry up to the purge point).
    fn membership_at(&self, at: LogId) -> Membership {
        let current = self
            .state
            .membership
            .log_id()
            .is_none_or(|l| l.index <= at.index);
        if current {
            return self.state.membership.clone();
        }
        if let Some(m) = self.shared.membership_upto(at.index) {
            return m;
        }
        self.current
            .lock()
            .as_ref()
            .map(|s| s.data.membership.clone())
            .unwrap_or_default()
    }
}

/// Writes `snapshot` as the current one and answers it; unless `install` (a leader's snapshot
/// this replica installs, written with the state it puts the machine in), a newer snapshot
/// already there stays and is answered instead, so a build never replaces an install that ran
/// beside it. Blocking.
pub(super) fn save(
    shared: &Arc<Shared>,
    current: &Mutex<Option<SnapshotFile>>,
    snapshot: SnapshotFile,
    install: bool,
) -> Result<SnapshotFile, StoreError> {
    let mut current = current.lock();
    if !install
        && let Some(newer) = current
            .as_ref()
            .filter(|c| c.meta.last_log_id > snapshot.meta.last_log_id)
    {
        return Ok(newer.clone());
    }
    write_json(&*shared.vfs, &file(shared, SNAPSHOT), &snapshot)?;
    if install {
        write_json(&*shared.vfs, &file(shared, APPLIED), &snapshot.data)?;
    }
    *current = Some(snapshot.clone());
    Ok(snapshot)
}
