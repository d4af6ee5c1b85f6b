//! The cluster's metadata (docs/cluster.md, "Metadata"): brokers, topics with their replication
//! factor and the placement of each partition's replicas. It changes only by applying a
//! [`MetaCommand`] from the metadata group's log, on every broker in the same order, so every
//! decision in here (placement above all) is a pure function of the state and the command.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub use super::meta_config::{DispatchersMeta, PluginMeta};
pub use super::meta_delivery::{PartitionDelivery, PositionWrite, StoredPosition};
pub use super::meta_groups::{GroupOffset, GroupTopic};
pub use super::meta_redrive::{RedriveAsked, RedriveMeta, RedrivePart};
pub use super::meta_topic::{BrokerMeta, TopicMeta};
use super::types::BrokerId;

/// A change to the metadata, as proposed to the metadata group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum MetaCommand {
    /// Names the cluster (docs/cluster.md, "The cluster's id"): proposed once the cluster
    /// forms, by any broker that finds its metadata without an id. The first applied stays.
    SetClusterId {
        /// 128 random bits, in hex.
        id: String,
    },
    /// Gives the cluster its members' secret (docs/cluster.md, "Who may speak for the
    /// cluster"): proposed with the id, by a broker that finds the metadata without one. The
    /// first applied stays.
    SetMemberSecret {
        /// What members present on every internal request.
        secret: super::secret::SecretText,
    },
    /// A broker joins (or, known already, announces a new address).
    AddBroker {
        /// Its id (never one that was removed).
        id: BrokerId,
        /// Its HTTP address, `host:port`.
        addr: String,
    },
    /// The address a broker's Kafka listener is reached at (docs/kafka.md, "In a cluster"):
    /// proposed by the broker itself when it starts, with `--kafka-listen` or without.
    SetKafkaAddress {
        /// The broker's id.
        id: BrokerId,
        /// `host:port`, as Kafka clients connect to it; `None`: it has no Kafka listener.
        addr: Option<String>,
    },
    /// A broker leaves for good once it holds no replica; its id is never used again.
    RemoveBroker {
        /// Its id.
        id: BrokerId,
    },
    /// Creates a topic or changes its configuration.
    PutTopic {
        /// The topic's name.
        name: String,
        /// Its configuration as the topic API shows it (contract §7), opaque here but for the
        /// partition count.
        config: serde_json::Value,
        /// Replicas per partition (1–5); `None` keeps the topic's (or the default for a new one).
        #[serde(default)]
        replication_factor: Option<u8>,
        /// The topic id a new topic gets (drawn at random by the proposer, so that every broker
        /// shows the same): set only to create, answered [`MetaOutcome::TopicExists`] when the
        /// topic is there already; `None` changes an existing topic.
        #[serde(default)]
        id: Option<String>,
    },
    /// Deletes a topic.
    DeleteTopic {
        /// The topic's name.
        name: String,
    },
    /// Starts moving one partition's replicas (`mmmq cluster reassign`): the new replicas are
    /// recorded as the partition's target, and the brokers among them start its group, empty,
    /// for its leader to catch them up (docs/cluster.md, "Membership").
    Reassign {
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
        /// The new replicas, preferred leader first.
        replicas: Vec<BrokerId>,
    },
    /// Ends a move: the partition's group now has exactly these voters, so they become its
    /// placement and the brokers left out stop its group and delete its files.
    FinishReassign {
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
        /// The replicas, preferred leader first (the target of the move).
        replicas: Vec<BrokerId>,
    },
    /// A pull group's committed offsets (docs/cluster.md, "Pull groups in a cluster").
    CommitGroup {
        /// The group.
        group: String,
        /// Its next offsets.
        offsets: Vec<GroupOffset>,
    },
    /// A partition's leader fences its dispatchers' positions to its term before delivering
    /// (docs/cluster.md, "Delivery in a cluster").
    DeliverPartition {
        /// The topic.
        topic: String,
        /// Its id.
        topic_id: String,
        /// The partition.
        partition: u32,
        /// The leader's term in the partition's group.
        term: u64,
        /// The leader.
        broker: BrokerId,
    },
    /// Dispatchers' positions, each applied only in its partition's fenced term.
    SetPositions {
        /// The writes, coalesced from one broker's round.
        writes: Vec<PositionWrite>,
    },
    /// A dispatcher's dead-letter redrive, which every broker runs and the dead-letter
    /// partitions' leaders deliver (docs/cluster.md, "Delivery in a cluster"); refused while its
    /// last one runs.
    StartRedrive {
        /// The dispatcher.
        consumer: String,
        /// Without `from`: its position is `__redrive`, where the next such redrive starts.
        continues: bool,
        /// Its topic, range and start (its `run` and `position` are given on apply).
        redrive: RedriveAsked,
    },
    /// The cluster's `dispatchers.json` (docs/cluster.md, "Configuration in a cluster").
    SetDispatchers {
        /// The file's text, validated by the proposer.
        text: String,
        /// Set only if the cluster has none yet (a broker's boot seeding it from its file).
        #[serde(default)]
        only_if_unset: bool,
    },
    /// A plugin version deployed through a broker becomes current everywhere.
    DeployPlugin {
        /// The plugin.
        name: String,
        /// The version (its bytes stay with `holder` and each broker's plugin store).
        version: mmmq_core::VersionInfo,
        /// The broker that kept its bytes.
        holder: BrokerId,
    },
    /// A kept plugin version becomes current everywhere (a rollback or an activation).
    SwitchPlugin {
        /// The plugin.
        name: String,
        /// The version.
        version: String,
        /// Refused unless this is the current version (a rollback's guard).
        #[serde(default)]
        if_current: Option<String>,
    },
}

/// What applying a command answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MetaOutcome {
    /// Applied.
    Done,
    /// Refused, with why (the state did not change).
    Refused(String),
    /// A `PutTopic` that creates (it carries a new topic's id) found the topic there already:
    /// its proposer decided from metadata that had not yet caught up, so it catches up and
    /// decides again rather than overwrite the topic's configuration with a new topic's.
    TopicExists,
    /// A command of several independent parts ([`MetaCommand::SetPositions`]): per part,
    /// `None` if applied, or why it was refused.
    Each(Vec<Option<String>>),
}

/// The whole metadata.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetaState {
    /// The cluster's id, once one was proposed (docs/cluster.md, "The cluster's id").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
    /// The members' secret, once one was proposed. Never in any answer to a client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_secret: Option<super::secret::SecretText>,
    /// The brokers of the cluster.
    pub brokers: BTreeMap<BrokerId, BrokerMeta>,
    /// Ids of brokers removed: never given out again.
    pub retired: BTreeSet<BrokerId>,
    /// The topics.
    pub topics: BTreeMap<String, TopicMeta>,
    /// Counts topic creations, for [`TopicMeta::incarnation`].
    pub created: u64,
    /// Pull groups' committed offsets: group → topic → offsets of one incarnation.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub groups: BTreeMap<String, BTreeMap<String, GroupTopic>>,
    /// Per topic and partition, who delivers it and its dispatchers' positions.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub deliveries: BTreeMap<String, BTreeMap<u32, PartitionDelivery>>,
    /// `dispatchers.json`, once a broker set it (docs/cluster.md, "Configuration in a cluster").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatchers: Option<DispatchersMeta>,
    /// Deployed plugins, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub plugins: BTreeMap<String, PluginMeta>,
    /// Each dispatcher's last dead-letter redrive, by consumerId.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub redrives: super::meta_redrive::Redrives,
    /// Counts redrives started, for [`RedriveMeta::run`].
    #[serde(default)]
    pub redrive_runs: u64,
}

/// Replicas per partition when a topic does not say: `min(3, brokers)` (contract §13).
pub fn default_replication(brokers: usize) -> u8 {
    brokers.clamp(1, 3) as u8
}

fn partitions_of(config: &serde_json::Value) -> u32 {
    config
        .get("partitions")
        .and_then(serde_json::Value::as_u64)
        .map_or(1, |p| p.clamp(1, 1024) as u32)
}

impl MetaState {
    /// Applies one command: the only way the metadata changes.
    pub fn apply(&mut self, command: &MetaCommand) -> MetaOutcome {
        if let MetaCommand::PutTopic {
            name, id: Some(_), ..
        } = command
            && self.topics.contains_key(name)
        {
            return MetaOutcome::TopicExists;
        }
        if let MetaCommand::SetPositions { writes } = command {
            return self.set_positions(writes);
        }
        match self.try_apply(command) {
            Ok(()) => MetaOutcome::Done,
            Err(why) => MetaOutcome::Refused(why),
        }
    }

    fn try_apply(&mut self, command: &MetaCommand) -> Result<(), String> {
        match command {
            MetaCommand::SetClusterId { id } => match &self.cluster_id {
                Some(ours) if ours != id => Err(format!("the cluster's id is {ours} already")),
                _ => {
                    self.cluster_id = Some(id.clone());
                    Ok(())
                }
            },
            MetaCommand::SetMemberSecret { secret } => {
                if self.member_secret.is_none() {
                    self.member_secret = Some(secret.clone());
                }
                // A second one is not an error worth telling: its proposer adopts the first.
                Ok(())
            }
            MetaCommand::AddBroker { id, addr } => {
                if self.retired.contains(id) {
                    return Err(format!("broker id {id} was removed and is never reused"));
                }
                // A broker known already keeps its Kafka address (it announces a new one).
                self.brokers
                    .entry(*id)
                    .and_modify(|b| b.addr.clone_from(addr))
                    .or_insert_with(|| BrokerMeta {
                        addr: addr.clone(),
                        kafka: None,
                    });
                Ok(())
            }
            MetaCommand::SetKafkaAddress { id, addr } => match self.brokers.get_mut(id) {
                Some(b) => {
                    b.kafka = addr.clone();
                    Ok(())
                }
                None => Err(format!("no broker {id}")),
            },
            MetaCommand::RemoveBroker { id } => {
                if !self.brokers.contains_key(id) {
                    return Err(format!("no broker {id}"));
                }
                if let Some((topic, p)) = self.replicas_on(*id).first() {
                    return Err(format!(
                        "broker {id} still holds a replica of {topic}/{p}: move its replicas first"
                    ));
                }
                if self.brokers.len() == 1 {
                    return Err("the last broker cannot be removed".into());
                }
                self.brokers.remove(id);
                self.retired.insert(*id);
                Ok(())
            }
            MetaCommand::PutTopic {
                name,
                config,
                replication_factor,
                id,
            } => self.put_topic(name, config, *replication_factor, id.as_deref()),
            MetaCommand::DeleteTopic { name } => match self.topics.remove(name) {
                Some(_) => {
                    self.forget_group_topic(name);
                    self.forget_deliveries(name);
                    self.forget_redrives(name);
                    Ok(())
                }
                None => Err(format!("no topic {name:?}")),
            },
            MetaCommand::CommitGroup { group, offsets } => self.commit_group(group, offsets),
            MetaCommand::DeliverPartition {
                topic,
                topic_id,
                partition,
                term,
                broker,
            } => self.deliver_partition(topic, topic_id, *partition, *term, *broker),
            MetaCommand::SetPositions { .. } => unreachable!("applied per write"),
            MetaCommand::Reassign {
                topic,
                partition,
                replicas,
            } => self.reassign(topic, *partition, replicas, false),
            MetaCommand::FinishReassign {
                topic,
                partition,
                replicas,
            } => self.reassign(topic, *partition, replicas, true),
            MetaCommand::StartRedrive {
                consumer,
                continues,
                redrive,
            } => self.start_redrive(consumer, redrive, *continues),
            MetaCommand::SetDispatchers {
                text,
                only_if_unset,
            } => self.set_dispatchers(text, *only_if_unset),
            MetaCommand::DeployPlugin {
                name,
                version,
                holder,
            } => self.deploy_plugin(name, version, *holder),
            MetaCommand::SwitchPlugin {
                name,
                version,
                if_current,
            } => self.switch_plugin(name, version, if_current.as_deref()),
        }
    }

    fn put_topic(
        &mut self,
        name: &str,
        config: &serde_json::Value,
        rf: Option<u8>,
        id: Option<&str>,
    ) -> Result<(), String> {
        let live = self.brokers.len();
        if let Some(rf) = rf
            && !(1..=5).contains(&rf)
        {
            return Err(format!("replicationFactor must be 1–5, not {rf}"));
        }
        let partitions = partitions_of(config);
        let existing = self.topics.get(name);
        let rf = rf
            .or(existing.map(|t| t.replication_factor))
            .unwrap_or_else(|| default_replication(live));
        if rf as usize > live {
            return Err(format!(
                "replicationFactor {rf} needs {rf} brokers; the cluster has {live}"
            ));
        }
        let mut placement = existing.map(|t| t.placement.clone()).unwrap_or_default();
        if (partitions as usize) < placement.len() {
            return Err(format!(
                "partitions can grow but not shrink ({} → {partitions})",
                placement.len()
            ));
        }
        if existing.is_some_and(|t| t.replication_factor != rf) {
            return Err("replicationFactor of an existing topic does not change".into());
        }
        while placement.len() < partitions as usize {
            let replicas = self.place(rf as usize, &placement);
            placement.push(replicas);
        }
        let moving = existing.map(|t| t.moving.clone()).unwrap_or_default();
        let reassigned = existing.map(|t| t.reassigned.clone()).unwrap_or_default();
        let (incarnation, id) = match existing {
            Some(t) => (t.incarnation, t.id.clone()),
            None => {
                self.created += 1;
                let id = id.ok_or("a new topic needs its id")?;
                (self.created, id.to_owned())
            }
        };
        self.topics.insert(
            name.to_owned(),
            TopicMeta {
                config: config.clone(),
                replication_factor: rf,
                placement,
                incarnation,
                id,
                moving,
                reassigned,
            },
        );
        Ok(())
    }

    /// Checks a new set of replicas for partition `p` of `topic`: distinct, known brokers, as
    /// many as the topic's replication factor (a move changes where, not how many).
    pub fn check_replicas(&self, topic: &str, p: u32, replicas: &[BrokerId]) -> Result<(), String> {
        let distinct: BTreeSet<_> = replicas.iter().collect();
        if distinct.len() != replicas.len() {
            return Err("replicas must be distinct broker ids".into());
        }
        if let Some(unknown) = replicas.iter().find(|b| !self.brokers.contains_key(b)) {
            return Err(format!("no broker {unknown}"));
        }
        let t = self
            .topics
            .get(topic)
            .ok_or_else(|| format!("no topic {topic:?}"))?;
        if t.placement.get(p as usize).is_none() {
            return Err(format!("topic {topic:?} has no partition {p}"));
        }
        if replicas.len() != t.replication_factor as usize {
            return Err(format!(
                "topic {topic:?} has replicationFactor {}: give {} replicas, not {}",
                t.replication_factor,
                t.replication_factor,
                replicas.len()
            ));
        }
        Ok(())
    }

    /// Starts (`finish == false`) or ends a move of partition `p` of `topic` to `replicas`.
    fn reassign(
        &mut self,
        topic: &str,
        p: u32,
        replicas: &[BrokerId],
        finish: bool,
    ) -> Result<(), String> {
        self.check_replicas(topic, p, replicas)?;
        let t = self.topics.get_mut(topic).expect("checked");
        // One move of a partition at a time: a move's end clears what it recorded, and two
        // moves' voter changes interleaved with one's end would release replicas the other
        // made voters (docs/cluster.md, "Membership").
        let wanted: BTreeSet<BrokerId> = replicas.iter().copied().collect();
        let under_way = t
            .moving
            .get(&p)
            .map(|m| m.iter().copied().collect::<BTreeSet<_>>());
        match &under_way {
            Some(target) if *target != wanted => {
                return Err(format!(
                    "a move of {topic}/{p} to {:?} is under way: run it again to finish it, \
                     then move the partition again",
                    t.moving[&p]
                ));
            }
            None if finish && t.placement[p as usize] != replicas => {
                return Err(format!(
                    "no move of {topic}/{p} to {replicas:?} is under way"
                ));
            }
            _ => {}
        }
        if finish {
            t.placement[p as usize] = replicas.to_vec();
            t.moving.remove(&p);
            t.reassigned.insert(p);
        } else {
            // A move begun again with the same target goes on where it was.
            t.moving.insert(p, replicas.to_vec());
        }
        Ok(())
    }

    /// Every (topic, partition) whose group runs on `broker` (a replica, or a move's target).
    pub fn replicas_on(&self, broker: BrokerId) -> Vec<(String, u32)> {
        let mut out = Vec::new();
        for (name, t) in &self.topics {
            for p in 0..t.placement.len() as u32 {
                if t.runs(p, broker) {
                    out.push((name.clone(), p));
                }
            }
        }
        out
    }

    /// Chooses `rf` brokers for a new partition: those holding the fewest replicas, then the
    /// fewest preferred leaderships (counting the topic's partitions placed so far), so that
    /// replicas and leaders spread evenly. Ties go to the lower id, rotated by the partition
    /// count, so that equal brokers take turns.
    fn place(&self, rf: usize, so_far: &[Vec<BrokerId>]) -> Vec<BrokerId> {
        let mut load: BTreeMap<BrokerId, (usize, usize)> =
            self.brokers.keys().map(|b| (*b, (0, 0))).collect();
        let all = self.topics.values().flat_map(|t| t.placement.iter());
        for replicas in all.chain(so_far.iter()) {
            for (i, b) in replicas.iter().enumerate() {
                if let Some(l) = load.get_mut(b) {
                    l.0 += 1;
                    if i == 0 {
                        l.1 += 1;
                    }
                }
            }
        }
        let ids: Vec<BrokerId> = load.keys().copied().collect();
        let turn = so_far.len() + self.topics.len();
        let rank = |b: &BrokerId| {
            let pos = ids.iter().position(|x| x == b).unwrap_or(0);
            (pos + ids.len() - turn % ids.len().max(1)) % ids.len().max(1)
        };
        // The preferred leader first: the broker leading the fewest partitions; then the
        // followers: those holding the fewest replicas.
        let leader = *ids
            .iter()
            .min_by_key(|b| (load[b].1, load[b].0, rank(b)))
            .expect("a cluster has a broker");
        let mut followers: Vec<BrokerId> = ids.iter().copied().filter(|b| *b != leader).collect();
        followers.sort_by_key(|b| (load[b].0, rank(b)));
        let mut chosen = vec![leader];
        chosen.extend(followers.into_iter().take(rf - 1));
        chosen
    }
}

#[cfg(test)]
#[path = "meta_state_tests.rs"]
mod tests;
