//! What `GET /mmmq/cluster` answers (contract §13): the brokers of a cluster, its metadata
//! group, and per partition its replicas, leader, term and lag.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The answer of `GET /mmmq/cluster`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ClusterView {
    /// Whether the broker is a cluster member (`false`: a single-node broker, contract §1–§12).
    pub clustered: bool,
    /// The broker that answered.
    pub node_id: Option<u64>,
    /// The cluster's id, as the broker that answered knows it (`null`: a single-node broker,
    /// or a new broker its cluster's metadata has not reached yet).
    #[serde(default)]
    pub cluster_id: Option<String>,
    /// The metadata group.
    pub meta: Option<MetaView>,
    /// The brokers.
    pub brokers: Vec<BrokerView>,
    /// Every partition of every topic.
    pub partitions: Vec<PartitionView>,
}

/// The metadata group in a [`ClusterView`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct MetaView {
    /// Its leader.
    pub leader: Option<u64>,
    /// Its term.
    pub term: u64,
    /// Its voters.
    pub voters: Vec<u64>,
}

/// A broker in a [`ClusterView`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct BrokerView {
    /// Its id.
    pub id: u64,
    /// Its HTTP address.
    pub addr: String,
    /// Whether it answered just now (`null`: not asked).
    pub alive: Option<bool>,
    /// Its Kafka listener's address, if it has one (`serve --kafka-listen`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka: Option<String>,
}

/// A partition in a [`ClusterView`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct PartitionView {
    /// Its topic.
    pub topic: String,
    /// Its number.
    pub partition: u32,
    /// Its replicas, preferred leader first.
    pub replicas: Vec<u64>,
    /// Its leader, if it has one.
    pub leader: Option<u64>,
    /// The leader's term.
    pub term: Option<u64>,
    /// Per replica, how many entries it is behind the leader's log (`null` without a leader's
    /// report).
    pub lag: Option<BTreeMap<u64, Option<u64>>>,
}

/// `POST /mmmq/cluster/brokers`: a broker to add to the cluster (`mmmq cluster add-broker`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewBroker {
    /// Its id (`--node-id`): never one removed before, and higher than the cluster's lowest.
    pub id: u64,
    /// Its HTTP address, `host:port`, as its `--peers` entry gives it.
    pub address: String,
}

/// `PUT /mmmq/cluster/partitions/{topic}/{partition}`: where a partition's replicas go
/// (`mmmq cluster reassign`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Reassignment {
    /// The new replicas, preferred leader first: distinct broker ids, as many as the topic's
    /// `replicationFactor`.
    pub replicas: Vec<u64>,
}
