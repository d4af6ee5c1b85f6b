//! The pull groups' coordinator (docs/cluster.md, "Pull groups in a cluster"): the metadata
//! group's leader, while it is sure of its quorum; and its metadata proposals, made only at
//! itself.

use std::time::Duration;

use openraft::async_runtime::WatchReceiver;

use super::meta_state::{MetaCommand, MetaOutcome};
use super::network::GroupId;
use super::node::{Cluster, ClusterError};
use super::types::{BrokerId, Command};

impl Cluster {
    /// The metadata group's leader and term as this broker sees them. The leader is the pull
    /// groups' coordinator (docs/cluster.md, "Pull groups in a cluster").
    pub fn coordinator(&self) -> (Option<BrokerId>, u64) {
        let view = self.inner.meta_view();
        (view.leader, view.term)
    }

    /// Whether this broker coordinates the pull groups now (docs/cluster.md, "Pull groups in a
    /// cluster"): it leads the metadata group, applied its term's first entry (so every commit
    /// acknowledged before it took over is in its metadata), and a quorum acknowledged it within
    /// an election timeout (a leader cut off from the others stops coordinating before
    /// they can elect another; openraft itself never deposes it).
    pub fn coordinates(&self) -> bool {
        let lease = Duration::from_millis(self.inner.config.election_ms);
        let m = self.inner.meta.metrics();
        let m = m.borrow_watched();
        m.state == openraft::ServerState::Leader
            && m.last_applied
                .is_some_and(|l| l.committed_leader_id().term == m.current_term)
            && super::rpc::quorum_acked_within(&m, lease)
    }

    /// Proposes a metadata change at this broker only, as the metadata group's leader (never
    /// forwarded: a decision made as coordinator in one term is not applied once another
    /// broker coordinates).
    pub async fn propose_here(&self, command: MetaCommand) -> Result<MetaOutcome, ClusterError> {
        let bytes =
            serde_json::to_vec(&command).map_err(|e| ClusterError::Failed(e.to_string()))?;
        let written = super::rpc::with_lease(&self.inner.meta, || {
            super::rpc::write_once(&self.inner.meta, vec![Command::Meta(bytes.clone().into())])
        })
        .await;
        match written {
            Ok(applied) => super::node::meta_outcome(&applied),
            Err(super::rpc::WriteRefused::Failed(why)) => Err(ClusterError::Failed(why)),
            Err(
                e @ (super::rpc::WriteRefused::Discarded | super::rpc::WriteRefused::Unknown(_)),
            ) => Err(ClusterError::Unknown(self.id(), e.to_string())),
            Err(e) => Err(ClusterError::NoLeader {
                group: format!("{} ({e})", GroupId::Meta),
                leader: None,
            }),
        }
    }
}
