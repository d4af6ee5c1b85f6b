//! Persisting a worker's position in the background, at most one write per checkpoint interval
//! while positions keep coming.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::DispatcherSpec;
use crate::storage::Position;
use crate::topics::Partition;

/// How long a failed checkpoint write waits before it is retried when no newer position comes.
const CHECKPOINT_RETRY: Duration = Duration::from_secs(1);

/// Persists the newest ACKed position in the background, at most one write per checkpoint interval
/// while positions keep coming.
///
/// A checkpoint write is two fsyncs (temporary file, then its directory after the rename), as
/// costly as a commit of the log itself; writing one per delivery round made a consumer that keeps
/// up with its producers double the broker's disk syncs. Batched (50 ms by default), a busy
/// (dispatcher, topic) costs at most 20 checkpoint writes a second, and a crash redelivers at most
/// what was ACKed in the last interval plus one write (at-least-once; a clean stop writes the
/// final position at once). An interval of 0 writes after every delivery round again.
pub(super) struct CheckpointSaver {
    tx: watch::Sender<Position>,
    /// Ends the wait between writes at a stop. (Waiting for the watch to close instead would wake
    /// the task on every position set, one cross-thread wake-up per ACK.)
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl CheckpointSaver {
    pub(super) fn spawn(topic: Arc<Partition>, spec: Arc<DispatcherSpec>, start: Position) -> Self {
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
                        let topic = topic.clone();
                        let id = spec.consumer_id.clone();
                        let stored = value.clone();
                        let r = tokio::task::spawn_blocking(move || {
                            topic.checkpoints.write_position(&id, &stored)
                        })
                        .await
                        .expect("checkpoint write panicked");
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
                        // Let positions accumulate; a stop ends the wait so that the final
                        // position is written at once.
                        if !spec.checkpoint_interval.is_zero() {
                            tokio::select! {
                                _ = tokio::time::sleep(spec.checkpoint_interval) => {}
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
        Self { tx, stop, task }
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
        drop(self.tx);
        let _ = self.task.await;
    }
}
