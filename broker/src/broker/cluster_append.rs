//! The broker's own appends on a cluster member (docs/cluster.md, "Delivery in a cluster"):
//! dead letters, and what plugins emit and log, go to their topic as a producer's message
//! does — the topic created through the metadata if the cluster lacks it, the message written
//! through its partition's leader — since a clustered log takes no local append.

use std::sync::{Arc, Weak};

use mmmq_core::{Topic, TopicConfig};

use super::cluster_api::ensure_topic;
use crate::cluster::network::GroupId;
use crate::cluster::node::Cluster;
use crate::cluster::types::{Applied, Command};
use crate::topics::Registry;
use crate::topics::delivery::{Appended, BoxFuture, ClusterAppend};

/// Appends through the cluster.
pub(super) struct Appender {
    pub(super) cluster: Cluster,
    /// Weak: the registry holds this.
    pub(super) registry: Weak<Registry>,
    /// The configuration a topic created here gets (its partition count given per append).
    pub(super) defaults: TopicConfig,
}

impl ClusterAppend for Appender {
    fn append<'a>(
        &'a self,
        topic: &'a Topic,
        partitions: u32,
        items: Vec<Appended>,
    ) -> BoxFuture<'a, Result<Vec<(u32, u64)>, String>> {
        Box::pin(async move {
            let registry = self
                .registry
                .upgrade()
                .ok_or_else(|| "the broker is stopping".to_owned())?;
            let config = TopicConfig {
                partitions,
                ..self.defaults.clone()
            };
            let t = ensure_topic(&self.cluster, &registry, &config, topic)
                .await
                .map_err(|e| e.to_string())?;
            // Each partition's share in one write, in the items' order.
            let mut shares: Vec<(u32, Vec<usize>)> = Vec::new();
            for (i, item) in items.iter().enumerate() {
                let p = t
                    .route(None, item.route.as_deref())
                    .map_err(|e| e.to_string())?
                    .number;
                match shares.iter_mut().find(|(q, _)| *q == p) {
                    Some((_, v)) => v.push(i),
                    None => shares.push((p, vec![i])),
                }
            }
            let writes = shares.iter().map(|(p, indexes)| {
                let commands = indexes
                    .iter()
                    .map(|&i| Command::Message(items[i].payload.clone().into()))
                    .collect();
                let group = GroupId::Partition(topic.to_string(), *p);
                self.cluster.write(group, commands)
            });
            let written = futures_util::future::join_all(writes).await;
            let mut placed = vec![(0, 0); items.len()];
            for ((p, indexes), applied) in shares.iter().zip(written) {
                let applied = applied.map_err(|e| e.to_string())?;
                for (&i, a) in indexes.iter().zip(&applied) {
                    placed[i] = match a {
                        Applied::Offset(offset) => (*p, *offset),
                        Applied::Duplicate { partition, offset } => (*partition, *offset),
                        other => return Err(format!("an append was applied as {other:?}")),
                    };
                }
            }
            Ok(placed)
        })
    }
}

/// Makes `registry`'s broker-made appends go through `cluster`.
pub(super) fn attach(registry: &Arc<Registry>, cluster: Cluster, defaults: TopicConfig) {
    registry.set_cluster_append(Arc::new(Appender {
        cluster,
        registry: Arc::downgrade(registry),
        defaults,
    }));
}
