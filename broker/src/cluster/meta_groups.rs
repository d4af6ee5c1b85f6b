//! Pull groups' committed offsets in the cluster's metadata (docs/cluster.md, "Pull groups in a
//! cluster"): a commit is a metadata command, so every broker holds every group's offsets and a
//! new coordinator (the metadata group's next leader) starts each partition where the group
//! committed it.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::meta_state::MetaState;

/// One committed next offset, as a commit proposes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupOffset {
    /// The topic.
    pub topic: String,
    /// The topic's id (its incarnation): an offset of an incarnation that is gone is refused.
    pub topic_id: String,
    /// The partition.
    pub partition: u32,
    /// The next offset to read.
    pub offset: u64,
    /// A Kafka commit's metadata string (empty: none); `None` for HTTP's commits, which leave
    /// what a Kafka commit kept (shown only while the offset is the one it came with).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<String>,
}

/// A group's committed offsets of one topic incarnation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupTopic {
    /// The topic's id the offsets are of.
    pub id: String,
    /// The next offset to read, per partition.
    pub offsets: BTreeMap<u32, u64>,
    /// Per partition with one, the last Kafka commit's metadata string and the offset it came
    /// with (shared, not copied, when the state is: it may be 4 KiB).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<u32, (u64, Arc<str>)>,
}

impl MetaState {
    /// Records `group`'s `offsets`, all or none: refused if one names a topic, incarnation or
    /// partition the cluster does not have.
    pub(super) fn commit_group(
        &mut self,
        group: &str,
        offsets: &[GroupOffset],
    ) -> Result<(), String> {
        for o in offsets {
            let t = self
                .topics
                .get(&o.topic)
                .filter(|t| t.id == o.topic_id)
                .ok_or_else(|| {
                    format!(
                        "topic {:?} ({}) is not in the cluster (any more)",
                        o.topic, o.topic_id
                    )
                })?;
            if o.partition as usize >= t.placement.len() {
                return Err(format!("no partition {} of {:?}", o.partition, o.topic));
            }
        }
        let g = self.groups.entry(group.to_owned()).or_default();
        for o in offsets {
            let t = g.entry(o.topic.clone()).or_default();
            if t.id != o.topic_id {
                *t = GroupTopic {
                    id: o.topic_id.clone(),
                    ..GroupTopic::default()
                };
            }
            t.offsets.insert(o.partition, o.offset);
            match o.metadata.as_deref() {
                Some("") => {
                    t.metadata.remove(&o.partition);
                }
                Some(m) => {
                    t.metadata.insert(o.partition, (o.offset, Arc::from(m)));
                }
                None => {}
            }
        }
        Ok(())
    }

    /// `group`'s committed next offset of `partition` of the incarnation `topic_id` of `topic`.
    pub fn committed(
        &self,
        group: &str,
        topic: &str,
        topic_id: &str,
        partition: u32,
    ) -> Option<u64> {
        let t = self.groups.get(group)?.get(topic)?;
        (t.id == topic_id).then(|| t.offsets.get(&partition).copied())?
    }

    /// The metadata string committed with `group`'s offset of `partition`: empty when there is
    /// none, or when the committed offset is no longer the one it came with.
    pub fn committed_metadata(
        &self,
        group: &str,
        topic: &str,
        topic_id: &str,
        partition: u32,
    ) -> String {
        let t = self.groups.get(group).and_then(|g| g.get(topic));
        t.filter(|t| t.id == topic_id)
            .and_then(|t| {
                let (offset, m) = t.metadata.get(&partition)?;
                (t.offsets.get(&partition) == Some(offset)).then(|| m.to_string())
            })
            .unwrap_or_default()
    }

    /// Every group's committed next offset of `partition` of the incarnation `topic_id` of
    /// `topic`, by group.
    pub fn committed_by_groups(
        &self,
        topic: &str,
        topic_id: &str,
        partition: u32,
    ) -> Vec<(String, u64)> {
        self.groups
            .iter()
            .filter_map(|(g, topics)| {
                let t = topics.get(topic).filter(|t| t.id == topic_id)?;
                Some((g.clone(), *t.offsets.get(&partition)?))
            })
            .collect()
    }

    /// A deleted topic's offsets go with it (a topic created again is new to every group).
    pub(super) fn forget_group_topic(&mut self, topic: &str) {
        for g in self.groups.values_mut() {
            g.remove(topic);
        }
        self.groups.retain(|_, g| !g.is_empty());
    }
}
