//! Emits committed behind the calls (docs/benchmarks.md, "Router"): a run's outputs are handed to
//! one commit task per source partition and the run answers at once, so the plugin handles the
//! next run while the disk takes this one's outputs.
//!
//! What keeps this exactly once and in order:
//! - Commits of one source partition run one after the other, in the order the runs answered, so
//!   a key's outputs keep their order.
//! - The dispatcher's checkpoint is written only once every commit handed over before it is
//!   durable (`Pipeline::settled`, awaited by the checkpoint writer). A crash before that
//!   re-runs the messages from the durable checkpoint, and the outputs that did reach the disk
//!   are found by their origin and not appended again (`emit::source`).
//! - A commit the disk refuses is tried again, with backoff, until it is stored: the calls are
//!   not made again (the plugin's state saw each message once), and the checkpoint waits.
//! - At most [`DEPTH`] runs' outputs wait, so a slow disk slows the calls instead of filling
//!   memory.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::source::Source;
use super::{ConsumerEmits, Outputs};

/// Runs whose outputs may be handed over and not yet stored.
pub const DEPTH: u64 = 2;

/// The longest wait between two tries of a refused commit.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Runs handed over and runs whose outputs are stored, since the pipeline started.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    submitted: u64,
    stored: u64,
}

/// The commit task of one source partition.
pub(super) struct Pipeline {
    runs: mpsc::UnboundedSender<Vec<Outputs>>,
    counts: watch::Sender<Counts>,
}

impl Pipeline {
    /// Starts the commit task of `source`.
    pub(super) fn start(emits: &ConsumerEmits, source: Arc<Source>) -> Self {
        let (runs, mut inbox) = mpsc::unbounded_channel::<Vec<Outputs>>();
        let counts = watch::Sender::new(Counts::default());
        let progress = counts.clone();
        let (emitter, consumer_id) = (emits.emitter.clone(), emits.consumer_id.clone());
        let failing = emits.failing.clone();
        tokio::spawn(async move {
            while let Some(outputs) = inbox.recv().await {
                let mut backoff = Duration::from_millis(10);
                loop {
                    match source.commit(outputs.clone()).await {
                        Ok(appended) => {
                            super::count_emitted(&emitter, &consumer_id, appended);
                            failing.lock().take();
                            break;
                        }
                        // The source topic was deleted: nothing of it is delivered any more.
                        Err(_) if !source.exists() => break,
                        Err(e) => {
                            *failing.lock() = Some(e.to_string());
                            tracing::warn!(consumer_id = %consumer_id, error = %e, retry_in_ms = backoff.as_millis() as u64, "a plugin's emits were not stored; trying again (the checkpoint waits)");
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(MAX_BACKOFF);
                        }
                    }
                }
                progress.send_modify(|c| c.stored += 1);
            }
        });
        Self { runs, counts }
    }

    /// Hands over a run's outputs, once fewer than [`DEPTH`] runs wait.
    pub(super) async fn submit(&self, outputs: Vec<Outputs>) {
        let mut counts = self.counts.subscribe();
        // The sender lives in `self`: the wait ends by the condition, never by a close.
        let _ = counts.wait_for(|c| c.submitted - c.stored < DEPTH).await;
        self.counts.send_modify(|c| c.submitted += 1);
        // The task ends only with the pipeline.
        let _ = self.runs.send(outputs);
    }

    /// Resolves once everything handed over so far is stored.
    pub(super) async fn settled(&self) {
        let mut counts = self.counts.subscribe();
        let target = counts.borrow().submitted;
        let _ = counts.wait_for(|c| c.stored >= target).await;
    }
}
