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
use crate::topics::delivery::{BoxFuture, ClusterAppend};

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
        key: Option<&'a str>,
        payload: Vec<u8>,
    ) -> BoxFuture<'a, Result<(u32, u64), String>> {
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
            let p = t.route(None, key).map_err(|e| e.to_string())?.number;
            let group = GroupId::Partition(topic.to_string(), p);
            let applied = self
                .cluster
                .write(group, vec![Command::Message(payload.into())])
                .await
                .map_err(|e| e.to_string())?;
            match applied.first() {
                Some(Applied::Offset(offset)) => Ok((p, *offset)),
                other => Err(format!("the append was applied as {other:?}")),
            }
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
