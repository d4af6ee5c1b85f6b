//! Writes to a group through its leader, wherever it is (docs/cluster.md, "Design"): here when
//! this broker leads, else one hop to the leader this broker knows of (its own replica's view, or
//! the last leader a forward found), else to a replica that can name it. While a group has no
//! leader (an election), a write waits for one up to [`LEADER_WAIT`], then is refused with the
//! last leader's address, which the HTTP layer answers as `503` (contract §13).

use std::time::{Duration, Instant};

use super::network::GroupId;
use super::node::{Cluster, ClusterError};
use super::rpc::WriteRefused;
use super::types::{Applied, BrokerId, Command};

/// How long a write waits for a group to have a leader. Longer than an election (0.5–1 s) and a
/// retry, shorter than a client's patience.
pub const LEADER_WAIT: Duration = Duration::from_secs(3);

/// How long a leader waits for a majority to hold a write before it answers that the outcome
/// is unknown.
pub const WRITE_WAIT: Duration = Duration::from_secs(10);

impl Cluster {
    /// Writes commands to a group at its leader and answers what it applied: after a majority of
    /// the group's replicas hold them durably.
    pub async fn write(
        &self,
        group: GroupId,
        commands: Vec<Command>,
    ) -> Result<Vec<Applied>, ClusterError> {
        let deadline = Instant::now() + LEADER_WAIT;
        let mut last_leader = None;
        let mut tried_unreachable: Vec<BrokerId> = Vec::new();
        // The leader an answer named: tried next, before this broker's own (maybe stale) view.
        let mut named: Option<BrokerId> = None;
        let mut hops = 0;
        loop {
            let target = named
                .take()
                .or_else(|| self.leader_guess(&group, &tried_unreachable));
            let outcome = match target {
                Some(t) if t == self.id() => match self.inner.partitions_or_meta(&group) {
                    // A leader cut off from its followers never commits: the caller hears so
                    // (its write may still be stored, if the leader gets them back in time).
                    Some(ep) => tokio::time::timeout(WRITE_WAIT, ep.write(commands.clone()))
                        .await
                        .map_err(|_| {
                            ClusterError::Unknown(
                                t,
                                format!("not committed within {} s", WRITE_WAIT.as_secs()),
                            )
                        }),
                    None => Ok(Err(WriteRefused::NotLeader { leader: None })),
                },
                Some(t) => self.forward_write(t, &group, &commands).await,
                None => Ok(Err(WriteRefused::NotLeader { leader: None })),
            };
            match outcome {
                Ok(Ok(applied)) => {
                    if let Some(t) = target {
                        self.inner.hints.write().insert(group, t);
                    }
                    return Ok(applied);
                }
                Ok(Err(WriteRefused::Failed(why))) => return Err(ClusterError::Failed(why)),
                Ok(Err(WriteRefused::Discarded)) => {
                    let t = target.expect("an answer came from a target");
                    return Err(ClusterError::Unknown(
                        t,
                        WriteRefused::Discarded.to_string(),
                    ));
                }
                // Nothing written: tried again (at whichever broker leads by then) until the
                // deadline.
                Ok(Err(WriteRefused::Retry(why))) => {
                    tracing::debug!(%group, %why, "a write to try again");
                    last_leader = target;
                }
                Ok(Err(WriteRefused::Unknown(why))) => {
                    let at = target.unwrap_or(self.id());
                    return Err(ClusterError::Unknown(at, why));
                }
                Ok(Err(WriteRefused::NotLeader { leader })) => match leader {
                    Some(l) if Some(l) != target && !tried_unreachable.contains(&l) => {
                        self.inner.hints.write().insert(group.clone(), l);
                        last_leader = Some(l);
                        named = Some(l);
                    }
                    _ => {
                        self.inner.hints.write().remove(&group);
                        // This broker leads the group but could not renew its lease: its
                        // followers do not hear it (a link broken one way). It stops claiming
                        // the group, so they elect another (docs/cluster.md, "Liveness and
                        // elections"), and the write looks for that one.
                        if target == Some(self.id()) {
                            super::rpc::Groups::refused_here(&*self.inner, &group);
                            tried_unreachable.push(self.id());
                        }
                    }
                },
                // Only a connection that was never made is retried elsewhere: a write that may
                // have reached a leader is never sent twice (it could be stored twice).
                Err(ClusterError::Unreachable(b, why)) => {
                    tracing::debug!(broker = b, %why, %group, "forwarding a write: unreachable");
                    self.inner.hints.write().remove(&group);
                    tried_unreachable.push(b);
                }
                Err(e) => return Err(e),
            }
            hops += 1;
            if Instant::now() >= deadline || hops > 64 {
                return Err(ClusterError::NoLeader {
                    group: group.to_string(),
                    leader: last_leader.and_then(|l| self.inner.router.peer(l)),
                });
            }
            if named.is_none() || hops % 4 == 0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if tried_unreachable.len() > 8 {
                tried_unreachable.clear();
            }
        }
    }

    /// Where a write to `group` should go first: the leader this broker's replica knows, else the
    /// last leader a forward found, else a replica (from the metadata) not known unreachable.
    pub(super) fn leader_guess(
        &self,
        group: &GroupId,
        unreachable: &[BrokerId],
    ) -> Option<BrokerId> {
        if let Some(ep) = self.inner.partitions_or_meta(group) {
            let view = ep.view();
            if let Some(l) = view.leader.filter(|l| !unreachable.contains(l)) {
                return Some(l);
            }
            if matches!(group, GroupId::Meta) {
                return None;
            }
        }
        if let Some(l) = self.inner.hints.read().get(group).copied()
            && !unreachable.contains(&l)
        {
            return Some(l);
        }
        match group {
            GroupId::Meta => None,
            GroupId::Partition(topic, p) => {
                let meta = self.metadata();
                let replicas = meta.topics.get(topic)?.placement.get(*p as usize)?.clone();
                replicas
                    .iter()
                    .copied()
                    .find(|b| *b != self.id() && !unreachable.contains(b))
            }
        }
    }

    async fn forward_write(
        &self,
        leader: BrokerId,
        group: &GroupId,
        commands: &[Command],
    ) -> Result<Result<Vec<Applied>, WriteRefused>, ClusterError> {
        let router = &self.inner.router;
        if router.faults().outgoing(leader) == Some(None) {
            return Err(ClusterError::Unreachable(
                leader,
                "cut off (fault injection)".into(),
            ));
        }
        let body = postcard::to_stdvec(&(group, commands))
            .map_err(|e| ClusterError::Failed(e.to_string()))?;
        let request = router
            .internal_post(leader, "write", body, WRITE_WAIT + Duration::from_secs(1))
            .ok_or_else(|| ClusterError::Unreachable(leader, "no address known".into()))?;
        // A connection never made: the write was not sent, another broker may take it. Anything
        // after that: the leader may have stored it, so its outcome is unknown.
        let unknown = |e: &dyn std::fmt::Display| ClusterError::Unknown(leader, e.to_string());
        let response = request.send().await.map_err(|e| {
            if e.is_connect() {
                ClusterError::Unreachable(leader, e.to_string())
            } else {
                unknown(&e)
            }
        })?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| unknown(&e))?;
        if !status.is_success() {
            // Refused before the Raft handler ran (the guard, a body limit): not stored.
            return Err(ClusterError::Failed(format!(
                "broker {leader} refused a forwarded write: {status}: {}",
                String::from_utf8_lossy(&bytes)
            )));
        }
        postcard::from_bytes(&bytes).map_err(|e| unknown(&e))
    }
}
