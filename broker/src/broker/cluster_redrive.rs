//! Dead-letter redrive on a cluster member (docs/cluster.md, "Delivery in a cluster"): a redrive
//! is a metadata record (`cluster/meta_redrive.rs`), so that it survives a change of its
//! dead-letter partition's leader. The broker asked (the leader of the dead-letter topic's
//! partition 0, where the request is forwarded) decides the range from its log and proposes it;
//! every broker runs the newest record (`follow`), and each partition's leader delivers it from
//! the replicated position.

use std::time::Duration;

use mmmq_core::{RedriveStatus, now_ms};

use super::Broker;
use crate::cluster::meta_state::{
    MetaCommand, MetaOutcome, MetaState, RedriveAsked, RedriveMeta, RedrivePart,
};
use crate::cluster::node::{Cluster, ClusterError};
use crate::dispatch::redrive::{PlannedPart, RedriveError};
use crate::dispatch::{ClusterRedrive, Dispatch};

/// How long a redrive waits for this broker to apply the record the metadata committed.
const APPLY_WAIT: Duration = super::cluster_config::APPLY_WAIT;

impl Broker {
    /// `POST /mmmq/dispatchers/{consumerId}/redrive` on a cluster member: the range decided
    /// here, recorded in the metadata (refused while the last redrive runs), and started here
    /// once this broker applied it; answered with its status.
    pub(super) async fn redrive_clustered(
        &self,
        cluster: &Cluster,
        consumer_id: &str,
        from: Option<u64>,
        to: Option<u64>,
    ) -> Result<RedriveStatus, RedriveError> {
        let plan = self.dispatch.redrive_plan(consumer_id, from, to).await?;
        let metadata = cluster.metadata();
        if plan.parts.is_empty() {
            // No dead-letter topic yet: nothing to record, a redrive that is done at once.
            return self.dispatch.redrive(consumer_id, from, to).await;
        }
        let Some(topic_id) = metadata
            .topics
            .get(plan.topic.as_str())
            .map(|t| t.id.clone())
        else {
            return Err(RedriveError::Refused(format!(
                "topic {} is not in the cluster (any more)",
                plan.topic
            )));
        };
        if metadata.redrive_running(consumer_id) {
            return Err(RedriveError::AlreadyRunning(consumer_id.to_owned()));
        }
        let started_at = now_ms();
        let start = MetaCommand::StartRedrive {
            consumer: consumer_id.to_owned(),
            continues: plan.continues,
            redrive: RedriveAsked {
                topic: plan.topic.to_string(),
                topic_id: topic_id.clone(),
                started_at,
                parts: plan
                    .parts
                    .iter()
                    .map(|p| RedrivePart {
                        partition: p.partition,
                        from: p.from,
                        to: p.to,
                    })
                    .collect(),
            },
        };
        let after = metadata.redrive_runs;
        match cluster.propose(start).await {
            Ok(MetaOutcome::Done) => {}
            Ok(MetaOutcome::Refused(why)) | Err(ClusterError::Refused(why)) => {
                return Err(RedriveError::Refused(why));
            }
            Ok(other) => unreachable!("StartRedrive answers Done or Refused, not {other:?}"),
            Err(e) => return Err(RedriveError::Unavailable(e.to_string())),
        }
        // The record, once this broker applied it: the first run past `after` with this start.
        let ours = |m: &MetaState| {
            m.redrive(consumer_id)
                .filter(|r| {
                    r.run > after
                        && r.asked.started_at == started_at
                        && r.asked.topic_id == topic_id
                })
                .map(cluster_redrive)
        };
        let mut watch = cluster.watch_metadata();
        let applied = tokio::time::timeout(APPLY_WAIT, watch.wait_for(|m| ours(m).is_some()))
            .await
            .ok()
            .and_then(Result::ok)
            .and_then(|m| ours(&m));
        let Some(redrive) = applied else {
            return Err(RedriveError::Unavailable(format!(
                "the redrive was recorded, but this broker did not apply it within {} s; it runs once the brokers apply it",
                APPLY_WAIT.as_secs()
            )));
        };
        self.dispatch.follow_redrive(consumer_id, &redrive);
        self.dispatch
            .redrive_status(consumer_id)
            .ok_or_else(|| RedriveError::UnknownDispatcher(consumer_id.to_owned()))
    }
}

/// Runs this broker's part of every redrive in the metadata (read now, not the follow loop's
/// snapshot, which may be seconds old): `false` if one could not start yet (its dead-letter
/// topic is not open here yet), to be tried again.
pub(super) async fn follow(dispatch: &Dispatch, cluster: &Cluster) -> bool {
    let state = cluster.metadata();
    let redrives = state
        .redrives
        .keys()
        .filter_map(|consumer| Some((consumer.clone(), cluster_redrive(state.redrive(consumer)?))))
        .collect();
    dispatch
        .follow_redrives(&redrives, state.redrive_runs)
        .await
}

fn cluster_redrive(r: &RedriveMeta) -> ClusterRedrive {
    ClusterRedrive {
        run: r.run,
        topic_id: r.asked.topic_id.clone(),
        started_at: r.asked.started_at,
        position: r.position.clone(),
        parts: r
            .asked
            .parts
            .iter()
            .map(|p| PlannedPart {
                partition: p.partition,
                from: p.from,
                to: p.to,
            })
            .collect(),
    }
}
