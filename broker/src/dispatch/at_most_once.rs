//! At-most-once delivery (`"delivery": "at-most-once"`, docs/delivery.md, "Delivery modes"): nothing is
//! ever sent twice, at the price of losing what a failure or a crash catches in flight.
//!
//! Two rules make it so. (1) Before a message is sent, a position past it is durable: the worker
//! waits for a *claim* covering it ([`Worker::claim`], [`super::claims`]), so a crash resumes
//! after the claim. (2) A message is sent once,
//! whatever comes back: a NACK dead-letters it at once, a communication failure (which may have
//! reached the consumer) drops it, counted in `dropped` and logged. Only what was certainly not
//! handed over is tried again: a plugin that is not loaded yet, a dispatcher that is stopping.
//! A clean stop writes the true position, so it loses nothing.

use std::sync::atomic::Ordering;

use super::backoff::Backoff;
use super::checkpoint_saver::CheckpointSaver;
use super::target::{Delivery, Outcome, RunAnswer, TargetError};
use super::worker::{Stopped, Worker};
use crate::config::DeliveryMode;

impl Worker {
    /// Waits until everything below `needed` is durably claimed (a no-op for at-least-once);
    /// `limit` is how far has been read. While the disk refuses, the claim writer retries and
    /// nothing is sent (sending unclaimed messages could send them twice after a crash).
    pub(super) async fn claim(
        &self,
        saver: &CheckpointSaver,
        needed: u64,
        limit: u64,
    ) -> Result<(), Stopped> {
        // At-least-once claims nothing: no wait on the delivery path.
        if self.spec.delivery == DeliveryMode::AtLeastOnce {
            return Ok(());
        }
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(Stopped),
            r = saver.claim(needed, limit) => r.ok_or(Stopped),
        }
    }

    /// Sends each message of `run` once (as one batch when the target takes batches): ACKed ones
    /// are delivered, NACKed ones dead-lettered with one attempt, failed ones dropped. `advance`
    /// is called for every message sent, whatever its answer.
    pub(super) async fn deliver_each_once(
        &self,
        run: &mut Vec<(u64, Delivery)>,
        advance: &mut (dyn FnMut(u64) + Send),
    ) -> Result<(), Stopped> {
        let items = std::mem::take(run);
        let per_message = self.target.answers_per_message();
        let mut not_handed_over = Backoff::new();
        let mut i = 0;
        while i < items.len() {
            if self.cancel.is_cancelled() {
                return Err(Stopped);
            }
            self.may_send().await?;
            let batch: Vec<Delivery> = items[i..].iter().map(|(_, d)| d.clone()).collect();
            let RunAnswer { acked, stopped } = self.target.deliver_run(&batch, &self.cancel).await;
            for (offset, d) in &items[i..i + acked] {
                self.acked(d);
                advance(*offset);
            }
            i += acked;
            let Some(outcome) = stopped else { continue };
            // What the answer is about: one message, or the rest of a batch sent as one request.
            let about = if per_message {
                i..i + 1
            } else {
                i..items.len()
            };
            match outcome {
                Outcome::Ack => {
                    for (offset, d) in &items[about.clone()] {
                        self.acked(d);
                        advance(*offset);
                    }
                }
                Outcome::Nack(reason) => {
                    self.nacked();
                    for (offset, d) in &items[about.clone()] {
                        // Sent: past it before its dead letter is written, so that a stop
                        // while that write waits loses the dead letter, never sends it again.
                        advance(*offset);
                        self.dead_letter(d, &reason, 1).await?;
                    }
                }
                // A resend is a second send: at-most-once dead-letters instead.
                Outcome::RetryAfter(wait) => {
                    let reason = format!(
                        "asked to retry after {} ms; at-most-once sends a message once",
                        wait.as_millis()
                    );
                    for (offset, d) in &items[about.clone()] {
                        // Sent: past it before its dead letter is written, so that a stop
                        // while that write waits loses the dead letter, never sends it again.
                        advance(*offset);
                        self.dead_letter(d, &reason, 1).await?;
                    }
                }
                Outcome::DeadLetter(reason) => {
                    for (offset, d) in &items[about.clone()] {
                        // Sent: past it before its dead letter is written, so that a stop
                        // while that write waits loses the dead letter, never sends it again.
                        advance(*offset);
                        self.dead_letter(d, &reason, 1).await?;
                    }
                }
                Outcome::Failed(TargetError::Stopping) => return Err(Stopped),
                Outcome::Failed(why @ TargetError::NotLoaded(_)) => {
                    // Never handed over: it waits for the plugin, like any other message.
                    self.failed(&items[i].1, why, &mut not_handed_over).await?;
                    continue;
                }
                Outcome::Failed(why) => {
                    for (offset, d) in &items[about.clone()] {
                        self.dropped(d, &why);
                        advance(*offset);
                    }
                }
            }
            i = about.end;
        }
        Ok(())
    }

    /// Counts and logs a message dropped after a communication failure.
    fn dropped(&self, d: &Delivery, why: &TargetError) {
        let before = self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        self.metrics.dropped.get_or_create(&self.label()).inc();
        // One line per drop would flood the log while a consumer is down: the first, then one
        // per thousand (the count is in status and metrics).
        if before.is_multiple_of(1000) {
            tracing::warn!(offset = d.envelope.offset, error = %why, dropped_so_far = before + 1, "at-most-once: message dropped after a communication failure");
        }
        self.record_passed(
            d,
            format!("offset {} dropped (at-most-once): {why}", d.envelope.offset),
        );
    }
}
