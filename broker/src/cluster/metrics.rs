//! The cluster's Prometheus metrics (contract §13: "leader changes and replication lag are also
//! metrics"; docs/cluster.md, "Metrics"): per group this broker runs, its term, whether it leads,
//! the leader changes it saw and, on the leader, each replica's lag in entries. They are derived
//! from openraft's metrics channel by the task that watches each group (no work per request or
//! scrape), and exported with the broker's own at `GET /metrics`.

use std::collections::BTreeMap;

use openraft::RaftMetrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Metric, Registry};

use super::types::{BrokerId, Raft};

/// A partition's group.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabel {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
}

/// A replica of a partition.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionReplicaLabel {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// The replica's broker id.
    pub replica: BrokerId,
}

/// A replica of the metadata group.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplicaLabel {
    /// The replica's broker id.
    pub replica: BrokerId,
}

/// Every cluster metric of a broker (registered under `mmmq_cluster_`).
pub struct ClusterMetrics {
    registry: Registry,
    leader_changes: Family<PartitionLabel, Counter>,
    term: Family<PartitionLabel, Gauge>,
    is_leader: Family<PartitionLabel, Gauge>,
    lag: Family<PartitionReplicaLabel, Gauge>,
    meta_leader_changes: Counter,
    meta_term: Gauge,
    meta_is_leader: Gauge,
    meta_lag: Family<ReplicaLabel, Gauge>,
}

impl Default for ClusterMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ClusterMetrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("mmmq_cluster");
        let m = Self {
            registry: Registry::default(),
            leader_changes: Family::default(),
            term: Family::default(),
            is_leader: Family::default(),
            lag: Family::default(),
            meta_leader_changes: Counter::default(),
            meta_term: Gauge::default(),
            meta_is_leader: Gauge::default(),
            meta_lag: Family::default(),
        };
        register_group(
            registry.sub_registry_with_prefix("partition"),
            m.leader_changes.clone(),
            m.term.clone(),
            m.is_leader.clone(),
            m.lag.clone(),
        );
        register_group(
            registry.sub_registry_with_prefix("meta"),
            m.meta_leader_changes.clone(),
            m.meta_term.clone(),
            m.meta_is_leader.clone(),
            m.meta_lag.clone(),
        );
        Self { registry, ..m }
    }

    /// The registry, for the broker's `GET /metrics`.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The series of partition `p` of `topic`.
    pub(super) fn partition(&self, topic: &str, p: u32) -> GroupSeries {
        let label = PartitionLabel {
            topic: topic.to_owned(),
            partition: p,
        };
        GroupSeries {
            leader_changes: self.leader_changes.get_or_create(&label).clone(),
            term: self.term.get_or_create(&label).clone(),
            is_leader: self.is_leader.get_or_create(&label).clone(),
            which: Which::Partition {
                label,
                leader_changes: self.leader_changes.clone(),
                term: self.term.clone(),
                is_leader: self.is_leader.clone(),
                lag: self.lag.clone(),
            },
            lagging: BTreeMap::new(),
            seen_term: None,
        }
    }

    /// The series of the metadata group.
    pub(super) fn meta(&self) -> GroupSeries {
        GroupSeries {
            leader_changes: self.meta_leader_changes.clone(),
            term: self.meta_term.clone(),
            is_leader: self.meta_is_leader.clone(),
            which: Which::Meta {
                lag: self.meta_lag.clone(),
            },
            lagging: BTreeMap::new(),
            seen_term: None,
        }
    }
}

/// Registers one kind of group's metrics (under its prefix).
fn register_group(
    r: &mut Registry,
    changes: impl Metric,
    term: impl Metric,
    leads: impl Metric,
    lag: impl Metric,
) {
    let what = "Leaders this broker saw take over the group (one per term with a leader)";
    r.register("leader_changes", what, changes);
    r.register("term", "The group's Raft term as this broker sees it", term);
    r.register(
        "is_leader",
        "1 while this broker leads the group, else 0",
        leads,
    );
    let what = "Entries each replica is behind the leader's log (exported by the leader)";
    r.register("replication_lag", what, lag);
}

enum Which {
    Partition {
        label: PartitionLabel,
        leader_changes: Family<PartitionLabel, Counter>,
        term: Family<PartitionLabel, Gauge>,
        is_leader: Family<PartitionLabel, Gauge>,
        lag: Family<PartitionReplicaLabel, Gauge>,
    },
    Meta {
        lag: Family<ReplicaLabel, Gauge>,
    },
}

/// One group's series, held by the task that watches the group, so that an update hashes no
/// labels (only a replica seen for the first time does).
pub(super) struct GroupSeries {
    leader_changes: Counter,
    term: Gauge,
    is_leader: Gauge,
    which: Which,
    /// The lag series exported now (while this broker leads).
    lagging: BTreeMap<BrokerId, Gauge>,
    /// The last term in which a leader was seen.
    seen_term: Option<u64>,
}

impl GroupSeries {
    /// Updates the series from the group's metrics.
    pub(super) fn observe(&mut self, m: &RaftMetrics<Raft>) {
        let running = m.running_state.is_ok();
        self.term.set(m.current_term as i64);
        let leads = running && m.current_leader == Some(m.id);
        self.is_leader.set(i64::from(leads));
        if running && m.current_leader.is_some() && self.seen_term != Some(m.current_term) {
            self.seen_term = Some(m.current_term);
            self.leader_changes.inc();
        }
        let matched = m.replication.as_ref().filter(|_| leads);
        let Some(matched) = matched else {
            self.stop_lag();
            return;
        };
        let end = m.last_log_index.map_or(0, |i| i + 1);
        for (replica, at) in matched {
            let behind = end.saturating_sub(at.as_ref().map_or(0, |l| l.index + 1));
            let gauge = match self.lagging.get(replica) {
                Some(g) => g,
                None => {
                    let g = self.lag_series(*replica);
                    self.lagging.entry(*replica).or_insert(g)
                }
            };
            gauge.set(behind.min(i64::MAX as u64) as i64);
        }
        let gone: Vec<BrokerId> = self
            .lagging
            .keys()
            .filter(|r| !matched.contains_key(r))
            .copied()
            .collect();
        for r in gone {
            self.remove_lag(r);
        }
    }

    /// The group stopped on this broker: it neither leads nor exports lag.
    pub(super) fn stopped(&mut self) {
        self.is_leader.set(0);
        self.stop_lag();
    }

    /// The group is gone from this broker (its topic deleted, the broker stopping): its series
    /// go too.
    pub(super) fn remove(mut self) {
        self.stop_lag();
        if let Which::Partition {
            label,
            leader_changes,
            term,
            is_leader,
            ..
        } = &self.which
        {
            leader_changes.remove(label);
            term.remove(label);
            is_leader.remove(label);
        }
    }

    fn stop_lag(&mut self) {
        let all: Vec<BrokerId> = self.lagging.keys().copied().collect();
        for r in all {
            self.remove_lag(r);
        }
    }

    fn lag_series(&self, replica: BrokerId) -> Gauge {
        match &self.which {
            Which::Partition { label, lag, .. } => lag
                .get_or_create(&PartitionReplicaLabel {
                    topic: label.topic.clone(),
                    partition: label.partition,
                    replica,
                })
                .clone(),
            Which::Meta { lag } => lag.get_or_create(&ReplicaLabel { replica }).clone(),
        }
    }

    fn remove_lag(&mut self, replica: BrokerId) {
        self.lagging.remove(&replica);
        match &self.which {
            Which::Partition { label, lag, .. } => {
                lag.remove(&PartitionReplicaLabel {
                    topic: label.topic.clone(),
                    partition: label.partition,
                    replica,
                });
            }
            Which::Meta { lag } => {
                lag.remove(&ReplicaLabel { replica });
            }
        }
    }
}
