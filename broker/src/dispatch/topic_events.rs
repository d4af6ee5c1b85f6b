//! What the dispatchers owe the topics: a deleted topic's workers stopped and its state
//! dropped, and the positions `keepUndelivered` retention must not pass (docs/topics-and-groups.md, "Topics").

use std::sync::Arc;

use mmmq_core::{ConsumerId, Topic};

use super::{Dispatch, Target, WorkerHandle, redrive};
use crate::topics::Partition;

impl Dispatch {
    /// Stops every worker of `topic` (a topic being deleted) and waits for them: their final
    /// checkpoints are written before this returns, so nothing writes into the topic's directory
    /// afterwards. A topic created again under the name gets new workers.
    pub async fn forget_topic(&self, topic: &Topic) {
        let (handles, redrives, targets): (
            Vec<WorkerHandle>,
            Vec<redrive::RedriveRun>,
            Vec<Arc<dyn Target>>,
        ) = {
            let mut running = self.running.lock();
            let mut handles = Vec::new();
            let mut redrives = Vec::new();
            let targets = running.values().map(|r| r.target.clone()).collect();
            for r in running.values_mut() {
                if *topic == Topic::dead_letter(&r.spec.consumer_id)
                    && let Some(run) = r.redrive.take()
                {
                    redrives.push(run);
                }
                let keys: Vec<(Topic, u32)> = r
                    .workers
                    .keys()
                    .filter(|(t, _)| t == topic)
                    .cloned()
                    .collect();
                handles.extend(keys.iter().filter_map(|k| r.workers.remove(k)));
            }
            (handles, redrives, targets)
        };
        for run in redrives {
            run.stop().await;
        }
        for w in handles {
            w.cancel.cancel();
            let _ = w.join.await;
        }
        for t in targets {
            t.forget_topic(topic);
        }
    }

    /// The positions `keepUndelivered` protects in `partition` of `topic` (docs/topics-and-groups.md,
    /// "Retention"): every configured dispatcher whose pattern matches — running, being replaced
    /// by a reload, or with its worker down — at its durable checkpoint (0 when it has none
    /// yet; a checkpoint that cannot be read holds everything too).
    pub async fn protected_positions(&self, topic: &Topic, partition: &Arc<Partition>) -> Vec<u64> {
        let ids: Vec<ConsumerId> = self
            .configured
            .lock()
            .iter()
            .filter(|(_, patterns)| patterns.iter().any(|p| p.matches(topic)))
            .map(|(id, _)| id.clone())
            .collect();
        if ids.is_empty() {
            return Vec::new();
        }
        // A clustered partition's positions are the cluster's (docs/cluster.md, "Delivery in a
        // cluster"); its checkpoint files are not written.
        if partition.log.clustered() {
            let control = partition.delivery.current();
            return ids
                .iter()
                .map(|id| {
                    control
                        .as_ref()
                        .and_then(|c| c.stored_next(id.as_str()))
                        .unwrap_or(0)
                })
                .collect();
        }
        let p = partition.clone();
        tokio::task::spawn_blocking(move || {
            ids.iter()
                .map(|id| p.checkpoints.read(id).ok().flatten().unwrap_or(0))
                .collect()
        })
        .await
        .expect("checkpoint read task panicked")
    }
}
