//! What retention needs of a partition's Raft log besides openraft's `purge` (docs/cluster.md,
//! "Retention in a cluster"): the purge point, the membership a snapshot at an earlier index
//! records, and the end of a purge a crash interrupted.
//!
//! A purge writes its point first (`raft/purged`), then drops the sidecar's records up to it,
//! then removes the whole segments before its next offset, oldest first. A crash after the
//! point is written leaves some of the rest: [`finish`] does it at the next open, so the purge
//! point, the sidecar and the segment files agree again.

use openraft::EntryPayload;

use super::files::Sidecar;
use super::{Shared, StoreError};
use crate::cluster::types::{LogId, Raft};
use crate::storage::Log;

/// A membership as a snapshot records it: the entry's log id and the membership.
pub(crate) type StoredMembership = openraft::alias::StoredMembershipOf<Raft>;

impl Shared {
    /// The last purged log id and the offset of the first message after it.
    pub(crate) fn purge_point(&self) -> Option<(LogId, u64)> {
        self.state.lock().layout.purged()
    }

    /// The last membership entry at or before `index` the log holds (those before its purge
    /// point are in the snapshot that covers them).
    pub(crate) fn membership_upto(&self, index: u64) -> Option<StoredMembership> {
        let st = self.state.lock();
        let e = st.layout.membership_upto(index)?;
        match &e.payload {
            EntryPayload::Membership(m) => Some(StoredMembership::new(Some(e.log_id), m.clone())),
            _ => None,
        }
    }
}

/// Finishes a purge a crash interrupted: the sidecar's records up to the purge point and the
/// whole segments before its next offset go (nothing is done when they are gone already).
/// Blocking; runs at open, before the store takes writes.
pub(super) fn finish(
    log: &Log,
    sidecar: &mut Sidecar,
    purged: Option<(LogId, u64)>,
) -> Result<(), StoreError> {
    let Some((last, next_offset)) = purged else {
        return Ok(());
    };
    sidecar.drop_before(last.index + 1)?;
    if log.first_offset() < next_offset {
        let removed = log.remove_segments_before(next_offset)?;
        if removed > 0 {
            tracing::warn!(dir = %log.dir().display(), segments = removed, purged = %last, "finishing a purge a crash interrupted: removing the segments it covers");
        }
    }
    Ok(())
}
