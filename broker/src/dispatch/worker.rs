//! The drain worker of one (dispatcher, topic): reads the topic's log from the dispatcher's
//! checkpoint and delivers in strict offset order, one request in flight.
//!
//! It is a Tokio task that sleeps on the log's commit watch while there is nothing to do (no thread,
//! no polling). This file reads, orders and keeps positions; sending is in `retries`
//! (at-least-once: NACK resends, backoff, dead letters) and `at_most_once`.
//!
//! Checkpoints are persisted after the ACK by a companion task that writes the newest position at
//! most once per checkpoint interval (`checkpointIntervalMs`, 50 ms by default), so a slow fsync
//! never holds delivery back and a busy consumer does not double the broker's fsyncs; after a
//! crash at most the messages ACKed in the last interval plus one write are delivered again
//! (at-least-once). A clean stop writes the final position at once, so nothing ACKed is
//! redelivered after a clean restart.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use mmmq_core::{ConsumerId, StoredMessage, Topic};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::backoff;
use super::checkpoint_saver::CheckpointSaver;
use super::last_error::{Ends, LastErrorCell};
use super::target::{Delivery, Target};
use crate::config::DispatcherSpec;
use crate::metrics::{DispatchLabel, Metrics};
use crate::storage::{Entry, Position};
use crate::topics::delivery::DeliveryGrant;
use crate::topics::{Partition, Registry};

pub(super) const READ_BATCH: usize = 256;
/// How long a cluster's redrive worker that reached its end waits before it writes its end
/// again when the last write did not get in.
const REDRIVE_RECHECK: Duration = Duration::from_millis(200);
/// Messages handed at once to a target that answers per message (plugins, in-process handlers):
/// for a plugin this amortises the hop to a blocking thread (two wake-ups, tens of microseconds)
/// over sub-microsecond calls, and the sync of a run's emits (one commit per destination) over
/// many messages. The target hands back the rest of a run after
/// [`RUN_TIME_BUDGET`](super::target::RUN_TIME_BUDGET), so a slow handler still moves the
/// position often and a reload still takes effect within milliseconds.
const PER_MESSAGE_RUN: usize = 1024;
pub(super) const READ_BYTES: usize = 4 << 20;

/// A read of the log under way on a blocking thread.
type ReadAhead = tokio::task::JoinHandle<Result<Vec<Entry>, crate::storage::StorageError>>;

/// Counters of one worker, shown in `GET /mmmq/dispatchers`.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// The next offset to deliver.
    pub next_offset: AtomicU64,
    /// Messages ACKed.
    pub delivered: AtomicU64,
    /// NACK answers.
    pub nacked: AtomicU64,
    /// Messages moved to the dead-letter topic.
    pub dead_lettered: AtomicU64,
    /// Corrupt entries skipped.
    pub corrupt_skipped: AtomicU64,
    /// Messages deleted by retention before they were delivered.
    pub skipped: AtomicU64,
    /// Communication failures retried.
    pub retries: AtomicU64,
    /// Messages dropped after a communication failure (at-most-once).
    pub dropped: AtomicU64,
    /// The last thing that went wrong, when, and whether delivery has worked since.
    pub last_error: LastErrorCell,
}

/// Everything a worker needs.
pub(super) struct Worker {
    /// The topic's name.
    pub topic: Topic,
    /// The partition this worker delivers.
    pub partition: Arc<Partition>,
    pub spec: Arc<DispatcherSpec>,
    pub target: Arc<dyn Target>,
    pub stats: Arc<WorkerStats>,
    pub cancel: CancellationToken,
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    /// Where its position is stored in the partition's checkpoints: the consumerId, `__redrive`
    /// for a redrive that continues the last one, none for a redrive of an explicit range (in a
    /// cluster, `__redrive.{run}`: a new leader continues it).
    pub checkpoint_id: Option<ConsumerId>,
    /// Set when this worker redrives a dead-letter partition (docs/delivery.md, "Dead-letter redrive").
    pub redrive: Option<super::redrive_range::Range>,
    /// In a cluster, the right to deliver in this leader's term (docs/cluster.md, "Delivery in
    /// a cluster"); set by [`Worker::run`] for each term this broker leads.
    pub grant: Option<Arc<dyn DeliveryGrant>>,
}

/// The worker was told to stop while waiting.
pub(super) struct Stopped;

impl Worker {
    pub(super) fn label(&self) -> DispatchLabel {
        DispatchLabel {
            consumer: self.spec.consumer_id.to_string(),
            topic: self.topic.to_string(),
            partition: self.partition.number,
        }
    }

    /// Runs until cancelled.
    pub async fn run(self) {
        let span = tracing::info_span!("drain", topic = %self.topic, partition = self.partition.number, consumer_id = %self.spec.consumer_id);
        if self.partition.log.clustered() {
            self.lead().instrument(span).await
        } else {
            self.drain().instrument(span).await
        }
    }

    /// A clustered partition: delivers during each term this broker leads it, from the
    /// replicated position, and stops when the term ends here (docs/cluster.md, "Delivery in a
    /// cluster").
    async fn lead(self) {
        let Some(control) = self.partition.delivery.get(&self.cancel).await else {
            return;
        };
        loop {
            let Some(grant) = control.acquire(&self.cancel).await else {
                return;
            };
            let term = grant.term();
            tracing::info!(term, "delivering: this broker leads the partition");
            let cancel = self.cancel.child_token();
            let lost = grant.lost().clone();
            let term_over = lost.clone();
            let ends = cancel.clone();
            let link = tokio::spawn(async move {
                lost.cancelled().await;
                ends.cancel();
            });
            let held = grant.clone();
            Worker {
                cancel,
                grant: Some(grant),
                topic: self.topic.clone(),
                partition: self.partition.clone(),
                spec: self.spec.clone(),
                target: self.target.clone(),
                stats: self.stats.clone(),
                registry: self.registry.clone(),
                metrics: self.metrics.clone(),
                checkpoint_id: self.checkpoint_id.clone(),
                redrive: self.redrive,
            }
            .drain()
            .await;
            link.abort();
            // Stopped, or done (a redrive's range): over. Only a term that ended goes on — a
            // redrive's too: the next term's leader continues it from its replicated position
            // (docs/cluster.md, "Delivery in a cluster").
            if self.cancel.is_cancelled() {
                return;
            }
            if !term_over.is_cancelled() {
                if self.end_replicated(&*held).await.is_err() {
                    return;
                }
                if !held.lost().is_cancelled() {
                    return;
                }
            }
            tracing::info!(term, "not delivering: the term ended here");
        }
    }

    /// A redrive that delivered to its end in this term is over once its end is replicated.
    /// Its last write may have failed (the metadata did not answer in time): it is written
    /// again — after the target settled, as the saver writes — until it gets in or the term
    /// ends (the next leader then continues from what was replicated), never by delivering the
    /// range again. `Err` when stopped.
    async fn end_replicated(&self, grant: &dyn DeliveryGrant) -> Result<(), Stopped> {
        let (Some(r), Some(id)) = (self.redrive, &self.checkpoint_id) else {
            return Ok(());
        };
        let reached = self.stats.next_offset.load(Ordering::Relaxed);
        if reached < r.to {
            return Ok(());
        }
        let end = Position::at(reached);
        loop {
            if grant.read(id.as_str()).is_some_and(|p| p.next >= r.to)
                || grant.lost().is_cancelled()
            {
                return Ok(());
            }
            if self
                .target
                .settled(&self.topic, self.partition.number)
                .await
                && grant.write(id.as_str(), &end).await.is_ok()
            {
                return Ok(());
            }
            self.sleep(REDRIVE_RECHECK).await?;
        }
    }

    async fn drain(self) {
        let Some(start) = self.start_position().await else {
            return;
        };
        self.stats.next_offset.store(start.next, Ordering::Relaxed);
        let (target, topic, partition) = (
            self.target.clone(),
            self.topic.clone(),
            self.partition.number,
        );
        let fence: super::checkpoint_saver::Fence = Arc::new(move || {
            let (target, topic) = (target.clone(), topic.clone());
            Box::pin(async move { target.settled(&topic, partition).await })
        });
        let saver = CheckpointSaver::new(
            self.positions(),
            self.spec.clone(),
            self.checkpoint_id.clone(),
            start.clone(),
            fence,
        );
        if self.spec.max_in_flight > 1 && self.redrive.is_none() {
            self.drain_lanes(start, &saver).await;
        } else {
            self.drain_in_order(start, &saver).await;
        }
        saver.finish().await;
    }

    /// One request in flight, in offset order (docs/dispatchers.md, "Dispatchers"). Offsets a checkpoint
    /// written by parallel lanes says are done are skipped.
    async fn drain_in_order(&self, start: Position, saver: &CheckpointSaver) {
        let mut next = start.next;
        let mut committed = self.partition.log.subscribe();
        let run_len = self.run_len();
        let mut prefetch: Option<(u64, ReadAhead)> = None;
        'outer: loop {
            // A redrive ends at its `to`.
            // At least a whole run per read, so runs are not cut at the read's end.
            let read_batch = READ_BATCH.max(run_len);
            let max = match &self.redrive {
                Some(r) if next >= r.to => break,
                Some(r) => read_batch.min((r.to - next) as usize),
                None => read_batch,
            };
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => break,
                r = committed.wait_for(|&n| n > next) => if r.is_err() { break },
            }
            self.skip_deleted(&mut next, saver);
            // Retention may have moved `next` on: a redrive still ends at its `to`, never
            // reaching the dead letters it wrote itself.
            let max = match &self.redrive {
                Some(r) if next >= r.to => break,
                Some(r) => max.min((r.to - next) as usize),
                None => max,
            };
            // The read made while the last batch was being delivered, if it starts here.
            let ahead = match prefetch.take() {
                Some((at, read)) if at == next => read.await.expect("read task panicked").ok(),
                _ => None,
            };
            let read = match ahead {
                Some(entries) => Ok(entries),
                None => {
                    let log = self.partition.log.clone();
                    let from = next;
                    tokio::task::spawn_blocking(move || log.read_from(from, max, READ_BYTES))
                        .await
                        .expect("read task panicked")
                }
            };
            let entries = match read {
                Ok(entries) => entries,
                Err(_) if self.partition.log.first_offset() > next => continue,
                Err(e) => {
                    self.record_error(next, format!("reading offset {next}: {e}"));
                    if self.sleep(backoff::START).await.is_err() {
                        break;
                    }
                    continue;
                }
            };
            let read_end = entries.last().map_or(next, |e| e.offset + 1);
            // A backlog: the next batch is read from disk while this one is delivered.
            if self.redrive.is_none() && self.partition.log.next_offset() > read_end {
                let log = self.partition.log.clone();
                prefetch = Some((
                    read_end,
                    tokio::task::spawn_blocking(move || log.read_from(read_end, max, READ_BYTES)),
                ));
            }
            let mut run: Vec<(u64, Delivery)> = Vec::new();
            for entry in entries {
                // A stop takes effect between messages, not after a whole read batch.
                if self.cancel.is_cancelled() {
                    break 'outer;
                }
                // Retention may have deleted what was read but not delivered yet.
                if entry.offset < self.partition.log.first_offset() {
                    run.clear();
                    self.skip_deleted(&mut next, saver);
                    continue 'outer;
                }
                let done = start.is_done(entry.offset);
                match self
                    .to_delivery(entry)
                    .and_then(|d| if done { Err(d.0) } else { Ok(d) })
                {
                    Ok((offset, d)) => {
                        run.push((offset, d));
                        if run.len() < run_len {
                            continue;
                        }
                    }
                    Err(offset) => {
                        if self
                            .send_run(&mut run, saver, &mut next, read_end)
                            .await
                            .is_err()
                        {
                            break 'outer;
                        }
                        next = offset + 1;
                        saver.set(next);
                        self.stats.next_offset.store(next, Ordering::Relaxed);
                        continue;
                    }
                }
                if self
                    .send_run(&mut run, saver, &mut next, read_end)
                    .await
                    .is_err()
                {
                    break 'outer;
                }
            }
            if self
                .send_run(&mut run, saver, &mut next, read_end)
                .await
                .is_err()
            {
                break;
            }
        }
    }

    /// Delivers a gathered run in offset order and advances past it; at-most-once, after a
    /// claim covers it (`read_end`: how far has been read).
    async fn send_run(
        &self,
        run: &mut Vec<(u64, Delivery)>,
        saver: &CheckpointSaver,
        next: &mut u64,
        read_end: u64,
    ) -> Result<(), Stopped> {
        if let Some(&(last, _)) = run.last() {
            self.claim(saver, last + 1, read_end).await?;
        }
        self.deliver_gathered(run, &mut |o| self.advance(saver, next, o))
            .await
    }

    /// The checkpoint, else 0 (a redrive: its `from`); clamped into the log's range. A redrive
    /// with a checkpoint reads it first: in a cluster, a new leader continues the redrive where
    /// the last one stopped.
    async fn start_position(&self) -> Option<Position> {
        let from = self.redrive.as_ref().and_then(|r| r.from);
        let stored = match (&self.checkpoint_id, from) {
            (Some(id), from) => self
                .positions()
                .read(id)
                .await
                .map(|p| p.or(from.map(Position::at))),
            (None, Some(from)) => Ok(Some(Position::at(from))),
            (None, None) => Ok(None),
        };
        let mut stored = match stored {
            Ok(v) => v.unwrap_or_default(),
            Err(e) => {
                // Starting from 0 would redeliver everything; refusing keeps the problem visible.
                tracing::error!(error = %e, "cannot read the checkpoint; this dispatcher will not deliver this topic");
                self.record_error(0, e.to_string());
                return None;
            }
        };
        let (first, end) = (
            self.partition.log.first_offset(),
            self.partition.log.next_offset(),
        );
        if stored.next > end {
            tracing::warn!(
                checkpoint = stored.next,
                log_end = end,
                "checkpoint is past the end of the log; continuing from the end"
            );
            return Some(Position::at(end));
        }
        if stored.next < first {
            self.note_skipped(stored.next, first);
            stored.next = first;
        }
        stored.done.retain(|&(_, e)| e > stored.next);
        Some(stored)
    }

    /// Messages delivered as one run: a batch for a target that takes batches, up to
    /// [`PER_MESSAGE_RUN`] for one that answers per message.
    pub(super) fn run_len(&self) -> usize {
        if self.target.answers_per_message() {
            self.spec.batch_max_messages.max(PER_MESSAGE_RUN)
        } else {
            self.spec.batch_max_messages.max(1)
        }
    }

    /// Everything below `offset + 1` is done (delivery in offset order).
    fn advance(&self, saver: &CheckpointSaver, next: &mut u64, offset: u64) {
        *next = offset + 1;
        saver.set(*next);
        self.stats.next_offset.store(*next, Ordering::Relaxed);
    }

    /// Behind the retention horizon: continues at the first offset still stored.
    fn skip_deleted(&self, next: &mut u64, saver: &CheckpointSaver) {
        let first = self.partition.log.first_offset();
        if *next < first {
            self.note_skipped(*next, first);
            *next = first;
            saver.set(first);
            self.stats.next_offset.store(first, Ordering::Relaxed);
        }
    }

    pub(super) fn note_skipped(&self, from: u64, to: u64) {
        tracing::warn!(
            first_skipped = from,
            last_skipped = to - 1,
            "retention deleted messages this dispatcher had not delivered; continuing at offset {to}"
        );
        self.stats.skipped.fetch_add(to - from, Ordering::Relaxed);
        self.metrics
            .skipped
            .get_or_create(&self.label())
            .inc_by(to - from);
    }

    /// Decodes an entry; `Err(offset)` when it is corrupt (logged and counted here).
    pub(super) fn to_delivery(&self, entry: Entry) -> Result<(u64, Delivery), u64> {
        let offset = entry.offset;
        let problem = match entry.payload {
            Ok(bytes) => match StoredMessage::from_payload(&bytes) {
                Ok(msg) if self.redrive.is_some() => match self.unwrap_dead_letter(msg, offset) {
                    Ok(d) => return Ok((offset, d)),
                    Err(e) => format!("offset {offset}: not a dead letter: {e}"),
                },
                Ok(msg) => {
                    let envelope = msg.into_envelope(
                        self.topic.clone(),
                        self.partition.topic_id,
                        self.partition.number,
                        offset,
                    );
                    return Ok((offset, Delivery::new(envelope)));
                }
                Err(e) => format!("offset {offset}: payload is not a stored message: {e}"),
            },
            Err(c) => c.to_string(),
        };
        tracing::error!(offset, problem = %problem, "skipping a corrupt entry");
        self.stats.corrupt_skipped.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .corrupt_skipped
            .get_or_create(&self.label())
            .inc();
        self.record_error(offset + 1, problem);
        Err(offset)
    }

    /// Records a problem of the partition's reader at `offset`, or of a message passed on there
    /// (an ACK of a later offset on any lane resolves it; `from` is the first such offset).
    pub(super) fn record_error(&self, from: u64, e: String) {
        self.stats.last_error.record(Ends::From(from), e);
    }

    /// Records a problem of delivering `d` that holds its lane (the lane's next ACK resolves it).
    pub(super) fn record_delivery_error(&self, d: &Delivery, e: String) {
        self.stats.last_error.record(Ends::OnLane(d.lane), e);
    }

    /// Records that `d` was passed on without being delivered (dead-lettered, dropped): an ACK of
    /// a later offset on any lane resolves it, since the message holds no lane.
    pub(super) fn record_passed(&self, d: &Delivery, e: String) {
        self.stats
            .last_error
            .record(Ends::From(d.read_offset() + 1), e);
    }

    pub(super) async fn sleep(&self, d: Duration) -> Result<(), Stopped> {
        tokio::select! {
            _ = self.cancel.cancelled() => Err(Stopped),
            _ = tokio::time::sleep(d) => Ok(()),
        }
    }
}
