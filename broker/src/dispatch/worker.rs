//! The drain worker of one (dispatcher, topic): reads the topic's log from the dispatcher's
//! checkpoint and delivers in strict offset order, one request in flight.
//!
//! It is a Tokio task that sleeps on the log's commit watch while there is nothing to do (no thread,
//! no polling). Two layers of retry, as in MMMQ: a NACK is resent up to `maxNackRetries` times and
//! then dead-lettered; a communication failure is retried with backoff (1 s doubling to 60 s)
//! forever, because the consumer will come back and the message must not be skipped.
//!
//! Checkpoints are persisted after the ACK by a companion task that writes the newest position at
//! most once per checkpoint interval (`checkpointIntervalMs`, 50 ms by default), so a slow fsync
//! never holds delivery back and a busy consumer does not double the broker's fsyncs; after a
//! crash at most the messages ACKed in the last interval plus one write are delivered again
//! (at-least-once). A clean stop writes the final position at once, so nothing ACKed is
//! redelivered after a clean restart.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mmmq_core::{ConsumerId, StoredMessage, Topic};
use parking_lot::Mutex;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::backoff::{self, Backoff};
use super::checkpoint_saver::CheckpointSaver;
use super::target::{Delivery, Outcome, RunAnswer, Target, TargetError};
use crate::config::{DeliveryMode, DispatcherSpec};
use crate::metrics::{ConsumerLabel, DispatchLabel, Metrics};
use crate::storage::{Entry, Position};
use crate::topics::{Partition, Registry};

pub(super) const READ_BATCH: usize = 256;
/// Messages handed at once to a target that answers per message (plugins, in-process handlers):
/// for a plugin this amortises the hop to a blocking thread (two wake-ups, tens of microseconds)
/// over sub-microsecond calls, while a reload still takes effect at the next run.
const PER_MESSAGE_RUN: usize = 64;
pub(super) const READ_BYTES: usize = 4 << 20;

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
    /// The last thing that went wrong, and when (milliseconds since the Unix epoch), so that a
    /// dispatcher's status can name its most recent problem over all topics.
    pub last_error: Mutex<Option<(u64, String)>>,
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
    /// for a redrive that continues the last one, none for a redrive of an explicit range.
    pub checkpoint_id: Option<ConsumerId>,
    /// Set when this worker redrives a dead-letter partition (README, "Dead-letter redrive").
    pub redrive: Option<super::redrive::Range>,
}

/// The worker was told to stop while waiting.
pub(super) struct Stopped;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

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
        self.drain().instrument(span).await
    }

    async fn drain(self) {
        let Some(start) = self.start_position().await else {
            return;
        };
        self.stats.next_offset.store(start.next, Ordering::Relaxed);
        let saver = CheckpointSaver::new(
            self.partition.clone(),
            self.spec.clone(),
            self.checkpoint_id.clone(),
            start.clone(),
        );
        if self.spec.max_in_flight > 1 && self.redrive.is_none() {
            self.drain_lanes(start, &saver).await;
        } else {
            self.drain_in_order(start, &saver).await;
        }
        saver.finish().await;
    }

    /// One request in flight, in offset order (README, "Dispatchers"). Offsets a checkpoint
    /// written by parallel lanes says are done are skipped.
    async fn drain_in_order(&self, start: Position, saver: &CheckpointSaver) {
        let mut next = start.next;
        let mut committed = self.partition.log.subscribe();
        let run_len = self.run_len();
        'outer: loop {
            // A redrive ends at its `to`.
            let max = match &self.redrive {
                Some(r) if next >= r.to => break,
                Some(r) => READ_BATCH.min((r.to - next) as usize),
                None => READ_BATCH,
            };
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => break,
                r = committed.wait_for(|&n| n > next) => if r.is_err() { break },
            }
            self.skip_deleted(&mut next, saver);
            let log = self.partition.log.clone();
            let from = next;
            let entries =
                match tokio::task::spawn_blocking(move || log.read_from(from, max, READ_BYTES))
                    .await
                    .expect("read task panicked")
                {
                    Ok(entries) => entries,
                    Err(_) if self.partition.log.first_offset() > from => continue,
                    Err(e) => {
                        self.record_error(format!("reading offset {next}: {e}"));
                        if self.sleep(backoff::START).await.is_err() {
                            break;
                        }
                        continue;
                    }
                };
            let read_end = entries.last().map_or(next, |e| e.offset + 1);
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

    /// The checkpoint, or 0 (a redrive: its `from`); clamped into the log's range.
    async fn start_position(&self) -> Option<Position> {
        let partition = self.partition.clone();
        let id = self.checkpoint_id.clone();
        let from = self.redrive.as_ref().and_then(|r| r.from);
        let stored = tokio::task::spawn_blocking(move || match (from, id) {
            (Some(from), _) => Ok(Some(Position::at(from))),
            (None, Some(id)) => partition.checkpoints.read_position(&id),
            (None, None) => Ok(None),
        })
        .await
        .expect("checkpoint read panicked");
        let mut stored = match stored {
            Ok(v) => v.unwrap_or_default(),
            Err(e) => {
                // Starting from 0 would redeliver everything; refusing keeps the problem visible.
                tracing::error!(error = %e, "cannot read the checkpoint; this dispatcher will not deliver this topic");
                self.record_error(e.to_string());
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
                    let envelope =
                        msg.into_envelope(self.topic.clone(), self.partition.number, offset);
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
        self.record_error(problem);
        Err(offset)
    }

    /// Delivers the gathered run (as one batch when the target takes batches) and advances.
    pub(super) async fn deliver_gathered(
        &self,
        run: &mut Vec<(u64, Delivery)>,
        advance: &mut (dyn FnMut(u64) + Send),
    ) -> Result<(), Stopped> {
        if self.spec.delivery == DeliveryMode::AtMostOnce {
            return self.deliver_each_once(run, advance).await;
        }
        let mut items: std::collections::VecDeque<(u64, Delivery)> = std::mem::take(run).into();
        while !items.is_empty() {
            if self.cancel.is_cancelled() {
                return Err(Stopped);
            }
            if items.len() == 1 {
                let (offset, d) = items.pop_front().expect("one item");
                self.deliver_one(d, 0, None).await?;
                advance(offset);
                continue;
            }
            let batch: Vec<Delivery> = items.iter().map(|(_, d)| d.clone()).collect();
            let RunAnswer { acked, stopped } = self.deliver_run_with_backoff(&batch).await?;
            for _ in 0..acked {
                let (offset, d) = items.pop_front().expect("acked items exist");
                self.acked(&d);
                advance(offset);
            }
            match stopped {
                None => {}
                Some(Outcome::Nack(reason)) if self.target.answers_per_message() => {
                    self.nacked();
                    let (offset, d) = items.pop_front().expect("the NACKed item exists");
                    self.deliver_one(d, 1, Some(reason)).await?;
                    advance(offset);
                }
                // A NACKed batch goes again one message at a time, so only the failing ones
                // are retried and dead-lettered.
                Some(_) => {
                    self.nacked();
                    while let Some((offset, d)) = items.pop_front() {
                        if self.cancel.is_cancelled() {
                            return Err(Stopped);
                        }
                        self.deliver_one(d, 0, None).await?;
                        advance(offset);
                    }
                }
            }
        }
        Ok(())
    }

    /// Like [`Self::deliver_with_backoff`] for a run: retries while nothing of it got an answer.
    /// A failure after some messages were ACKed is left to the caller, which goes on with the rest.
    async fn deliver_run_with_backoff(&self, batch: &[Delivery]) -> Result<RunAnswer, Stopped> {
        let mut backoff = Backoff::new();
        loop {
            match self.target.deliver_run(batch, &self.cancel).await {
                RunAnswer {
                    acked: 0,
                    stopped: Some(Outcome::Failed(why)),
                } => self.failed(&batch[0], why, &mut backoff).await?,
                RunAnswer {
                    acked,
                    stopped: Some(Outcome::Failed(_)),
                } => return Ok(RunAnswer::all(acked)),
                answer => return Ok(answer),
            }
        }
    }

    /// Counts a communication failure, logs it on the first of a streak and at the longest
    /// backoff (not on every retry), and waits out the backoff.
    pub(super) async fn failed(
        &self,
        d: &Delivery,
        why: TargetError,
        backoff: &mut Backoff,
    ) -> Result<(), Stopped> {
        // Not a failure of the consumer: the worker is stopping (and the target said so).
        if self.cancel.is_cancelled() {
            return Err(Stopped);
        }
        let wait = backoff.failed();
        self.stats.retries.fetch_add(1, Ordering::Relaxed);
        self.metrics.retries.get_or_create(&self.label()).inc();
        if backoff.worth_logging() {
            tracing::warn!(offset = d.envelope.offset, error = %why, retry_in_s = wait.as_secs(), "delivery failed; retrying");
        }
        self.record_error(why.to_string());
        self.sleep(wait).await
    }

    /// One message: resend on NACK up to the limit, then dead-letter it. `nacks` and `reason`
    /// carry a NACK it already got in a run.
    async fn deliver_one(
        &self,
        d: Delivery,
        mut nacks: u32,
        mut reason: Option<String>,
    ) -> Result<(), Stopped> {
        let batch = std::slice::from_ref(&d);
        loop {
            if self.cancel.is_cancelled() {
                return Err(Stopped);
            }
            if let Some(why) = &reason
                && nacks > self.spec.max_nack_retries
            {
                return self.dead_letter(&d, why, nacks).await;
            }
            match self.deliver_with_backoff(batch).await? {
                Outcome::Ack => {
                    self.acked(&d);
                    return Ok(());
                }
                Outcome::Nack(why) => {
                    self.nacked();
                    nacks += 1;
                    reason = Some(why);
                    tracing::debug!(offset = d.envelope.offset, nacks, "NACK");
                }
                Outcome::Failed(_) => unreachable!("deliver_with_backoff retries failures"),
            }
        }
    }

    /// Delivers until the consumer gives an answer (ACK or NACK), backing off on failures.
    async fn deliver_with_backoff(&self, batch: &[Delivery]) -> Result<Outcome, Stopped> {
        let mut backoff = Backoff::new();
        loop {
            match self.target.deliver(batch, &self.cancel).await {
                Outcome::Failed(why) => self.failed(&batch[0], why, &mut backoff).await?,
                answer => {
                    if backoff.failures() > 0 {
                        tracing::info!(failures = backoff.failures(), "consumer reachable again");
                    }
                    return Ok(answer);
                }
            }
        }
    }

    pub(super) async fn dead_letter(
        &self,
        d: &Delivery,
        reason: &str,
        attempts: u32,
    ) -> Result<(), Stopped> {
        let dlq = Topic::dead_letter(&self.spec.consumer_id);
        let mut content = serde_json::json!({
            "consumerId": self.spec.consumer_id,
            "reason": reason,
            "attempts": attempts,
            "envelope": d.envelope,
        });
        // Dead-lettered again after a redrive: the earlier failures come along.
        if let Some(history) = &d.history {
            content["history"] = serde_json::Value::Array(history.to_vec());
        }
        let payload = StoredMessage {
            timestamp: now_ms(),
            key: d.envelope.key.clone(),
            content: RawValue::from_string(content.to_string()).expect("json! is valid JSON"),
            id: None,
        }
        .to_payload();
        let mut backoff = Backoff::new();
        loop {
            let result = match self.registry.get_or_create(&dlq).await {
                Ok(t) => {
                    // Dead letters are routed by the original key, as a producer's would be.
                    let p = t
                        .route(None, d.envelope.key.as_deref())
                        .expect("a route without an explicit partition always exists");
                    p.log.append(&payload).await
                }
                Err(e) => Err(e),
            };
            match result {
                Ok(dlq_offset) => {
                    tracing::warn!(offset = d.envelope.offset, attempts, reason, dlq = %dlq, dlq_offset, "message dead-lettered");
                    self.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
                    self.metrics
                        .dead_lettered
                        .get_or_create(&self.label())
                        .inc();
                    self.record_error(format!(
                        "offset {} dead-lettered after {attempts} attempts: {reason}",
                        d.envelope.offset
                    ));
                    return Ok(());
                }
                Err(e) => {
                    // Skipping would lose the message: wait for the disk instead.
                    tracing::error!(error = %e, "cannot write to the dead-letter topic; retrying");
                    self.record_error(e.to_string());
                    self.sleep(backoff.failed()).await?;
                }
            }
        }
    }

    pub(super) fn acked(&self, d: &Delivery) {
        self.stats.delivered.fetch_add(1, Ordering::Relaxed);
        self.metrics.delivered.get_or_create(&self.label()).inc();
        let latency = now_ms().saturating_sub(d.envelope.timestamp) as f64 / 1000.0;
        self.metrics
            .delivery_latency
            .get_or_create(&ConsumerLabel {
                consumer: self.spec.consumer_id.to_string(),
            })
            .observe(latency);
    }

    pub(super) fn nacked(&self) {
        self.stats.nacked.fetch_add(1, Ordering::Relaxed);
        self.metrics.nacked.get_or_create(&self.label()).inc();
    }

    pub(super) fn record_error(&self, e: String) {
        *self.stats.last_error.lock() = Some((now_ms(), e));
    }

    pub(super) async fn sleep(&self, d: Duration) -> Result<(), Stopped> {
        tokio::select! {
            _ = self.cancel.cancelled() => Err(Stopped),
            _ = tokio::time::sleep(d) => Ok(()),
        }
    }
}
