//! Persisting a worker's position in the background, at most one write per checkpoint interval
//! while positions keep coming.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::claims::Claimer;
use super::positions::Positions;
use super::target::BoxFuture;
use crate::config::{DeliveryMode, DispatcherSpec};
use crate::storage::Position;
use mmmq_core::ConsumerId;

/// How long a failed checkpoint write waits before it is retried when no newer position comes.
const CHECKPOINT_RETRY: Duration = Duration::from_secs(1);

/// How long a stop waits for the target's work to be durable before it gives up on writing the
/// final position (the last one written stays: a restart redelivers from there, as after a
/// crash).
const FINAL_SETTLE: Duration = Duration::from_secs(10);

/// Resolves once what the target did for the messages ACKed so far is durable
/// ([`super::Target::settled`]): a position is written only after it, and not at all when it
/// resolves `false` (the target gave up at a stop).
pub(super) type Fence = Arc<dyn Fn() -> BoxFuture<'static, bool> + Send + Sync>;

/// Persists the newest ACKed position in the background, at most one write per checkpoint interval
/// while positions keep coming.
///
/// A checkpoint write is two fsyncs (temporary file, then its directory after the rename), as
/// costly as a commit of the log itself; writing one per delivery round made a consumer that keeps
/// up with its producers double the broker's disk syncs. Batched (50 ms by default), a busy
/// (dispatcher, topic) costs at most 20 checkpoint writes a second, and a crash redelivers at most
/// what was ACKed in the last interval plus one write (at-least-once; a clean stop writes the
/// final position at once). An interval of 0 writes after every delivery round again.
///
/// At-most-once (`delivery`, docs/delivery.md, "Delivery modes") turns this around: the positions set while
/// delivering are only kept in memory, and what reaches the disk while running is a *claim*
/// ([`CheckpointSaver::claim`], [`super::claims`]): a position past messages not sent yet, written
/// and synced before any of them is sent. A crash then resumes after the claim (what was claimed and not sent is
/// lost, nothing is sent twice); a clean stop writes the true position, so it loses nothing.
pub(super) struct CheckpointSaver {
    tx: watch::Sender<Position>,
    /// Ends the wait between writes at a stop. (Waiting for the watch to close instead would wake
    /// the task on every position set, one cross-thread wake-up per ACK.)
    stop: CancellationToken,
    /// The background writer (at-least-once) or nothing (at-most-once: claims are written by
    /// the caller, the true position at [`CheckpointSaver::finish`]).
    task: Option<tokio::task::JoinHandle<()>>,
    claims: Option<Claims>,
}

/// At-most-once: the claim writer, and where the true position goes at the end.
struct Claims {
    positions: Positions,
    id: ConsumerId,
    claimer: Claimer,
    fence: Fence,
}

impl CheckpointSaver {
    /// Chooses the way of saving from the dispatcher's `delivery`; positions are stored under
    /// `id` in the partition's checkpoints, or kept in memory only when `id` is `None` (a
    /// redrive of an explicit range on one broker, which nothing resumes).
    pub(super) fn new(
        positions: Positions,
        spec: Arc<DispatcherSpec>,
        id: Option<ConsumerId>,
        start: Position,
        fence: Fence,
    ) -> Self {
        let Some(id) = id else {
            return Self {
                tx: watch::Sender::new(start),
                stop: CancellationToken::new(),
                task: None,
                claims: None,
            };
        };
        match spec.delivery {
            DeliveryMode::AtLeastOnce => Self::spawn(positions, spec, id, start, fence),
            DeliveryMode::AtMostOnce => Self {
                claims: Some(Claims {
                    claimer: Claimer::spawn(positions.clone(), id.clone(), &start),
                    positions,
                    id,
                    fence,
                }),
                tx: watch::Sender::new(start),
                stop: CancellationToken::new(),
                task: None,
            },
        }
    }

    /// At-most-once: waits until everything below `needed` is durably claimed (claims run
    /// ahead in the background, never past `limit`, what has been read). A no-op for
    /// at-least-once. `None` when the claim writer has stopped.
    pub(super) async fn claim(&self, needed: u64, limit: u64) -> Option<()> {
        match &self.claims {
            Some(c) => c.claimer.cover(needed, limit).await,
            None => Some(()),
        }
    }

    fn spawn(
        positions: Positions,
        spec: Arc<DispatcherSpec>,
        id: ConsumerId,
        start: Position,
        fence: Fence,
    ) -> Self {
        let (tx, mut rx) = watch::channel(start);
        let stop = CancellationToken::new();
        let stopping = stop.clone();
        let task = tokio::spawn(
            async move {
                let mut written = None;
                let mut failed = false;
                loop {
                    // After a failure the write is retried on its own, so that a consumer that
                    // has gone quiet still gets its position persisted once the disk recovers.
                    let mut closed = if failed {
                        tokio::select! {
                            r = rx.changed() => r.is_err(),
                            _ = tokio::time::sleep(CHECKPOINT_RETRY) => false,
                        }
                    } else {
                        rx.changed().await.is_err()
                    };
                    loop {
                        let value = rx.borrow_and_update().clone();
                        if written.as_ref() == Some(&value) {
                            break;
                        }
                        // Nothing past what the target has made durable (a plugin's emits). The
                        // wait ends at a stop: the target then stops retrying, and answers.
                        // One fence for this position: a later one would also wait for runs
                        // handed over after it.
                        let settling = fence();
                        tokio::pin!(settling);
                        let settled = if closed {
                            tokio::time::timeout(FINAL_SETTLE, settling)
                                .await
                                .unwrap_or(false)
                        } else {
                            tokio::select! {
                                settled = &mut settling => settled,
                                _ = stopping.cancelled() => {
                                    closed = true;
                                    tokio::time::timeout(FINAL_SETTLE, settling)
                                        .await
                                        .unwrap_or(false)
                                }
                            }
                        };
                        if !settled {
                            if closed {
                                tracing::error!("the target's work is not durable; the final position is not written (a restart redelivers from the last one)");
                                return;
                            }
                            break;
                        }
                        let started = tokio::time::Instant::now();
                        let r = positions.write(&id, &value).await;
                        failed = r.is_err();
                        match r {
                            Ok(()) => written = Some(value),
                            Err(e) => {
                                tracing::error!(error = %e, "checkpoint write failed; retrying")
                            }
                        }
                        if failed || closed {
                            break;
                        }
                        // Let positions accumulate until an interval after this write
                        // started (not after it ended: a write that takes long, a cluster's
                        // metadata commit on busy cores, would add its time to what a crash
                        // redelivers); a stop ends the wait so that the final position is
                        // written at once.
                        if !spec.checkpoint_interval.is_zero() {
                            tokio::select! {
                                _ = tokio::time::sleep_until(started + spec.checkpoint_interval) => {}
                                _ = stopping.cancelled() => closed = true,
                            }
                        }
                    }
                    if closed {
                        return;
                    }
                }
            }
            .in_current_span(),
        );
        Self {
            tx,
            stop,
            task: Some(task),
            claims: None,
        }
    }

    /// Everything below `next` is done.
    pub(super) fn set(&self, next: u64) {
        self.tx.send_replace(Position::at(next));
    }

    /// A position with done ranges above its low watermark (parallel lanes).
    pub(super) fn set_position(&self, position: Position) {
        self.tx.send_replace(position);
    }

    /// Waits for the final position to be on disk.
    pub(super) async fn finish(self) {
        self.stop.cancel();
        if let Some(task) = self.task {
            drop(self.tx);
            let _ = task.await;
            return;
        }
        let Some(c) = self.claims else { return };
        c.claimer.finish().await;
        if !tokio::time::timeout(FINAL_SETTLE, (c.fence)())
            .await
            .unwrap_or(false)
        {
            tracing::error!(
                "the target's work is not durable; the final position is not written (the last claim stays)"
            );
            return;
        }
        // At-most-once: the true position (every message sent or dropped), below the claim.
        let position = self.tx.borrow().clone();
        let written = c.positions.write(&c.id, &position).await;
        if let Err(e) = written {
            // The claim on disk stays: messages claimed and not sent are skipped, none repeated.
            tracing::error!(error = %e, "cannot write the final position; the last claim stays");
        }
    }
}
