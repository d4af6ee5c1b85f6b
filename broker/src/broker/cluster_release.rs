//! Replicas moved away from this broker (docs/cluster.md, "Membership"): their groups stop and
//! their files go, but only on the word of settled metadata. A broker replaying its metadata
//! log (at boot) goes through every past state, and one of them may leave it out of a partition
//! that a later one gives back: deleting on that word would delete a voter's log and vote. So
//! the partitions to release are collected as the metadata moves, and released once this broker
//! applied all of its metadata log, each checked again against the newest state.

use std::collections::BTreeSet;
use std::sync::Arc;

use mmmq_core::Topic;

use crate::cluster::meta_state::MetaState;
use crate::cluster::node::Cluster;
use crate::cluster::types::BrokerId;
use crate::storage::Vfs;
use crate::topics::Registry;

/// Partitions this broker may have to release.
#[derive(Default)]
pub(super) struct Releases {
    pending: BTreeSet<(String, u32)>,
    /// Whether the partitions of the first settled metadata were all checked (a broker down
    /// while its replica moved away finds out at its next boot).
    swept: bool,
}

impl Releases {
    /// Whether releases may be left to do (some pending, or the first sweep not made).
    pub(super) fn pending(&self) -> bool {
        !self.pending.is_empty() || !self.swept
    }

    /// Notes the partitions whose group ran here in `previous` and does not in `state`.
    pub(super) fn moved_away(&mut self, previous: &MetaState, state: &MetaState, me: BrokerId) {
        for (name, before) in &previous.topics {
            let Some(now) = state.topics.get(name) else {
                continue; // deleted: the topic's deletion removes its files
            };
            for p in 0..before.placement.len() as u32 {
                if before.runs(p, me) && !now.runs(p, me) {
                    self.pending.insert((name.clone(), p));
                }
            }
        }
    }

    /// Releases what is pending if the metadata is settled here; answers whether nothing is
    /// left to do (else the caller tries again shortly).
    pub(super) async fn run(
        &mut self,
        registry: &Registry,
        cluster: &Cluster,
        vfs: &Arc<dyn Vfs>,
    ) -> bool {
        if self.pending.is_empty() && self.swept {
            return true;
        }
        if !cluster.metadata_settled() {
            return false;
        }
        let state = cluster.metadata();
        let me = cluster.id();
        if !self.swept {
            for (name, t) in &state.topics {
                for p in 0..t.placement.len() as u32 {
                    if !t.runs(p, me) {
                        self.pending.insert((name.clone(), p));
                    }
                }
            }
            self.swept = true;
        }
        let pending = std::mem::take(&mut self.pending);
        for (name, p) in pending {
            let Some(t) = state.topics.get(&name) else {
                continue;
            };
            if t.runs(p, me) {
                continue; // given back meanwhile
            }
            let Ok(topic) = Topic::new(name.clone()) else {
                continue;
            };
            let Some(partition) = registry.get(&topic).and_then(|l| l.partition(p)) else {
                // Not opened yet (the follower opens it first): kept for the next round.
                self.pending.insert((name, p));
                continue;
            };
            let log = partition.log.clone();
            if let Err(e) = cluster.release_partition(&name, p, &log, vfs.clone()).await {
                tracing::warn!(topic = %name, partition = p, error = %e, "releasing a replica moved away; retrying");
                self.pending.insert((name, p));
            }
        }
        self.pending.is_empty()
    }
}
