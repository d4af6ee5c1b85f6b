//! A plugin's emits on a cluster member (docs/cluster.md, "Delivery in a cluster").
//!
//! On one broker a re-run after a crash finds what it emitted before by origin, in the
//! destinations' local logs, within bounds kept on disk. In a cluster the destinations live on
//! other brokers and the source partition's next leader is another broker, so each emit carries
//! a produce id made of its origin (`__emit.{consumerId}.{topicId}.{partition}.{offset}.{index}`)
//! and goes through the cluster as a producer's message does: the destination partition's
//! leader stores an id once and answers a repeat with the first copy's position — also one that
//! is still being written when the repeat arrives (docs/cluster.md, "Produce ids in a
//! cluster"). A re-run within the destination topic's dedupe window is therefore stored once.

use mmmq_core::{Origin, StoredMessage, Topic, now_ms};

use super::source::Source;
use super::{EmitError, Outputs};
use crate::topics::delivery::{Appended, ClusterAppend};

impl Source {
    /// Appends the outputs of ACKed calls through the cluster; resolves once a majority of each
    /// destination holds them. Returns how many were appended (repeats included).
    pub(super) async fn commit_clustered(
        &self,
        cluster: &dyn ClusterAppend,
        outputs: Vec<Outputs>,
    ) -> Result<u64, EmitError> {
        let (source_topic, partition) = self.source();
        let mut by_topic: Vec<(Topic, Vec<Appended>)> = Vec::new();
        let now = now_ms();
        for (offset, emits) in outputs {
            for (index, item) in emits.into_iter().enumerate() {
                let index = index as u32;
                let id = format!(
                    "__emit.{}.{}.{}.{offset}.{index}",
                    self.consumer_id(),
                    partition.topic_id,
                    partition.number
                );
                let origin = Origin {
                    consumer_id: self.consumer_id().to_string(),
                    topic: source_topic.to_string(),
                    partition: partition.number,
                    offset,
                    index,
                    topic_id: Some(partition.topic_id),
                };
                let (topic, key, content) = item.into_parts();
                let route = key.clone().or_else(|| Some(id.clone()));
                let payload = StoredMessage {
                    timestamp: now,
                    key,
                    content,
                    id: Some(id),
                    origin: Some(origin),
                    binary: Default::default(),
                }
                .to_payload();
                let appended = Appended { route, payload };
                match by_topic.iter_mut().find(|(t, _)| *t == topic) {
                    Some((_, v)) => v.push(appended),
                    None => by_topic.push((topic, vec![appended])),
                }
            }
        }
        let mut appended = 0;
        for (topic, items) in by_topic {
            let n = items.len() as u64;
            let partitions = self.default_partitions();
            cluster
                .append(&topic, partitions, items)
                .await
                .map_err(|why| EmitError::Cluster {
                    topic: topic.to_string(),
                    why,
                })?;
            appended += n;
        }
        Ok(appended)
    }
}
