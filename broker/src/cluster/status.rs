//! `GET /mmmq/cluster` (contract §13; docs/cluster.md, "Status"): the brokers and, per
//! partition, its leader, replicas, each replica's lag and the Raft term — answered by any
//! broker. A broker knows the lag of the partitions it leads only, so the answering broker asks
//! every other live broker for its own view (`?local=true`) and takes each partition's figures
//! from the broker that leads it.

use std::time::Duration;

use super::network::GroupId;
use super::node::Cluster;
use super::rpc::GroupView;
use super::types::BrokerId;
pub use mmmq_core::cluster::{BrokerView, ClusterView, MetaView, PartitionView};

impl Cluster {
    /// This broker's own view: the metadata, and the groups it replicates.
    pub fn local_view(&self) -> ClusterView {
        let meta = self.metadata();
        let meta_view = self.inner.meta_view();
        let mut partitions = Vec::new();
        for (topic, t) in &meta.topics {
            for (p, replicas) in t.placement.iter().enumerate() {
                let group = GroupId::Partition(topic.clone(), p as u32);
                let view = self.inner.partitions.read().get(&group).map(|ep| ep.view());
                partitions.push(partition_view(topic, p as u32, replicas, view.as_ref()));
            }
        }
        ClusterView {
            clustered: true,
            node_id: Some(self.id()),
            cluster_id: self.cluster_id(),
            meta: Some(MetaView {
                leader: meta_view.leader,
                term: meta_view.term,
                voters: meta_view.voters,
            }),
            brokers: meta
                .brokers
                .iter()
                .map(|(id, b)| BrokerView {
                    id: *id,
                    addr: b.addr.clone(),
                    alive: (*id == self.id()).then_some(true),
                    kafka: b.kafka.clone(),
                })
                .collect(),
            partitions,
        }
    }

    /// The whole cluster's view: this broker's, completed by every other broker's own.
    pub async fn view(&self) -> ClusterView {
        let mut view = self.local_view();
        let others: Vec<BrokerView> = view
            .brokers
            .iter()
            .filter(|b| b.id != self.id())
            .cloned()
            .collect();
        let asks = others.iter().map(|b| self.ask_view(b.id));
        let answers = futures_util::future::join_all(asks).await;
        for (b, answer) in others.iter().zip(answers) {
            if let Some(entry) = view.brokers.iter_mut().find(|x| x.id == b.id) {
                entry.alive = Some(answer.is_some());
            }
            let Some(theirs) = answer else { continue };
            for p in theirs.partitions {
                if p.leader != Some(b.id) || p.lag.is_none() {
                    continue;
                }
                // The leader of the highest term wins: a leader cut off and healed claims its
                // old term until the new leader's entries reach it.
                if let Some(mine) = view
                    .partitions
                    .iter_mut()
                    .find(|x| x.topic == p.topic && x.partition == p.partition)
                    && (p.term > mine.term || (p.term == mine.term && mine.lag.is_none()))
                {
                    *mine = p;
                }
            }
        }
        view
    }

    pub(super) async fn ask_view(&self, broker: BrokerId) -> Option<ClusterView> {
        self.ask_local(broker, "/mmmq/cluster?local=true").await
    }

    /// Another broker's own answer to `GET path` (a status: `?local=true`), within 500 ms;
    /// `None` if it does not answer.
    pub async fn ask_local<T: serde::de::DeserializeOwned>(
        &self,
        broker: BrokerId,
        path: &str,
    ) -> Option<T> {
        let router = &self.inner.router;
        let base = router.peer(broker)?;
        let request = router
            .http()
            .get(format!("{base}{path}"))
            .timeout(Duration::from_millis(500));
        let response = router.credentials(request).send().await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        response.json().await.ok()
    }
}

fn partition_view(
    topic: &str,
    p: u32,
    replicas: &[BrokerId],
    view: Option<&GroupView>,
) -> PartitionView {
    let leads = |v: &&GroupView| !v.matched.is_empty();
    let lag = view.filter(leads).map(|v| {
        let end = v.last_log_index.map_or(0, |i| i + 1);
        replicas
            .iter()
            .map(|r| {
                let behind = v
                    .matched
                    .get(r)
                    .map(|m| end.saturating_sub(m.map_or(0, |i| i + 1)));
                (*r, behind)
            })
            .collect()
    });
    PartitionView {
        topic: topic.to_owned(),
        partition: p,
        replicas: replicas.to_vec(),
        leader: view.and_then(|v| v.leader),
        term: view.map(|v| v.term),
        lag,
    }
}
