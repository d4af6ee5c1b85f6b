//! Retention of a clustered partition through its Raft group (docs/cluster.md, "Retention in a
//! cluster"). A partition's segments are its Raft log, so they go only by openraft's purge, which
//! removes only what a snapshot covers and waits while replication still reads it:
//!
//! 1. the state machine picks the segment boundary (`PartitionMachine::retention_target`: within
//!    what this replica applied and holds durably) and the snapshot to take there;
//! 2. `trigger().snapshot()` builds it (a partition builds no other);
//! 3. `trigger().purge_log(index)` purges up to it: the log store writes the purge point, drops
//!    the sidecar's records and removes the whole segments before it.
//!
//! Each replica runs this on its own clock, by the same policy, on what it applied: nothing is
//! decided by the leader, and no replica deletes what it has not applied. openraft purges
//! nothing on its own (a partition keeps every entry its snapshot covers,
//! `max_in_snapshot_log_to_keep`, `node.rs`).

use std::time::Duration;

use futures_util::future::BoxFuture;
use openraft::async_runtime::WatchReceiver;

use super::machine::{PartitionMachine, RetentionTarget};
use super::network::GroupId;
use super::node::Cluster;
use super::supervise::PartitionRaft;
use super::types::LogId;
use crate::cluster::log_store::StoreError;

/// How long a pass waits for the snapshot, then for the purge. A leader's purge waits while a
/// follower's replication reads those entries; openraft finishes it later by itself.
const WAIT: Duration = Duration::from_secs(5);

fn target(
    sm: &mut PartitionMachine,
    before: u64,
) -> BoxFuture<'_, Result<Option<RetentionTarget>, StoreError>> {
    Box::pin(sm.retention_target(before))
}

/// Purges `raft`'s log up to the last segment boundary at or before `before` that this replica
/// applied; answers the log's new first offset once the segments are gone, `None` if nothing
/// went (nothing to delete, or the purge still waits for replication).
pub(super) async fn purge_before(raft: &PartitionRaft, before: u64) -> Result<Option<u64>, String> {
    let t = raft
        .with_state_machine(move |sm| target(sm, before))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let Some(t) = t else {
        return Ok(None);
    };
    let at = t.last.index;
    let reached = move |id: &Option<LogId>| id.is_some_and(|l| l.index >= at);
    if !reached(&raft.metrics().borrow_watched().snapshot) {
        raft.trigger().snapshot().await.map_err(|e| e.to_string())?;
        raft.wait(Some(WAIT))
            .metrics(|m| reached(&m.snapshot), "retention's snapshot")
            .await
            .map_err(|e| format!("the snapshot at {} was not built: {e}", t.last))?;
    }
    raft.trigger()
        .purge_log(at)
        .await
        .map_err(|e| e.to_string())?;
    match raft
        .wait(Some(WAIT))
        .metrics(|m| reached(&m.purged), "retention's purge")
        .await
    {
        Ok(_) => Ok(Some(t.first_offset)),
        Err(e) => {
            tracing::debug!(purge = %t.last, error = %e, "the purge waits for replication; openraft finishes it");
            Ok(None)
        }
    }
}

impl Cluster {
    /// Runs retention's purge of partition `p` of `topic` on this broker's replica: its whole
    /// segments before `before` (rounded down to a segment's start, within what it applied) go
    /// through its group. Answers the new first offset, `None` if nothing went (or this broker
    /// holds no running replica).
    pub async fn purge_partition(
        &self,
        topic: &str,
        p: u32,
        before: u64,
    ) -> Result<Option<u64>, super::node::ClusterError> {
        let group = GroupId::Partition(topic.to_owned(), p);
        let endpoint = self.inner.partitions.read().get(&group).cloned();
        let Some(endpoint) = endpoint else {
            return Ok(None);
        };
        endpoint
            .purge_before(before)
            .await
            .map_err(|e| super::node::ClusterError::Failed(format!("{group}: {e}")))
    }
}

#[async_trait::async_trait]
impl crate::topics::retention::RaftRetention for Cluster {
    async fn purge_before(
        &self,
        topic: &mmmq_core::Topic,
        partition: u32,
        before: u64,
    ) -> Result<Option<u64>, String> {
        self.purge_partition(topic.as_str(), partition, before)
            .await
            .map_err(|e| e.to_string())
    }
}
