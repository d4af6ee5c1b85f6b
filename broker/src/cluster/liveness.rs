//! Liveness and elections of partition groups (docs/cluster.md, "Liveness and elections").
//!
//! A partition group sends no heartbeats of its own and never times out into an election (its
//! Raft runs without ticks): with hundreds of partitions per broker, per-group heartbeats cost
//! more than the traffic they guard. Instead each broker pings each peer every heartbeat
//! interval, one small request per pair of brokers whatever the number of groups, and the
//! answer lists the groups the peer leads. A replica whose group's leader stopped answering
//! (a dead, paused or cut-off broker), or no longer claims the group, triggers the election
//! itself: the first live replica in the placement's order at once, the next ones a little
//! later, so that one candidate usually runs alone. Raft's own rules keep it safe whatever this
//! loop decides: the election is a pre-vote first, refused while a replica still hears from its
//! leader (its lease), and a vote needs a majority with logs at least as complete.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use super::network::GroupId;
use super::node::Cluster;
use super::types::BrokerId;

/// What this broker last heard from each peer.
#[derive(Default)]
pub(super) struct Liveness {
    peers: RwLock<HashMap<BrokerId, Heard>>,
    /// Groups this broker leads but could not write to lately (no quorum renewed its lease),
    /// with when: not claimed in pings for a while, so that followers elect another leader.
    refused: RwLock<HashMap<GroupId, Instant>>,
}

/// How long a group that refused a write here goes unclaimed.
const UNCLAIMED: Duration = Duration::from_secs(2);

#[derive(Default)]
struct Heard {
    /// When the peer last answered a ping.
    at: Option<Instant>,
    /// The groups it said it leads, with their terms.
    leads: HashMap<GroupId, u64>,
    /// Whether a ping to it is under way.
    asking: Arc<AtomicBool>,
}

/// A group's election as this broker's loop follows it.
struct Pending {
    /// Since when the group has had no leader this broker trusts.
    since: Instant,
    /// When this broker last asked for an election, and the random part of the wait before it
    /// may ask again.
    asked: Option<(Instant, Duration)>,
}

impl Liveness {
    /// Notes that `group`, led here, refused a write for want of a quorum.
    pub(super) fn refused_here(&self, group: &GroupId) {
        let mut refused = self.refused.write();
        refused.retain(|_, at| at.elapsed() < UNCLAIMED);
        refused.insert(group.clone(), Instant::now());
    }

    /// Whether this broker may claim `group` it leads in its pings (read for every group of
    /// every ping: a read lock, the map pruned where it grows).
    pub(super) fn claims(&self, group: &GroupId) -> bool {
        self.refused
            .read()
            .get(group)
            .is_none_or(|at| at.elapsed() >= UNCLAIMED)
    }

    /// Whether `peer` answered within `window`.
    fn alive(&self, peer: BrokerId, window: Duration) -> bool {
        self.peers
            .read()
            .get(&peer)
            .and_then(|h| h.at)
            .is_some_and(|at| at.elapsed() < window)
    }

    /// The peer that answered within `window` claiming to lead `group` in the highest term.
    pub(super) fn leader(&self, group: &GroupId, window: Duration) -> Option<BrokerId> {
        self.peers
            .read()
            .iter()
            .filter(|(_, h)| h.at.is_some_and(|at| at.elapsed() < window))
            .filter_map(|(peer, h)| Some((*h.leads.get(group)?, *peer)))
            .max()
            .map(|(_, peer)| peer)
    }

    /// Whether `peer` answered within `window` and said it leads `group` in `term` or later.
    fn leads(&self, peer: BrokerId, group: &GroupId, term: u64, window: Duration) -> bool {
        self.peers.read().get(&peer).is_some_and(|h| {
            h.at.is_some_and(|at| at.elapsed() < window)
                && h.leads.get(group).is_some_and(|t| *t >= term)
        })
    }
}

impl Cluster {
    /// Pings every peer every heartbeat interval and elects leaders for groups whose leader is
    /// gone; runs until the broker stops.
    pub(super) async fn follow_liveness(self) {
        let beat = Duration::from_millis(self.inner.config.heartbeat_ms);
        let mut tick = tokio::time::interval(beat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pending: HashMap<GroupId, Pending> = HashMap::new();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.inner.stop.cancelled() => return,
            }
            self.ping_peers();
            self.elect_where_needed(&mut pending);
        }
    }

    /// Starts a ping to each peer that has none under way.
    fn ping_peers(&self) {
        let me = self.id();
        let meta = self.metadata();
        // `--peers` names the first brokers, the metadata those added later; a removed one is
        // pinged no more.
        let mut peers: Vec<BrokerId> = self.inner.config.peers.keys().copied().collect();
        peers.extend(meta.brokers.keys().copied());
        peers.retain(|p| !meta.retired.contains(p));
        peers.sort_unstable();
        peers.dedup();
        // Half the window: a peer is doubted only after two pings in a row went unanswered
        // (or one hung), not after one slow answer.
        let ttl = Duration::from_millis(self.inner.config.election_ms / 2);
        for peer in peers.into_iter().filter(|p| *p != me) {
            let asking = self
                .inner
                .liveness
                .peers
                .write()
                .entry(peer)
                .or_default()
                .asking
                .clone();
            if asking.swap(true, Ordering::AcqRel) {
                continue;
            }
            let cluster = self.clone();
            tokio::spawn(async move {
                let answer = cluster.inner.router.ping(peer, me, ttl).await;
                if let Ok(leads) = answer {
                    let mut peers = cluster.inner.liveness.peers.write();
                    let heard = peers.entry(peer).or_default();
                    heard.at = Some(Instant::now());
                    heard.leads = leads.into_iter().collect();
                }
                asking.store(false, Ordering::Release);
            });
        }
    }

    /// Triggers an election for each group of this broker whose leader is gone, staggered by
    /// this broker's rank among the live replicas in placement order.
    fn elect_where_needed(&self, pending: &mut HashMap<GroupId, Pending>) {
        let me = self.id();
        let election = Duration::from_millis(self.inner.config.election_ms);
        let now = Instant::now();
        let groups: Vec<_> = self
            .inner
            .partitions
            .read()
            .iter()
            .map(|(g, ep)| (g.clone(), ep.clone()))
            .collect();
        let present: std::collections::HashSet<&GroupId> = groups.iter().map(|(g, _)| g).collect();
        pending.retain(|g, _| present.contains(g));
        let meta = self.metadata();
        for (group, ep) in groups {
            let view = ep.view();
            if !view.voters.contains(&me) {
                continue;
            }
            let live = &self.inner.liveness;
            // A leader that answers pings but has not claimed the group yet (just elected, or
            // its claim is one ping old) is given an election timeout before it is doubted.
            let (trusted, grace) = match view.leader {
                Some(l) if l == me => (true, Duration::ZERO),
                Some(l) if live.leads(l, &group, view.term, election) => (true, Duration::ZERO),
                Some(l) if live.alive(l, election) => (false, election),
                _ => (false, Duration::ZERO),
            };
            if trusted {
                pending.remove(&group);
                continue;
            }
            let state = pending.entry(group.clone()).or_insert(Pending {
                since: now,
                asked: None,
            });
            let GroupId::Partition(topic, p) = &group else {
                continue;
            };
            let mut order: Vec<BrokerId> = meta
                .topics
                .get(topic)
                .and_then(|t| t.placement.get(*p as usize))
                .cloned()
                .unwrap_or_default();
            order.retain(|b| view.voters.contains(b));
            let rest: Vec<BrokerId> = view
                .voters
                .iter()
                .copied()
                .filter(|v| !order.contains(v))
                .collect();
            order.extend(rest);
            let rank = order
                .iter()
                .filter(|b| **b == me || live.alive(**b, election))
                .position(|b| *b == me)
                .unwrap_or(0) as u32;
            // The rank's stagger before the first try, and between tries an election timeout
            // stretched at random (up to twice), so that two candidates that split a vote do
            // not run again in step.
            let wait = grace + election / 2 * rank;
            let again = state
                .asked
                .is_none_or(|(at, jitter)| now - at >= election + election / 2 * rank + jitter);
            if now - state.since >= wait && again {
                state.asked = Some((now, jitter(election)));
                tracing::debug!(%group, rank, leader = ?view.leader, "no live leader: asking for an election");
                tokio::spawn(async move { ep.elect().await });
            }
        }
    }
}

/// A random duration below `max`.
fn jitter(max: Duration) -> Duration {
    let mut b = [0u8; 4];
    let r = getrandom::fill(&mut b).map_or(0, |()| u32::from_le_bytes(b));
    max.mul_f64(f64::from(r) / f64::from(u32::MAX))
}
