//! A dead-letter redrive in a cluster (docs/cluster.md, "Delivery in a cluster"): the cluster's
//! metadata records it, and every broker runs its part — a worker per dead-letter partition that
//! delivers while this broker leads the partition, from the replicated position — so that a new
//! leader continues it where the last one stopped.

use mmmq_core::{ConsumerId, Topic};

use super::Dispatch;
use super::redrive::{PlannedPart, RedrivePlan, RedriveRun};

/// A redrive as a cluster's metadata records it (docs/cluster.md, "Delivery in a cluster"):
/// every broker runs it, the dead-letter partitions' leaders deliver it.
#[derive(Debug, Clone)]
pub struct ClusterRedrive {
    /// Its number in the metadata.
    pub run: u64,
    /// When it was asked for.
    pub started_at: u64,
    /// The name of its replicated position.
    pub position: String,
    /// Its ranges.
    pub parts: Vec<PlannedPart>,
}

impl Dispatch {
    /// Runs this broker's part of a cluster's redrive of `consumer_id`, unless it runs it
    /// already: a worker per dead-letter partition that delivers while this broker leads the
    /// partition, from the replicated position, in every term until the range's end. A redrive
    /// this broker ran before is stopped. `false` when it cannot start yet (the dead-letter
    /// topic is not open here yet); `true` when it runs, or the dispatcher does not run here.
    pub async fn follow_redrive(&self, consumer_id: &str, redrive: &ClusterRedrive) -> bool {
        let Ok(id) = ConsumerId::new(consumer_id) else {
            return true;
        };
        let Ok(position) = ConsumerId::new(&redrive.position) else {
            tracing::error!(consumer_id, position = %redrive.position, "a redrive's position is not a valid name");
            return true;
        };
        let dlq = Topic::dead_letter(&id);
        let partitions = self.partitions_of(&dlq);
        if redrive
            .parts
            .iter()
            .any(|part| !partitions.iter().any(|p| p.number == part.partition))
        {
            return false;
        }
        let plan = RedrivePlan {
            topic: dlq,
            continues: true,
            parts: redrive.parts.clone(),
        };
        let replaced = {
            let mut running = self.running.lock();
            if self.shutdown.is_cancelled() {
                return true;
            }
            let Some(r) = running.get_mut(&id) else {
                return true;
            };
            if r.redrive.as_ref().and_then(RedriveRun::run) == Some(redrive.run) {
                return true;
            }
            let run = self.start_run(
                r,
                &plan,
                Some(position),
                Some(redrive.run),
                redrive.started_at,
            );
            tracing::info!(
                consumer_id,
                run = redrive.run,
                "following the cluster's redrive"
            );
            r.redrive.replace(run)
        };
        if let Some(old) = replaced {
            old.stop().await;
        }
        true
    }
}
