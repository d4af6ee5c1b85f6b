//! At-least-once sending (docs/dispatchers.md, "Dispatchers"): a run of messages delivered as one batch or
//! one by one, a NACK resent up to `maxNackRetries` times and then dead-lettered, a communication
//! failure retried with backoff (1 s doubling to 60 s) forever, because the consumer will come back
//! and the message must not be skipped. The reading, ordering and positions are in `worker`;
//! at-most-once sending is in `at_most_once`.

use std::sync::atomic::Ordering;

use mmmq_core::{StoredMessage, Topic, now_ms};
use serde_json::value::RawValue;

use super::backoff::Backoff;
use super::target::{Delivery, Outcome, RunAnswer, TargetError};
use super::worker::{Stopped, Worker};
use crate::config::DeliveryMode;
use crate::metrics::ConsumerLabel;
use crate::topics::delivery::Appended;

/// How often a dispatcher whose plugin is not loaded asks again.
const NOT_LOADED_RETRY: std::time::Duration = std::time::Duration::from_millis(200);

impl Worker {
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
                self.deliver_one(d, None).await?;
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
                // A per-message answer other than ACK is that message's: it goes on alone.
                Some(answer) if self.target.answers_per_message() => {
                    let (offset, d) = items.pop_front().expect("the answered item exists");
                    self.deliver_one(d, Some(answer)).await?;
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
                        self.deliver_one(d, None).await?;
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
            self.may_send().await?;
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
        let wait = match why {
            // A plugin with no version that loads answers from memory: asking again often costs
            // nothing, and a deploy or a fixed file then serves at once (docs/plugins.md,
            // "Deploying plugins by API": a switch within 2 s), not after a backoff grown while it was missing.
            TargetError::NotLoaded(_) => backoff.failed().min(NOT_LOADED_RETRY),
            _ => backoff.failed(),
        };
        self.stats.retries.fetch_add(1, Ordering::Relaxed);
        self.metrics.retries.get_or_create(&self.label()).inc();
        if backoff.worth_logging() {
            tracing::warn!(offset = d.envelope.offset, error = %why, retry_in_ms = wait.as_millis() as u64, "delivery failed; retrying");
        }
        self.record_delivery_error(d, why.to_string());
        self.sleep(wait).await
    }

    /// One message until it is done: resent on NACK up to the limit, then dead-lettered; resent
    /// after the wait a `retry-after` asks for (not a NACK: it does not count against
    /// `maxNackRetries`, only in `attempt`); dead-lettered at once on `dead-letter`. `answer` is an
    /// answer it already got in a run (it was sent once).
    async fn deliver_one(
        &self,
        mut d: Delivery,
        mut answer: Option<Outcome>,
    ) -> Result<(), Stopped> {
        let mut nacks = 0u32;
        loop {
            // An answer that came back is acted on even when a stop came meanwhile (an ACK must
            // move the position, or a clean restart would deliver the message again); a stop only
            // keeps the next send from going out.
            match answer.take() {
                None => {}
                Some(Outcome::Ack) => {
                    self.acked(&d);
                    return Ok(());
                }
                Some(Outcome::Nack(why)) => {
                    self.nacked();
                    nacks += 1;
                    tracing::debug!(offset = d.envelope.offset, nacks, "NACK");
                    if nacks > self.spec.max_nack_retries {
                        return self.dead_letter(&d, &why, d.attempt).await;
                    }
                    d.attempt += 1;
                }
                Some(Outcome::RetryAfter(wait)) => {
                    tracing::debug!(
                        offset = d.envelope.offset,
                        wait_ms = wait.as_millis() as u64,
                        "retry after"
                    );
                    self.sleep(wait).await?;
                    d.attempt += 1;
                }
                Some(Outcome::DeadLetter(why)) => {
                    return self.dead_letter(&d, &why, d.attempt).await;
                }
                Some(Outcome::Failed(_)) => unreachable!("deliver_with_backoff retries failures"),
            }
            if self.cancel.is_cancelled() {
                return Err(Stopped);
            }
            answer = Some(self.deliver_with_backoff(std::slice::from_ref(&d)).await?);
        }
    }

    /// Delivers until the consumer gives an answer (ACK or NACK), backing off on failures.
    async fn deliver_with_backoff(&self, batch: &[Delivery]) -> Result<Outcome, Stopped> {
        let mut backoff = Backoff::new();
        loop {
            self.may_send().await?;
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
            origin: None,
            binary: Default::default(),
        }
        .to_payload();
        let mut backoff = Backoff::new();
        loop {
            let result = match self.registry.cluster_append() {
                // A dead-letter topic has one partition, as on one broker.
                Some(cluster) => {
                    let item = Appended {
                        route: d.envelope.key.clone(),
                        payload: payload.clone(),
                    };
                    cluster
                        .append(&dlq, 1, vec![item])
                        .await
                        .map(|placed| placed[0].1)
                }
                None => match self.registry.get_or_create(&dlq).await {
                    Ok(t) => {
                        // Dead letters are routed by the original key, as a producer's would be.
                        let p = t
                            .route(None, d.envelope.key.as_deref())
                            .expect("a route without an explicit partition always exists");
                        p.log.append(&payload).await.map_err(|e| e.to_string())
                    }
                    Err(e) => Err(e.to_string()),
                },
            };
            match result {
                Ok(dlq_offset) => {
                    tracing::warn!(offset = d.envelope.offset, attempts, reason, dlq = %dlq, dlq_offset, "message dead-lettered");
                    self.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
                    self.metrics
                        .dead_lettered
                        .get_or_create(&self.label())
                        .inc();
                    self.record_passed(
                        d,
                        format!(
                            "offset {} dead-lettered after {attempts} attempts: {reason}",
                            d.envelope.offset
                        ),
                    );
                    return Ok(());
                }
                Err(e) => {
                    // Skipping would lose the message: wait for the disk instead.
                    tracing::error!(error = %e, "cannot write to the dead-letter topic; retrying");
                    self.record_delivery_error(d, e);
                    self.sleep(backoff.failed()).await?;
                }
            }
        }
    }

    pub(super) fn acked(&self, d: &Delivery) {
        // Resolved before counted: a status that sees the delivery sees the problem over.
        self.stats.last_error.delivered(d.lane, d.read_offset());
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
}
