//! A broker and a topic as the metadata knows them (docs/cluster.md, "Metadata"): a topic's
//! configuration, replication factor, placement and moves, and which brokers run each
//! partition's group.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::types::BrokerId;

/// A broker as the metadata knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BrokerMeta {
    /// Its HTTP address, `host:port`.
    pub addr: String,
    /// Its Kafka listener's address, `host:port`, if it has one (docs/kafka.md, "In a
    /// cluster").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka: Option<String>,
}

/// A topic as the metadata knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopicMeta {
    /// Its configuration (contract §7's fields).
    pub config: serde_json::Value,
    /// Replicas per partition.
    pub replication_factor: u8,
    /// Per partition, its replicas, preferred leader first.
    pub placement: Vec<Vec<BrokerId>>,
    /// Bumped by every delete, so that a topic created again under the same name is a new
    /// group (its old replicas' files are not mistaken for the new one's).
    pub incarnation: u64,
    /// Its topic id (contract §7's `topicId`), the same on every broker.
    #[serde(default)]
    pub id: String,
    /// Partitions being moved: the brokers that run the partition's group besides its
    /// placement until the move ends (the union of every target since it began).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub moving: BTreeMap<u32, Vec<BrokerId>>,
    /// Partitions moved at least once: their placement is no longer the membership their
    /// group was initialized with, so no replica initializes it again (one with an empty log
    /// waits for the leader).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub reassigned: BTreeSet<u32>,
}

impl TopicMeta {
    /// Whether `broker` runs partition `p`'s group: it is in its placement, or a move adds it.
    pub fn runs(&self, p: u32, broker: BrokerId) -> bool {
        self.placement
            .get(p as usize)
            .is_some_and(|r| r.contains(&broker))
            || self.moving.get(&p).is_some_and(|r| r.contains(&broker))
    }

    /// Whether `broker` initializes partition `p`'s group when its log is empty: only the
    /// replicas of a partition's first placement do, never a replica a move added.
    pub fn initializes(&self, p: u32, broker: BrokerId) -> bool {
        !self.reassigned.contains(&p)
            && self
                .placement
                .get(p as usize)
                .is_some_and(|r| r.contains(&broker))
    }
}
