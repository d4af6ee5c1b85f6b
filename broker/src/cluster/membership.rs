//! Changes of a group's members, made by the group's leader (docs/cluster.md, "Membership"):
//! a new member is added as a learner and caught up from the leader's log first, then the
//! voters change in one joint-consensus step (openraft's `change_membership`), so a majority of
//! both the old and the new voters holds every entry written meanwhile. The broker that takes an
//! operator's request sends the change to the leader ([`Cluster::change_members`]), one hop,
//! as writes go.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use openraft::ChangeMembers;
use openraft::async_runtime::WatchReceiver;
use openraft::error::{ClientWriteError, RaftError};
use openraft::storage::RaftStateMachine;
use serde::{Deserialize, Serialize};

use super::network::{GroupId, SnapshotBytes};
use super::node::{Cluster, ClusterError};
use super::rpc::WriteRefused;
use super::types::{BrokerId, Raft};

/// How long a leader waits for a new member to catch up before it gives up (the operator may
/// run the command again: every step of a move can be repeated).
pub const CATCH_UP_WAIT: Duration = Duration::from_secs(30);

/// How long the broker that took the request looks for the group's leader, in all.
const MEMBERS_WAIT: Duration = Duration::from_secs(45);

/// A change of a group's members, as its leader is asked to make it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MembersChange {
    /// The voters become exactly these brokers (with their addresses): each one new to the
    /// group is added as a learner and caught up first; the voters left out leave the group.
    Replicas(BTreeMap<BrokerId, String>),
    /// A broker joins the metadata group: as a learner, caught up, then a voter if the group
    /// needs one (see [`meta_voters`]).
    Join(BrokerId, String),
    /// A broker leaves the metadata group; a learner takes its vote if the group needs one.
    Leave(BrokerId),
}

/// How many voters the metadata group keeps among `brokers`: the largest odd number no greater
/// than the brokers, at most 5. An odd count tolerates as many failures as the even count above
/// it, with one vote fewer to wait for; beyond 5, more voters slow every write and buy nothing a
/// cluster of this size needs. The others follow the metadata as learners.
pub fn meta_voters(brokers: usize) -> usize {
    let n = brokers.clamp(1, 5);
    if n.is_multiple_of(2) { n - 1 } else { n }
}

fn refused(e: RaftError<Raft, ClientWriteError<Raft>>) -> WriteRefused {
    match e.forward_to_leader() {
        Some(f) => WriteRefused::NotLeader {
            leader: f.leader_id,
        },
        None => WriteRefused::Failed(e.to_string()),
    }
}

/// Makes `change` on `raft`, which must lead its group.
pub(super) async fn change<SM>(
    raft: &openraft::Raft<Raft, SM>,
    change: MembersChange,
) -> Result<(), WriteRefused>
where
    SM: RaftStateMachine<Raft, SnapshotData = SnapshotBytes>,
{
    let metrics = raft.metrics().borrow_watched().clone();
    if metrics.current_leader != Some(metrics.id) {
        return Err(WriteRefused::NotLeader {
            leader: metrics.current_leader,
        });
    }
    let membership = metrics.membership_config.membership().clone();
    let voters: BTreeSet<BrokerId> = membership.voter_ids().collect();
    let learners: BTreeSet<BrokerId> = membership.learner_ids().collect();
    let (add, target, gone) = match change {
        MembersChange::Replicas(replicas) => {
            let target: BTreeSet<BrokerId> = replicas.keys().copied().collect();
            (replicas, target, None)
        }
        MembersChange::Join(id, addr) => {
            let mut target = voters.clone();
            let nodes = voters.len() + learners.len() + usize::from(!learners.contains(&id));
            // The new broker first, then the learners caught up longest (lowest ids).
            let candidates = std::iter::once(id).chain(learners.iter().copied());
            for b in candidates {
                if target.len() >= meta_voters(nodes) {
                    break;
                }
                target.insert(b);
            }
            (BTreeMap::from([(id, addr)]), target, None)
        }
        MembersChange::Leave(id) => {
            let mut target = voters.clone();
            target.remove(&id);
            let nodes = (voters.len() + learners.len()).saturating_sub(1);
            for b in learners.iter().copied().filter(|b| *b != id) {
                if target.len() >= meta_voters(nodes) {
                    break;
                }
                target.insert(b);
            }
            (BTreeMap::new(), target, Some(id))
        }
    };
    for (id, addr) in add {
        if voters.contains(&id) {
            continue;
        }
        let node = openraft::BasicNode::new(addr);
        // Blocks until the leader sees the learner close to its log's end.
        match tokio::time::timeout(CATCH_UP_WAIT, raft.add_learner(id, node, true)).await {
            Ok(result) => result.map_err(refused)?,
            Err(_) => {
                return Err(WriteRefused::Failed(format!(
                    "broker {id} did not catch up within {} s (is it running?)",
                    CATCH_UP_WAIT.as_secs()
                )));
            }
        };
    }
    if target != voters {
        raft.change_membership(ChangeMembers::ReplaceAllVoters(target), false)
            .await
            .map_err(refused)?;
    }
    // A learner that leaves (a voter left with the change above).
    if let Some(id) = gone {
        let now = raft.metrics().borrow_watched().membership_config.clone();
        if now.membership().get_node(&id).is_some() {
            raft.change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
                .await
                .map_err(refused)?;
        }
    }
    Ok(())
}

impl Cluster {
    /// Makes `change` to `group` through its leader, wherever it is. Every change can be made
    /// again (a learner added twice is added once; voters already in place do not change), so
    /// an answer that did not arrive is asked again, unlike a write.
    pub async fn change_members(
        &self,
        group: GroupId,
        change: MembersChange,
    ) -> Result<(), ClusterError> {
        let deadline = Instant::now() + MEMBERS_WAIT;
        let mut unreachable: Vec<BrokerId> = Vec::new();
        let mut named: Option<BrokerId> = None;
        let mut last_error = None;
        while Instant::now() < deadline {
            let target = named
                .take()
                .or_else(|| self.leader_guess(&group, &unreachable));
            let outcome = match target {
                Some(t) if t == self.id() => match self.inner.partitions_or_meta(&group) {
                    Some(ep) => Ok(ep.change_members(change.clone()).await),
                    None => Ok(Err(WriteRefused::NotLeader { leader: None })),
                },
                Some(t) => self.forward_members(t, &group, &change).await,
                None => Ok(Err(WriteRefused::NotLeader { leader: None })),
            };
            match outcome {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(WriteRefused::Failed(why))) => return Err(ClusterError::Failed(why)),
                Ok(Err(e @ (WriteRefused::Discarded | WriteRefused::Unknown(_)))) => {
                    let at = target.unwrap_or(self.id());
                    return Err(ClusterError::Unknown(at, e.to_string()));
                }
                Ok(Err(WriteRefused::NotLeader { leader })) => {
                    named = leader.filter(|l| Some(*l) != target && !unreachable.contains(l));
                    last_error = Some(format!("no leader for {group} now"));
                }
                Ok(Err(e @ WriteRefused::Retry(_))) => last_error = Some(e.to_string()),
                Err(e) => {
                    if let Some(t) = target {
                        unreachable.push(t);
                    }
                    last_error = Some(e.to_string());
                }
            }
            if unreachable.len() > 8 {
                unreachable.clear();
            }
            if named.is_none() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Err(ClusterError::NoLeader {
            group: format!(
                "{group} ({})",
                last_error.unwrap_or_else(|| "no answer".into())
            ),
            leader: None,
        })
    }

    async fn forward_members(
        &self,
        leader: BrokerId,
        group: &GroupId,
        change: &MembersChange,
    ) -> Result<Result<(), WriteRefused>, ClusterError> {
        let body = postcard::to_stdvec(&(group, change))
            .map_err(|e| ClusterError::Failed(e.to_string()))?;
        let timeout = CATCH_UP_WAIT + Duration::from_secs(5);
        let request = self
            .inner
            .router
            .internal_post(leader, "members", body, timeout)
            .ok_or_else(|| ClusterError::Unreachable(leader, "no address known".into()))?;
        let failed = |e: &dyn std::fmt::Display| ClusterError::Unreachable(leader, e.to_string());
        let response = request.send().await.map_err(|e| failed(&e))?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| failed(&e))?;
        if !status.is_success() {
            return Err(ClusterError::Failed(format!(
                "broker {leader} refused a membership change: {status}: {}",
                String::from_utf8_lossy(&bytes)
            )));
        }
        postcard::from_bytes(&bytes).map_err(|e| failed(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::meta_voters;

    #[test]
    fn the_metadata_group_keeps_an_odd_number_of_voters_up_to_5() {
        let counts: Vec<usize> = (1..=7).map(meta_voters).collect();
        assert_eq!(counts, [1, 1, 3, 3, 5, 5, 5]);
    }
}
