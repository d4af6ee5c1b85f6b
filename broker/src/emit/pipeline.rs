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
//! - A stop of the dispatcher (a shutdown, a reload that replaces it) ends the retries: what the
//!   disk takes is still stored (a healthy disk loses nothing at a stop), but the first refusal
//!   after the stop ends the pipeline, and everything not stored is given up — the checkpoint
//!   stays before those messages, so they run again after the restart and their emits are
//!   stored then, once (`emit::source`). A stop therefore never waits on a full disk, and the
//!   pipeline has ended or is idle before a new target of the same dispatcher starts, so the two
//!   never append the same emits.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::source::Source;
use super::{ConsumerEmits, Outputs};

/// Runs whose outputs may be handed over and not yet stored.
pub const DEPTH: u64 = 2;

/// The longest wait between two tries of a refused commit.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Runs handed over and runs whose outputs are stored, since the pipeline started, and whether
/// it has ended (after a stop: nothing more is stored).
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    submitted: u64,
    stored: u64,
    ended: bool,
}

/// The pipeline has ended (its dispatcher is stopping): the run's outputs were not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended;

/// Marks the pipeline ended when its task ends, whichever way.
struct EndOnDrop(watch::Sender<Counts>);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.send_modify(|c| c.ended = true);
    }
}

/// The commit task of one source partition.
pub(super) struct Pipeline {
    runs: mpsc::UnboundedSender<Vec<Outputs>>,
    counts: watch::Sender<Counts>,
}

impl Pipeline {
    /// Starts the commit task of `source`; `stop` is the dispatcher's stop.
    pub(super) fn start(
        emits: &ConsumerEmits,
        source: Arc<Source>,
        stop: CancellationToken,
    ) -> Self {
        let (runs, mut inbox) = mpsc::unbounded_channel::<Vec<Outputs>>();
        let counts = watch::Sender::new(Counts::default());
        let progress = counts.clone();
        let (emitter, consumer_id) = (emits.emitter.clone(), emits.consumer_id.clone());
        let failing = emits.failing.clone();
        tokio::spawn(async move {
            // Ends the pipeline however the task ends (a panic included), so that nothing
            // waits for it forever.
            let _ended = EndOnDrop(progress.clone());
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
                        Err(e) if stop.is_cancelled() => {
                            tracing::warn!(consumer_id = %consumer_id, error = %e, "a plugin's emits were not stored and the dispatcher is stopping: their messages run again after the restart");
                            return;
                        }
                        Err(e) => {
                            *failing.lock() = Some(e.to_string());
                            tracing::warn!(consumer_id = %consumer_id, error = %e, retry_in_ms = backoff.as_millis() as u64, "a plugin's emits were not stored; trying again (the checkpoint waits)");
                            tokio::select! {
                                _ = tokio::time::sleep(backoff) => {}
                                _ = stop.cancelled() => {}
                            }
                            backoff = (backoff * 2).min(MAX_BACKOFF);
                        }
                    }
                }
                progress.send_modify(|c| c.stored += 1);
            }
        });
        Self { runs, counts }
    }

    /// Hands over a run's outputs, once fewer than [`DEPTH`] runs wait; [`Ended`] if the
    /// pipeline ended meanwhile (its dispatcher is stopping).
    pub(super) async fn submit(&self, outputs: Vec<Outputs>) -> Result<(), Ended> {
        let mut counts = self.counts.subscribe();
        // The sender lives in `self`: the wait ends by the condition, never by a close.
        let _ = counts
            .wait_for(|c| c.ended || c.submitted - c.stored < DEPTH)
            .await;
        let mut taken = false;
        self.counts.send_if_modified(|c| {
            taken = !c.ended;
            c.submitted += u64::from(taken);
            taken
        });
        if !taken {
            return Err(Ended);
        }
        // The task takes everything counted before it ends.
        let _ = self.runs.send(outputs);
        Ok(())
    }

    /// Resolves once everything handed over so far is stored (`true`), or the pipeline ended
    /// with some of it not stored (`false`).
    pub(super) async fn settled(&self) -> bool {
        let mut counts = self.counts.subscribe();
        let target = counts.borrow().submitted;
        match counts.wait_for(|c| c.ended || c.stored >= target).await {
            Ok(c) => c.stored >= target,
            Err(_) => false,
        }
    }

    /// Resolves once the pipeline has ended or has nothing left to store.
    pub(super) async fn idle(&self) {
        let mut counts = self.counts.subscribe();
        let _ = counts
            .wait_for(|c| c.ended || c.stored >= c.submitted)
            .await;
    }
}
