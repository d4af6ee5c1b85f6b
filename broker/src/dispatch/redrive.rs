//! Dead-letter redrive (docs/delivery.md, "Dead-letter redrive"): the dead letters of `__dlq.<consumerId>`
//! delivered again to that dispatcher's own target, in order, with its usual retries.
//!
//! A redrive is a drain worker per partition of the dead-letter topic that reads the dead letters
//! in offset order, unwraps each one's original envelope and stops at the end of its range. A
//! message that fails again is dead-lettered again, to the end of the same topic, carrying the
//! failures before it (`history`), so the next redrive can take it. Other dispatchers never see
//! a redrive: it goes to this dispatcher's target only. Without `from` a redrive continues where
//! the last one stopped (its position is a checkpoint named `__redrive` of the dead-letter
//! partition); with `from` it covers that range and remembers nothing on one broker (in a
//! cluster its position is replicated as `__redrive.{run}`: `redrive_cluster`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use mmmq_core::{
    ConsumerId, Envelope, RedrivePartition, RedriveStatus, StoredMessage, Topic, now_ms,
};
use serde::Deserialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::last_error;
use super::redrive_range::Range;
use super::target::{DeadLetterAt, Delivery};
use super::worker::{Worker, WorkerStats};
use super::{Dispatch, Running};
use crate::topics::Partition;

/// The checkpoint name of a redrive's position in a dead-letter partition. The emits of redriven
/// messages are guarded by it too (their bounds are `checkpoints/__redrive.emits`).
pub(crate) const REDRIVE_CHECKPOINT: &str = "__redrive";

/// Why a redrive was refused.
#[derive(Debug, thiserror::Error)]
pub enum RedriveError {
    /// No dispatcher has this consumerId.
    #[error("no dispatcher {0:?}")]
    UnknownDispatcher(String),
    /// `from` is past `to`.
    #[error("`from` ({from}) is after `to` ({to})")]
    BadRange {
        /// Asked start.
        from: u64,
        /// Asked end.
        to: u64,
    },
    /// `from` or `to` lies past the end of the dead-letter topic: a range that is not there yet
    /// would take the dead letters the redrive itself writes, without end.
    #[error(
        "`{bound}` ({value}) is past the end of the dead-letter topic {topic} (its next offset is {end})"
    )]
    PastEnd {
        /// `from` or `to`.
        bound: &'static str,
        /// What was asked.
        value: u64,
        /// The dead-letter topic.
        topic: String,
        /// Its end: the largest next offset over its partitions.
        end: u64,
    },
    /// One redrive at a time per dispatcher.
    #[error("a redrive of {0:?} is already running; its progress is in the dispatcher's status")]
    AlreadyRunning(String),
    /// The broker is stopping.
    #[error("the broker is shutting down")]
    ShuttingDown,
    /// A cluster's metadata refused it (a redrive started through another broker runs, or the
    /// dead-letter topic was deleted meanwhile).
    #[error("{0}")]
    Refused(String),
    /// A cluster's metadata could not take it now (no leader, no majority).
    #[error("{0}")]
    Unavailable(String),
    /// The position of the last redrive could not be read.
    #[error("cannot read the position of the last redrive: {0}")]
    Storage(#[from] crate::storage::StorageError),
}

/// A redrive of one dispatcher, running or done.
pub(super) struct RedriveRun {
    started_at: u64,
    /// In a cluster, the metadata's number of the redrive this broker runs its part of.
    run: Option<u64>,
    cancel: CancellationToken,
    parts: Vec<Part>,
}

struct Part {
    partition: Arc<Partition>,
    from: u64,
    to: u64,
    /// In a cluster, the name of its replicated position.
    position: Option<ConsumerId>,
    stats: Arc<WorkerStats>,
    join: tokio::task::JoinHandle<()>,
}

impl Part {
    /// How far it got: on one broker its worker's count; in a cluster the replicated position
    /// too (another broker may have delivered it).
    fn next(&self) -> u64 {
        let here = self.stats.next_offset.load(Ordering::Relaxed);
        here.max(self.replicated()).min(self.to)
    }

    /// In a cluster, its replicated position: what a new leader continues from, and what the
    /// metadata counts as done (its `from` until a leader wrote one); `from` on one broker.
    fn replicated(&self) -> u64 {
        let stored = self.position.as_ref().and_then(|name| {
            self.partition
                .delivery
                .current()?
                .stored_next(name.as_str())
        });
        stored.unwrap_or(0).max(self.from)
    }
}

impl RedriveRun {
    /// On one broker, while its workers run; in a cluster, while a partition is short of its
    /// end (a worker here waits while another broker delivers its partition).
    fn running(&self) -> bool {
        match self.run {
            None => self.parts.iter().any(|p| !p.join.is_finished()),
            Some(_) => self.parts.iter().any(|p| p.replicated() < p.to),
        }
    }

    /// The metadata's number of the redrive, in a cluster.
    pub(super) fn run(&self) -> Option<u64> {
        self.run
    }

    pub(super) fn status(&self) -> RedriveStatus {
        let sum = |f: fn(&WorkerStats) -> &std::sync::atomic::AtomicU64| {
            self.parts
                .iter()
                .map(|p| f(&p.stats).load(Ordering::Relaxed))
                .sum::<u64>()
        };
        let partitions: Vec<RedrivePartition> = self
            .parts
            .iter()
            .map(|p| RedrivePartition {
                partition: p.partition.number,
                from: p.from,
                to: p.to,
                next: p.next(),
            })
            .collect();
        let remaining = partitions.iter().map(|p| p.to.saturating_sub(p.next)).sum();
        let (last_error, last_error_at, last_error_resolved_at) = last_error::fields(
            last_error::pick(self.parts.iter().filter_map(|p| p.stats.last_error.get())),
        );
        let delivered = sum(|s| &s.delivered);
        let dead_lettered = sum(|s| &s.dead_lettered);
        let dropped = sum(|s| &s.dropped);
        RedriveStatus {
            running: self.running(),
            started_at: self.started_at,
            redriven: delivered + dead_lettered + dropped,
            remaining,
            delivered,
            nacked: sum(|s| &s.nacked),
            dead_lettered,
            dropped,
            partitions,
            last_error,
            last_error_at,
            last_error_resolved_at,
        }
    }

    /// Stops it (its dispatcher stops, or the dead-letter topic is deleted) and waits.
    pub(super) async fn stop(mut self) {
        self.cancel.cancel();
        for p in std::mem::take(&mut self.parts) {
            let _ = p.join.await;
        }
    }
}

/// A run replaced without [`RedriveRun::stop`] (a new redrive over a finished one, whose workers
/// may still wait for their partition's leadership in a cluster) stops its workers all the same.
impl Drop for RedriveRun {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// The dead letter as the worker wrote it.
#[derive(Deserialize)]
struct DeadLetter {
    reason: String,
    attempts: u64,
    envelope: Envelope,
    #[serde(default)]
    history: Vec<Value>,
}

impl Worker {
    /// The original message of a dead letter at `dlq_offset`, carrying its failures so far.
    pub(super) fn unwrap_dead_letter(
        &self,
        msg: StoredMessage,
        dlq_offset: u64,
    ) -> Result<Delivery, serde_json::Error> {
        let dead: DeadLetter = serde_json::from_str(msg.content.get())?;
        let mut history = dead.history;
        history.push(serde_json::json!({
            "reason": dead.reason,
            "attempts": dead.attempts,
            "deadLetteredAt": msg.timestamp,
            "dlqOffset": dlq_offset,
        }));
        let mut d = Delivery::new(dead.envelope);
        d.history = Some(Arc::new(history));
        d.dead_letter = Some(DeadLetterAt {
            topic: self.topic.clone(),
            partition: self.partition.number,
            offset: dlq_offset,
        });
        Ok(d)
    }
}

/// Where a redrive starts in each partition: `from`, or where the last redrive without `from`
/// stopped (a file read per partition: call it off the executor), within what is stored.
pub(super) fn starts(
    partitions: &[Arc<Partition>],
    from: Option<u64>,
) -> Result<Vec<u64>, crate::storage::StorageError> {
    let mark = ConsumerId::new(REDRIVE_CHECKPOINT).expect("a valid name");
    partitions
        .iter()
        .map(|p| {
            let start = match from {
                Some(f) => f,
                // A clustered partition's positions are the cluster's (docs/cluster.md,
                // "Delivery in a cluster").
                None if p.log.clustered() => p
                    .delivery
                    .current()
                    .and_then(|c| c.stored_next(mark.as_str()))
                    .unwrap_or(0),
                None => p
                    .checkpoints
                    .read_position(&mark)?
                    .map_or(0, |pos| pos.next),
            };
            // A partition shorter than `from` (or a position past its end) has nothing to redrive.
            Ok(start.max(p.log.first_offset()).min(p.log.next_offset()))
        })
        .collect()
}

/// What a redrive covers, decided where it is asked for: a range per partition of the
/// dead-letter topic.
#[derive(Debug, Clone)]
pub struct RedrivePlan {
    /// The dead-letter topic.
    pub topic: Topic,
    /// Without `from`: it continues the last redrive, and the next continues it.
    pub continues: bool,
    /// Per partition, `from`…`to`−1.
    pub parts: Vec<PlannedPart>,
}

/// One partition of a [`RedrivePlan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedPart {
    /// The partition.
    pub partition: u32,
    /// Where it starts.
    pub from: u64,
    /// Where it ends (exclusive).
    pub to: u64,
}

impl Dispatch {
    /// Starts redriving `consumer_id`'s dead letters, offsets `from`…`to`−1 of each partition of
    /// its dead-letter topic (default: from where the last redrive stopped to the end).
    pub async fn redrive(
        &self,
        consumer_id: &str,
        from: Option<u64>,
        to: Option<u64>,
    ) -> Result<RedriveStatus, RedriveError> {
        let plan = self.redrive_plan(consumer_id, from, to).await?;
        let id = ConsumerId::new(consumer_id).expect("checked by the plan");
        let mark = ConsumerId::new(REDRIVE_CHECKPOINT).expect("a valid name");
        let mut running = self.running.lock();
        if self.shutdown.is_cancelled() {
            return Err(RedriveError::ShuttingDown);
        }
        let r: &mut Running = running
            .get_mut(&id)
            .ok_or_else(|| RedriveError::UnknownDispatcher(consumer_id.to_owned()))?;
        if r.redrive.as_ref().is_some_and(RedriveRun::running) {
            return Err(RedriveError::AlreadyRunning(consumer_id.to_owned()));
        }
        let checkpoint_id = plan.continues.then_some(mark);
        let run = self.start_run(r, &plan, checkpoint_id, None, now_ms());
        let status = run.status();
        r.redrive = Some(run);
        Ok(status)
    }

    /// Checks a redrive of `consumer_id` and decides its range in each partition: from `from`,
    /// or where the last redrive without `from` stopped; to `to`, or the end of the partition.
    pub async fn redrive_plan(
        &self,
        consumer_id: &str,
        from: Option<u64>,
        to: Option<u64>,
    ) -> Result<RedrivePlan, RedriveError> {
        if let (Some(from), Some(to)) = (from, to)
            && from > to
        {
            return Err(RedriveError::BadRange { from, to });
        }
        let unknown = || RedriveError::UnknownDispatcher(consumer_id.to_owned());
        let id = ConsumerId::new(consumer_id).map_err(|_| unknown())?;
        if !self.running.lock().contains_key(&id) {
            return Err(unknown());
        }
        let dlq = Topic::dead_letter(&id);
        let partitions = self.partitions_of(&dlq);
        // A range past the end is `400` (docs/delivery.md, "Dead-letter redrive"): what the client asked
        // for is not there. (The starts and ends below are clamped to what exists as well, so
        // that a redrive never reaches the dead letters it writes itself.)
        let end = partitions
            .iter()
            .map(|p| p.log.next_offset())
            .max()
            .unwrap_or(0);
        for (bound, value) in [("from", from), ("to", to)] {
            if let Some(value) = value.filter(|&v| v > end) {
                return Err(RedriveError::PastEnd {
                    bound,
                    value,
                    topic: dlq.to_string(),
                    end,
                });
            }
        }
        let read = partitions.clone();
        let starts = tokio::task::spawn_blocking(move || starts(&read, from))
            .await
            .expect("checkpoint read panicked")?;
        let parts = partitions
            .iter()
            .zip(starts)
            .map(|(p, start)| {
                let end = p.log.next_offset();
                PlannedPart {
                    partition: p.number,
                    from: start,
                    to: to.map_or(end, |t| t.min(end)).max(start),
                }
            })
            .collect();
        Ok(RedrivePlan {
            topic: dlq,
            continues: from.is_none(),
            parts,
        })
    }

    /// The partitions of `topic` open here (none if it is not).
    pub(super) fn partitions_of(&self, topic: &Topic) -> Vec<Arc<Partition>> {
        self.registry
            .get(topic)
            .map(|t| t.partitions())
            .unwrap_or_default()
    }

    /// The status of `consumer_id`'s last redrive, if it has one here.
    pub fn redrive_status(&self, consumer_id: &str) -> Option<RedriveStatus> {
        let id = ConsumerId::new(consumer_id).ok()?;
        self.running
            .lock()
            .get(&id)?
            .redrive
            .as_ref()
            .map(RedriveRun::status)
    }

    /// Starts a worker per partition of `plan` for dispatcher `r`, its position kept under
    /// `checkpoint_id` (none: in memory only).
    pub(super) fn start_run(
        &self,
        r: &Running,
        plan: &RedrivePlan,
        checkpoint_id: Option<ConsumerId>,
        run: Option<u64>,
        started_at: u64,
    ) -> RedriveRun {
        let cancel = r.cancel.child_token();
        let partitions = self.partitions_of(&plan.topic);
        let parts = plan
            .parts
            .iter()
            .filter_map(|part| {
                let p = partitions.iter().find(|p| p.number == part.partition)?;
                let range = Range {
                    from: Some(part.from),
                    to: part.to,
                };
                let worker = self.worker(
                    r,
                    (&plan.topic, p),
                    &cancel,
                    checkpoint_id.clone(),
                    Some(range),
                );
                let stats = worker.stats.clone();
                stats.next_offset.store(part.from, Ordering::Relaxed);
                tracing::info!(consumer_id = %r.spec.consumer_id, partition = p.number, from = part.from, to = part.to, "redrive started");
                Some(Part {
                    partition: p.clone(),
                    from: part.from,
                    to: part.to,
                    position: run.and(checkpoint_id.clone()),
                    stats,
                    join: tokio::spawn(worker.run()),
                })
            })
            .collect();
        RedriveRun {
            started_at,
            run,
            cancel,
            parts,
        }
    }
}
