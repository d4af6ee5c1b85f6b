//! A dead-letter redrive in a cluster (docs/cluster.md, "Delivery in a cluster"): the cluster's
//! metadata records it, and every broker runs its part — a worker per dead-letter partition that
//! delivers while this broker leads the partition, from the replicated position — so that a new
//! leader continues it where the last one stopped.

use std::collections::BTreeMap;

use mmmq_core::{ConsumerId, Topic};

use super::redrive::{PlannedPart, RedrivePlan, RedriveRun};
use super::{Dispatch, Running};

/// A redrive as a cluster's metadata records it (docs/cluster.md, "Delivery in a cluster"):
/// every broker runs it, the dead-letter partitions' leaders deliver it.
#[derive(Debug, Clone)]
pub struct ClusterRedrive {
    /// Its number in the metadata.
    pub run: u64,
    /// The dead-letter topic's id (the incarnation it redrives).
    pub topic_id: String,
    /// When it was asked for.
    pub started_at: u64,
    /// The name of its replicated position.
    pub position: String,
    /// Its ranges.
    pub parts: Vec<PlannedPart>,
}

impl Dispatch {
    /// Runs this broker's part of every redrive of a cluster's metadata (`redrives`, by
    /// consumerId, the runs it knows of numbered up to `known`); a run of this broker whose
    /// record the metadata knows of and no longer has (its dead-letter topic was deleted) stops.
    /// `false` when one cannot start yet, to be tried again.
    pub async fn follow_redrives(
        &self,
        redrives: &BTreeMap<String, ClusterRedrive>,
        known: u64,
    ) -> bool {
        let gone: Vec<RedriveRun> = {
            let mut running = self.running.lock();
            running
                .iter_mut()
                .filter_map(|(id, r)| {
                    let run = r.redrive.as_ref()?.run()?;
                    let kept = redrives.get(id.as_str()).is_some_and(|c| c.run >= run);
                    if kept || run > known {
                        return None;
                    }
                    r.redrive.take()
                })
                .collect()
        };
        for run in gone {
            tokio::spawn(run.stop());
        }
        let mut all = true;
        for (consumer, redrive) in redrives {
            all &= self.follow_redrive(consumer, redrive);
        }
        all
    }

    /// Runs this broker's part of a cluster's redrive of `consumer_id`, unless it runs it or a
    /// newer one already: a worker per dead-letter partition that delivers while this broker
    /// leads the partition, from the replicated position, in every term until the range's end.
    /// A redrive this broker ran before is stopped. `false` when it cannot start yet (the
    /// dead-letter topic is not open here yet, or is still another incarnation); `true` when it
    /// runs, or the dispatcher does not run here.
    pub fn follow_redrive(&self, consumer_id: &str, redrive: &ClusterRedrive) -> bool {
        let Ok(id) = ConsumerId::new(consumer_id) else {
            return true;
        };
        let Ok(position) = ConsumerId::new(&redrive.position) else {
            tracing::error!(consumer_id, position = %redrive.position, "a redrive's position is not a valid name");
            return true;
        };
        // Called at every change of the metadata: a run this broker runs already (or an older
        // one) costs a look under the lock and nothing more.
        if self.follows(&id, redrive.run) != Some(true) {
            return true;
        }
        let dlq = Topic::dead_letter(&id);
        let Some(topic) = self.registry.get(&dlq) else {
            return false;
        };
        let partitions = topic.partitions();
        let here = topic.id.to_string() == redrive.topic_id
            && redrive
                .parts
                .iter()
                .all(|part| partitions.iter().any(|p| p.number == part.partition));
        if !here {
            return false;
        }
        let plan = RedrivePlan {
            topic: dlq,
            continues: true,
            parts: redrive.parts.clone(),
        };
        let mut running = self.running.lock();
        if self.shutdown.is_cancelled() {
            return true;
        }
        let Some(r) = running.get_mut(&id) else {
            return true;
        };
        {
            let mut followed = self.followed.lock();
            let newest = followed.entry(id.clone()).or_default();
            if !wanted(r, *newest, redrive.run) {
                return true;
            }
            *newest = redrive.run;
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
        // The run it replaces is done (the metadata starts a redrive only then): its workers
        // at most wait for their partition's leadership, and stop when it is dropped.
        r.redrive = Some(run);
        true
    }

    /// Whether run `run` of `id` is to be started here: `None` when the dispatcher does not
    /// run here.
    fn follows(&self, id: &ConsumerId, run: u64) -> Option<bool> {
        let running = self.running.lock();
        let r = running.get(id)?;
        let newest = self.followed.lock().get(id).copied().unwrap_or(0);
        Some(wanted(r, newest, run))
    }
}

/// Whether `run` is newer than what `r` runs and than the newest followed.
fn wanted(r: &Running, newest: u64, run: u64) -> bool {
    newest <= run && r.redrive.as_ref().and_then(RedriveRun::run) != Some(run)
}
