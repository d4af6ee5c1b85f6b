//! The topic API (docs/topics-and-groups.md, "Topics"): create or configure, show and delete a topic, and the
//! retention task. Here because it composes the registry with the dispatchers: a deleted topic's
//! workers stop before its files go, and `keepUndelivered` asks the dispatchers where they are.

use std::sync::Arc;
use std::time::Duration;

use mmmq_core::{PartitionInfo, Topic, TopicDetail, now_ms};
use tokio_util::sync::CancellationToken;

use super::{Broker, BrokerError};
use crate::dispatch::Dispatch;
use crate::metrics::{Metrics, TopicLabel};
use crate::topics::settings::TopicUpdate;
use crate::topics::{Registry, TopicLog, retention};

impl Broker {
    fn topic_name(name: &str) -> Result<Topic, BrokerError> {
        Topic::new(name).map_err(|e| BrokerError::InvalidName(e.to_string()))
    }

    fn detail(&self, t: &TopicLog) -> TopicDetail {
        TopicDetail {
            name: t.topic.to_string(),
            topic_id: Some(t.id),
            config: self.registry.config_of(t),
            partitions: t
                .partitions()
                .iter()
                .map(|p| {
                    let s = p.log.stats();
                    PartitionInfo {
                        partition: p.number,
                        first_offset: p.log.first_offset(),
                        next_offset: s.next_offset,
                        segments: s.segments as u64,
                        bytes: s.bytes,
                    }
                })
                .collect(),
        }
    }

    /// `GET /mmmq/topics/{topic}`.
    pub fn topic(&self, name: &str) -> Result<TopicDetail, BrokerError> {
        let topic = Self::topic_name(name)?;
        let t = self
            .registry
            .get(&topic)
            .ok_or_else(|| BrokerError::UnknownTopic(topic.to_string()))?;
        Ok(self.detail(&t))
    }

    /// `topic`, created with the broker's defaults if it does not exist, as a first produce
    /// creates it (through the metadata in a cluster): Kafka's automatic topic creation.
    pub async fn topic_or_create(&self, topic: &Topic) -> Result<Arc<TopicLog>, BrokerError> {
        match self.cluster() {
            Some(cluster) => {
                let defaults = &self.config.topic_defaults;
                super::cluster_api::ensure_topic(cluster, &self.registry, defaults, topic).await
            }
            None => Ok(self.registry.get_or_create(topic).await?),
        }
    }

    /// `PUT /mmmq/topics/{topic}`: creates the topic, or changes the fields `body` names. The
    /// body is checked whole before anything is created or stored.
    pub async fn put_topic(&self, name: &str, body: &[u8]) -> Result<TopicDetail, BrokerError> {
        let topic = Self::topic_name(name)?;
        let update = TopicUpdate::parse(body)?;
        if let Some(cluster) = self.cluster() {
            let t = self.put_clustered_topic(cluster, &topic, &update).await?;
            return Ok(self.detail(&t));
        }
        if update.replication_factor().is_some_and(|rf| rf > 1) {
            return Err(crate::topics::settings::SettingsError::Invalid {
                field: "replicationFactor",
                reason: "a single broker holds one replica of each partition".into(),
            }
            .into());
        }
        let (registry, defaults) = (self.registry.clone(), self.config.topic_defaults.clone());
        // In a task of its own, to its end: a request dropped half-way would release the
        // topic's lock while its partitions are still being opened.
        let t = tokio::spawn(async move {
            // One administration of a topic at a time: the current configuration read here is
            // still the current one when the next is stored.
            let _admin = registry.administer(&topic).await;
            let next = match registry.get(&topic) {
                Some(t) => update.apply(&registry.config_of(&t))?,
                None => update.create(&defaults)?,
            };
            // A new topic is made with its partitions at once: refused whole at a cap.
            let t = registry
                .get_or_create_by_api(&topic, next.partitions)
                .await?;
            // A produce may have made the topic meanwhile (it takes no administration lock),
            // with the default partitions: the update applies to what it made, which may not
            // shrink.
            let next = if t.partition_count() != next.partitions {
                update.apply(&registry.config_of(&t))?
            } else {
                next
            };
            registry.set_config(&t, next).await?;
            tracing::info!(topic = %topic, config = ?registry.config_of(&t), "topic configured");
            Ok::<_, BrokerError>(t)
        })
        .await
        .expect("topic task panicked")?;
        Ok(self.detail(&t))
    }

    /// `DELETE /mmmq/topics/{topic}`: its dispatcher workers stop (their last checkpoints
    /// written), its log closes, its directory goes (durably, all at once). Producing to it
    /// again starts a new topic at offset 0.
    ///
    /// It runs to its end on its own: a request dropped half-way (a client that disconnects, the
    /// request deadline) would otherwise leave the topic half deleted — refusing produces until a
    /// restart, its workers gone, its files back at the next boot.
    pub async fn delete_topic(&self, name: &str) -> Result<(), BrokerError> {
        let topic = Self::topic_name(name)?;
        if let Some(cluster) = self.cluster() {
            return self.delete_clustered_topic(cluster, &topic).await;
        }
        let (registry, dispatch) = (self.registry.clone(), self.dispatch.clone());
        tokio::spawn(async move {
            let _admin = registry.administer(&topic).await;
            let t = registry
                .begin_delete(&topic)
                .await
                .ok_or_else(|| BrokerError::UnknownTopic(topic.to_string()))?;
            dispatch.forget_topic(&topic).await;
            t.close().await;
            registry.finish_delete(&t).await?;
            tracing::info!(topic = %topic, "topic deleted");
            Ok(())
        })
        .await
        .expect("delete task panicked")
    }
}

/// Runs retention over every topic now and every `every`, until `stop`, and writes the id
/// snapshot of each topic that stored messages since its last one. A cluster member's partitions
/// go through their groups once `cluster` is set (docs/cluster.md, "Retention in a cluster").
pub(super) fn spawn_retention(
    cluster: Arc<std::sync::OnceLock<crate::cluster::node::Cluster>>,
    registry: Arc<Registry>,
    dispatch: Arc<Dispatch>,
    groups: Arc<crate::groups::Groups>,
    metrics: Arc<Metrics>,
    every: Duration,
    stop: CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            for t in registry.all() {
                if stop.is_cancelled() {
                    return;
                }
                let config = registry.config_of(&t);
                // Ids past their window leave the budget, also in a topic nobody produces to.
                t.dedup.expire(now_ms(), config.dedup_window_ms);
                for p in t.partitions() {
                    // A cluster member that has not applied the cluster's dispatchers yet does
                    // not know whose positions to hold: it keeps the topic whole for now.
                    if config.keep_undelivered && !dispatch.configuration_known() {
                        continue;
                    }
                    let floor = if config.keep_undelivered {
                        let mut held = dispatch.protected_positions(&t.topic, &p).await;
                        held.extend(groups.protected_positions(&t.topic, &p).await);
                        held.into_iter().min()
                    } else {
                        None
                    };
                    let raft = cluster.get().map(|c| c as &dyn retention::RaftRetention);
                    match retention::apply(&t.topic, &p, &config, now_ms(), floor, raft).await {
                        Ok(0) => {}
                        Ok(n) => {
                            metrics
                                .segments_deleted
                                .get_or_create(&TopicLabel {
                                    topic: t.topic.to_string(),
                                })
                                .inc_by(n as u64);
                        }
                        Err(e) => {
                            tracing::warn!(topic = %t.topic, partition = p.number, error = %e, "retention pass failed; it runs again later")
                        }
                    }
                }
                // A boot after a crash then reads only what came since this pass.
                if let Err(e) = registry.save_ids(&t).await {
                    tracing::warn!(topic = %t.topic, error = %e, "cannot write the produce-id snapshot; the next pass tries again");
                }
            }
            metrics.retention_passes.inc();
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    });
}
