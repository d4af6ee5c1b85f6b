//! At-most-once claims (docs/delivery.md, "Delivery modes"): before a message is sent, a position past it
//! is durable, so that a crash resumes after it and never sends it again.
//!
//! A claim write is two fsyncs. Writing one before each message would halve a fast consumer's
//! rate; claiming a whole read batch at once would make a crash lose all of it. So claims run
//! ahead in the background: a message needs a claim covering it before it is sent, and whenever
//! less than half of [`CLAIM_AHEAD`] is left, the next claim (up to [`CLAIM_AHEAD`] past the
//! message, never past what has been read) is written while sending goes on. A crash loses at
//! most the claimed messages not sent yet: [`CLAIM_AHEAD`] per partition, plus what lanes hold.

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::backoff::Backoff;
use super::positions::Positions;
use crate::storage::Position;
use mmmq_core::ConsumerId;

/// How far claims run ahead of the message being sent.
pub(super) const CLAIM_AHEAD: u64 = 64;

/// Writes claims for one worker.
pub(super) struct Claimer {
    wanted: watch::Sender<u64>,
    durable: watch::Receiver<u64>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Claimer {
    /// Starts the writer; the starting position counts as claimed.
    pub(super) fn spawn(positions: Positions, id: ConsumerId, start: &Position) -> Self {
        let (wanted, mut wanted_rx) = watch::channel(start.next);
        let (durable_tx, durable) = watch::channel(start.next);
        // Offsets above a claim already done (by lanes before a restart) stay done in it.
        let done_at_start = start.done.clone();
        let stop = CancellationToken::new();
        let stopping = stop.clone();
        let task = tokio::spawn(
            async move {
                loop {
                    tokio::select! {
                        _ = stopping.cancelled() => return,
                        r = wanted_rx.changed() => if r.is_err() { return },
                    }
                    let mut backoff = Backoff::new();
                    loop {
                        let end = *wanted_rx.borrow_and_update();
                        if end <= *durable_tx.borrow() {
                            break;
                        }
                        let done = done_at_start
                            .iter()
                            .filter(|&&(_, e)| e > end)
                            .map(|&(s, e)| (s.max(end), e))
                            .collect();
                        let position = Position { next: end, done };
                        match positions.write(&id, &position).await {
                            Ok(()) => {
                                durable_tx.send_replace(end);
                            }
                            Err(e) => {
                                // Nothing is sent past the last claim meanwhile.
                                let wait = backoff.failed();
                                if backoff.worth_logging() {
                                    tracing::error!(error = %e, retry_in_s = wait.as_secs(), "cannot persist the position before sending; delivery waits");
                                }
                                tokio::select! {
                                    _ = stopping.cancelled() => return,
                                    _ = tokio::time::sleep(wait) => {}
                                }
                            }
                        }
                    }
                }
            }
            .in_current_span(),
        );
        Self {
            wanted,
            durable,
            stop,
            task,
        }
    }

    /// Waits until everything below `needed` is durably claimed, asking for a claim up to
    /// [`CLAIM_AHEAD`] further but never past `limit` (what has been read). `None` when the
    /// writer stopped.
    pub(super) async fn cover(&self, needed: u64, limit: u64) -> Option<()> {
        self.wanted.send_if_modified(|w| {
            if needed + CLAIM_AHEAD / 2 <= *w {
                return false;
            }
            let target = (needed + CLAIM_AHEAD).min(limit).max(needed);
            let raise = target > *w;
            if raise {
                *w = target;
            }
            raise
        });
        let mut durable = self.durable.clone();
        durable.wait_for(|&d| d >= needed).await.ok().map(|_| ())
    }

    /// Stops the writer, after the claim in progress (so that the true position written next is
    /// the last write).
    pub(super) async fn finish(self) {
        self.stop.cancel();
        drop(self.wanted);
        let _ = self.task.await;
    }
}
