//! Delivery in a cluster (docs/cluster.md, "Delivery in a cluster"): a partition's dispatchers
//! deliver on its leader only, from positions replicated in the metadata
//! (`meta_delivery.rs`), within a lease that ends before another leader can be elected.
//!
//! - **Acquire.** A worker waits until this broker leads the partition's group and applied its
//!   term's first entry, then fences the partition's positions to that term
//!   ([`MetaCommand::DeliverPartition`]) and waits until its own metadata applied the fence:
//!   every position the previous leader got in is then here to read.
//! - **Lease.** Right before each send, the leader checks that it still leads in that term and
//!   that a quorum acknowledged it within 80 % of an election timeout. Followers
//!   refuse to vote for another leader for an election timeout after they heard from this one
//!   (openraft's leader lease), so once this check fails no other broker delivers yet; a lapsed
//!   lease is renewed by a heartbeat, and a leader that cannot renew it gives the term up.
//! - **Positions.** Writes of every worker of this broker are coalesced into one
//!   [`MetaCommand::SetPositions`] per round (one metadata commit, whatever the number of
//!   partitions and dispatchers), each accepted only in its partition's fenced term.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::async_runtime::WatchReceiver;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::meta_delivery::{PositionWrite, StoredPosition};
use super::meta_state::{MetaCommand, MetaOutcome};
use super::network::GroupId;
use super::node::Cluster;
use super::rpc::Groups;
use super::supervise::PartitionRaft;
use crate::storage::Position;
use crate::topics::delivery::{BoxFuture, DeliveryControl, DeliveryGrant};

/// The share of an election timeout after a quorum's last acknowledgement during which a leader
/// still sends: the rest is the margin for the clocks of two processes and a send under way.
pub(super) const LEASE_SHARE: f64 = 0.8;

/// How long a leader whose lease lapsed tries to renew it before it gives its term up.
const RENEWAL: Duration = Duration::from_millis(800);

/// How long to wait before trying again to acquire after a failed step.
const RETRY: Duration = Duration::from_millis(200);

/// How often a broker without a replica of the partition looks again (a move may add one).
const NO_REPLICA: Duration = Duration::from_secs(1);

/// How long a fence or a round of positions waits for the metadata's answer before it is
/// tried again: a metadata leader that stopped (SIGSTOP) holds a forwarded proposal until the
/// forward's own timeout, much longer than the election that replaces it. A proposal given up
/// may still commit, in log order: a fence is the same fence again, a position of the same term
/// is followed by the later ones.
const PROPOSE_WAIT: Duration = Duration::from_secs(2);

/// How long this broker waits for its own metadata to apply a fence the leader applied.
const FENCE_WAIT: Duration = Duration::from_secs(5);

type Reply = oneshot::Sender<Result<(), String>>;

/// Writes this broker's positions to the metadata, one command per round.
#[derive(Clone)]
pub struct PositionWriter {
    tx: mpsc::UnboundedSender<(PositionWrite, Reply)>,
}

impl PositionWriter {
    /// Starts the writer of `cluster`; it ends with the cluster.
    pub fn start(cluster: Cluster) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<(PositionWrite, Reply)>();
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut round = vec![first];
                while let Ok(more) = rx.try_recv() {
                    round.push(more);
                }
                let writes: Vec<PositionWrite> = round.iter().map(|(w, _)| w.clone()).collect();
                let proposed = cluster.propose(MetaCommand::SetPositions { writes });
                let answer = match tokio::time::timeout(PROPOSE_WAIT, proposed).await {
                    Ok(answer) => answer.map_err(|e| e.to_string()),
                    Err(_) => Err("the metadata did not answer in time".to_owned()),
                };
                for (i, (_, reply)) in round.into_iter().enumerate() {
                    let result = match &answer {
                        Ok(MetaOutcome::Each(each)) => match each.get(i) {
                            Some(None) => Ok(()),
                            Some(Some(why)) => Err(why.clone()),
                            None => Err("the metadata answered fewer writes".to_owned()),
                        },
                        Ok(other) => Err(format!("the metadata answered {other:?}")),
                        Err(e) => Err(e.clone()),
                    };
                    let _ = reply.send(result);
                }
            }
        });
        Self { tx }
    }

    async fn write(&self, write: PositionWrite) -> Result<(), String> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((write, reply))
            .map_err(|_| "the broker is stopping".to_owned())?;
        answer
            .await
            .unwrap_or_else(|_| Err("the broker is stopping".to_owned()))
    }
}

/// One clustered partition's [`DeliveryControl`].
pub struct PartitionDelivery {
    cluster: Cluster,
    writer: PositionWriter,
    topic: String,
    topic_id: String,
    partition: u32,
    /// The positions this broker wrote, by term and consumer: read back by a worker started
    /// again in the same term (a reload) before this broker's metadata applied them.
    written: Mutex<HashMap<String, (u64, Position)>>,
    /// The grant of the term this broker leads in, shared by the partition's workers.
    current: tokio::sync::Mutex<Option<Arc<Grant>>>,
    /// Position writes made here, numbering each so that one reaching the metadata after a
    /// later one is refused (`StoredPosition::seq`); never reset, so a second grant in the
    /// same term goes on numbering.
    writes: std::sync::atomic::AtomicU64,
}

impl PartitionDelivery {
    /// The control of `partition` of the incarnation `topic_id` of `topic`.
    pub fn control(
        cluster: Cluster,
        writer: PositionWriter,
        topic: &str,
        topic_id: &str,
        partition: u32,
    ) -> Arc<dyn DeliveryControl> {
        Arc::new(Control(Arc::new(Self {
            cluster,
            writer,
            topic: topic.to_owned(),
            topic_id: topic_id.to_owned(),
            partition,
            written: Mutex::new(HashMap::new()),
            current: tokio::sync::Mutex::new(None),
            writes: std::sync::atomic::AtomicU64::new(0),
        })))
    }

    fn group(&self) -> GroupId {
        GroupId::Partition(self.topic.clone(), self.partition)
    }

    /// This broker's replica of the partition, running.
    fn replica(&self) -> Option<PartitionRaft> {
        self.cluster
            .inner
            .endpoint(&self.group())
            .and_then(|e| e.partition_raft())
    }

    /// One try: the term granted, or `None` to try again.
    async fn try_acquire(self: &Arc<Self>, stop: &CancellationToken) -> Option<Arc<Grant>> {
        let raft = self.replica()?;
        let mut server = raft.server_metrics();
        loop {
            if server.borrow_watched().state == openraft::ServerState::Leader {
                break;
            }
            tokio::select! {
                changed = server.changed() => changed.ok()?,
                _ = stop.cancelled() => return None,
            }
        }
        let term = tokio::select! {
            t = super::ids::term_applied(&raft) => t.ok()?,
            _ = stop.cancelled() => return None,
        };
        let fence = MetaCommand::DeliverPartition {
            topic: self.topic.clone(),
            topic_id: self.topic_id.clone(),
            partition: self.partition,
            term,
            broker: self.cluster.id(),
        };
        let proposed = tokio::select! {
            p = tokio::time::timeout(PROPOSE_WAIT, self.cluster.propose(fence)) => p.ok()?,
            _ = stop.cancelled() => return None,
        };
        match proposed {
            Ok(MetaOutcome::Done) => {}
            Ok(other) => {
                tracing::debug!(term, outcome = ?other, "delivery fence refused");
                return None;
            }
            Err(e) => {
                tracing::debug!(term, error = %e, "delivery fence not written");
                return None;
            }
        }
        let mut metadata = self.cluster.watch_metadata();
        let fenced = metadata.wait_for(|m| {
            m.delivery(&self.topic, &self.topic_id, self.partition)
                .is_some_and(|d| d.term >= term)
        });
        let fenced = tokio::select! {
            f = tokio::time::timeout(FENCE_WAIT, fenced) => f.ok()?.ok()?,
            _ = stop.cancelled() => return None,
        };
        if fenced
            .delivery(&self.topic, &self.topic_id, self.partition)
            .is_none_or(|d| d.term != term)
        {
            return None;
        }
        drop(fenced);
        Some(Grant::start(self.clone(), raft, term))
    }
}

/// A [`PartitionDelivery`] as the partition holds it (its grants keep it too).
struct Control(Arc<PartitionDelivery>);

impl DeliveryControl for Control {
    fn delivered_by(&self) -> Option<u64> {
        let c = &self.0;
        let metadata = c.cluster.metadata();
        let d = metadata.delivery(&c.topic, &c.topic_id, c.partition)?;
        Some(d.broker)
    }

    fn stored_next(&self, consumer: &str) -> Option<u64> {
        let c = &self.0;
        let metadata = c.cluster.metadata();
        let d = metadata.delivery(&c.topic, &c.topic_id, c.partition)?;
        Some(d.positions.get(consumer)?.next)
    }

    fn acquire<'a>(
        &'a self,
        stop: &'a CancellationToken,
    ) -> BoxFuture<'a, Option<Arc<dyn DeliveryGrant>>> {
        Box::pin(async move {
            // One grant per term for every dispatcher of the partition: one fence, one watch.
            let mut current = tokio::select! {
                c = self.0.current.lock() => c,
                _ = stop.cancelled() => return None,
            };
            if let Some(grant) = current
                .as_ref()
                .filter(|g| !g.lost.is_cancelled() && g.leads())
            {
                return Some(grant.clone() as Arc<dyn DeliveryGrant>);
            }
            loop {
                if let Some(grant) = self.0.try_acquire(stop).await {
                    *current = Some(grant.clone());
                    return Some(grant as Arc<dyn DeliveryGrant>);
                }
                let wait = if self.0.replica().is_some() {
                    RETRY
                } else {
                    NO_REPLICA
                };
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.cancelled() => return None,
                }
            }
        })
    }
}

/// The right to deliver one partition in one term.
struct Grant {
    control: Arc<PartitionDelivery>,
    raft: PartitionRaft,
    term: u64,
    lost: CancellationToken,
    lease: Duration,
}

impl Grant {
    /// The grant, and a task that ends it when the term ends here.
    fn start(control: Arc<PartitionDelivery>, raft: PartitionRaft, term: u64) -> Arc<Self> {
        let election = Duration::from_millis(control.cluster.inner.config.election_ms);
        let grant = Arc::new(Self {
            control,
            raft,
            term,
            lost: CancellationToken::new(),
            lease: election.mul_f64(LEASE_SHARE),
        });
        let watched = grant.clone();
        tokio::spawn(async move {
            let mut server = watched.raft.server_metrics();
            loop {
                if !watched.leads() {
                    watched.lost.cancel();
                    break;
                }
                tokio::select! {
                    changed = server.changed() => if changed.is_err() {
                        watched.lost.cancel();
                        break;
                    },
                    _ = watched.lost.cancelled() => break,
                }
            }
            // The control holds its current grant and the grant its control: an ended grant
            // leaves the control, so a deleted partition's pair is freed (an acquire holding
            // the lock replaces it anyway).
            if let Ok(mut current) = watched.control.current.try_lock()
                && current.as_ref().is_some_and(|g| Arc::ptr_eq(g, &watched))
            {
                *current = None;
            }
        });
        grant
    }

    /// Whether this broker still leads the group in the grant's term.
    fn leads(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        m.state == openraft::ServerState::Leader
            && m.current_term == self.term
            && m.running_state.is_ok()
    }

    /// Whether a quorum acknowledged this leader within the lease (or it is alone).
    fn fresh(&self) -> bool {
        super::rpc::quorum_acked_within(&self.raft.metrics().borrow_watched(), self.lease)
    }

    async fn renew(&self) -> bool {
        let until = Instant::now() + RENEWAL;
        let mut asked = None::<Instant>;
        while Instant::now() < until && !self.lost.is_cancelled() {
            if !self.leads() {
                return false;
            }
            if self.fresh() {
                return true;
            }
            if asked.is_none_or(|at| at.elapsed() > RENEWAL / 8) {
                asked = Some(Instant::now());
                if self.raft.trigger().heartbeat().await.is_err() {
                    return false;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        false
    }
}

impl DeliveryGrant for Grant {
    fn term(&self) -> u64 {
        self.term
    }

    fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    fn may_send(&self) -> BoxFuture<'_, bool> {
        Box::pin(async move {
            if self.lost.is_cancelled() {
                return false;
            }
            if self.leads() && self.fresh() {
                return true;
            }
            if self.renew().await {
                return true;
            }
            tracing::warn!(
                term = self.term,
                "the partition's lease could not be renewed; this broker stops delivering it"
            );
            self.control
                .cluster
                .inner
                .refused_here(&self.control.group());
            self.lost.cancel();
            false
        })
    }

    fn read(&self, consumer: &str) -> Option<Position> {
        let c = &self.control;
        if let Some((term, p)) = c.written.lock().get(consumer)
            && *term == self.term
        {
            return Some(p.clone());
        }
        let metadata = c.cluster.metadata();
        let stored = metadata
            .delivery(&c.topic, &c.topic_id, c.partition)?
            .positions
            .get(consumer)?;
        Some(Position {
            next: stored.next,
            done: stored.done.clone(),
        })
    }

    fn write<'a>(
        &'a self,
        consumer: &'a str,
        position: &'a Position,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let c = &self.control;
            let write = PositionWrite {
                topic: c.topic.clone(),
                topic_id: c.topic_id.clone(),
                partition: c.partition,
                term: self.term,
                consumer: consumer.to_owned(),
                position: StoredPosition {
                    next: position.next,
                    done: position.done.clone(),
                    term: self.term,
                    seq: c.writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1,
                },
            };
            let written = c.writer.write(write).await;
            match &written {
                Ok(()) => {
                    c.written
                        .lock()
                        .insert(consumer.to_owned(), (self.term, position.clone()));
                }
                Err(_) if !self.leads() => self.lost.cancel(),
                Err(_) => {}
            }
            written
        })
    }
}
