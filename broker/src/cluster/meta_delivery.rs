//! Dispatchers' positions in the cluster's metadata (docs/cluster.md, "Delivery in a cluster").
//!
//! A partition's dispatchers run on its leader only, and a new leader continues from where the
//! old one stopped. So each partition's positions (the at-least-once checkpoint with its lanes'
//! done ranges, the at-most-once claim) are metadata, fenced by the partition group's term:
//!
//! - A leader first proposes `DeliverPartition` with its term. Once applied, the
//!   partition's positions accept writes of that term only; a write of an older term (a deposed
//!   leader's, still in flight) is refused. Every write of the older term that got in was
//!   applied before the fence, so the new leader, reading after the fence, sees all of them.
//! - Positions are written as `SetPositions`, one command for every position a
//!   broker wrote in a round (coalesced across partitions and dispatchers), each entry applied
//!   or refused on its own.
//!
//! Why the metadata and not each partition's own group: a partition's Raft log is its segment
//! log, where an entry that is not a message is kept (in `raft/entries`, with its own fsync)
//! until retention deletes the segments around it; twenty checkpoints a second would grow it
//! for ever. The metadata group's log is snapshotted and purged, as pull groups' commits are.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::meta_state::{MetaOutcome, MetaState};
use super::types::BrokerId;

/// One dispatcher's position, as the metadata keeps it (the checkpoint file's content,
/// docs/storage.md, "Storage").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredPosition {
    /// The first offset not done.
    pub next: u64,
    /// Ranges `[start, end)` above `next` that are done (parallel lanes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub done: Vec<(u64, u64)>,
    /// The term it was written in, and its writer's count of writes in that term: a write
    /// that reaches the metadata after a later one of the same term (a round given up after a
    /// timeout that still commits) is refused, never moves the position back.
    #[serde(default)]
    pub term: u64,
    /// See `term`.
    #[serde(default)]
    pub seq: u64,
}

/// One position write, as [`MetaCommand::SetPositions`] carries it.
///
/// [`MetaCommand::SetPositions`]: super::meta_state::MetaCommand::SetPositions
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PositionWrite {
    /// The topic.
    pub topic: String,
    /// Its id (the incarnation the position is of).
    pub topic_id: String,
    /// The partition.
    pub partition: u32,
    /// The partition group's term the writer leads in.
    pub term: u64,
    /// The dispatcher (its consumerId, or `__redrive`).
    pub consumer: String,
    /// The position.
    pub position: StoredPosition,
}

/// Who delivers one partition, and its dispatchers' positions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionDelivery {
    /// The topic's id these are of.
    pub topic_id: String,
    /// The term of the leader that delivers it (the newest fence).
    pub term: u64,
    /// That leader.
    pub broker: BrokerId,
    /// Per dispatcher, its position.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub positions: BTreeMap<String, StoredPosition>,
}

impl MetaState {
    /// The fence of a partition's new leader: from now on only writes of `term` count.
    pub(super) fn deliver_partition(
        &mut self,
        topic: &str,
        topic_id: &str,
        partition: u32,
        term: u64,
        broker: BrokerId,
    ) -> Result<(), String> {
        self.check_partition(topic, topic_id, partition)?;
        let d = self
            .deliveries
            .entry(topic.to_owned())
            .or_default()
            .entry(partition)
            .or_default();
        if d.topic_id != topic_id {
            *d = PartitionDelivery {
                topic_id: topic_id.to_owned(),
                ..PartitionDelivery::default()
            };
        }
        if term < d.term || (term == d.term && broker != d.broker && d.term != 0) {
            return Err(format!(
                "{topic}/{partition} is delivered in term {} by broker {}",
                d.term, d.broker
            ));
        }
        d.term = term;
        d.broker = broker;
        Ok(())
    }

    /// Applies each write whose term is its partition's fence; answers which were refused.
    pub(super) fn set_positions(&mut self, writes: &[PositionWrite]) -> MetaOutcome {
        let each = writes
            .iter()
            .map(|w| {
                let d = self
                    .deliveries
                    .get_mut(&w.topic)
                    .and_then(|t| t.get_mut(&w.partition))
                    .filter(|d| d.topic_id == w.topic_id);
                match d {
                    Some(d) if d.term == w.term => {
                        let stale = d
                            .positions
                            .get(&w.consumer)
                            .is_some_and(|old| old.term == w.term && old.seq >= w.position.seq);
                        if stale {
                            return Some(format!(
                                "{}/{}: a later position of {} was written already",
                                w.topic, w.partition, w.consumer
                            ));
                        }
                        let mut position = w.position.clone();
                        position.term = w.term;
                        d.positions.insert(w.consumer.clone(), position);
                        None
                    }
                    Some(d) => Some(format!(
                        "{}/{} is delivered in term {}, not {}",
                        w.topic, w.partition, d.term, w.term
                    )),
                    None => Some(format!(
                        "{}/{} has no leader that fenced it",
                        w.topic, w.partition
                    )),
                }
            })
            .collect();
        MetaOutcome::Each(each)
    }

    /// The delivery record of `partition` of the incarnation `topic_id` of `topic`.
    pub fn delivery(
        &self,
        topic: &str,
        topic_id: &str,
        partition: u32,
    ) -> Option<&PartitionDelivery> {
        self.deliveries
            .get(topic)?
            .get(&partition)
            .filter(|d| d.topic_id == topic_id)
    }

    /// A deleted topic's positions go with it.
    pub(super) fn forget_deliveries(&mut self, topic: &str) {
        self.deliveries.remove(topic);
    }

    fn check_partition(&self, topic: &str, topic_id: &str, partition: u32) -> Result<(), String> {
        let t = self
            .topics
            .get(topic)
            .filter(|t| t.id == topic_id)
            .ok_or_else(|| {
                format!("topic {topic:?} ({topic_id}) is not in the cluster (any more)")
            })?;
        if partition as usize >= t.placement.len() {
            return Err(format!("no partition {partition} of {topic:?}"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::meta_state::MetaCommand;

    fn state() -> MetaState {
        let mut s = MetaState::default();
        for id in 1..=3 {
            s.apply(&MetaCommand::AddBroker {
                id,
                addr: format!("h:{id}"),
            });
        }
        s.apply(&MetaCommand::PutTopic {
            name: "t".into(),
            config: serde_json::json!({"partitions": 2}),
            replication_factor: None,
            id: Some("id1".into()),
        });
        s
    }

    fn write(term: u64, next: u64) -> PositionWrite {
        PositionWrite {
            topic: "t".into(),
            topic_id: "id1".into(),
            partition: 1,
            term,
            consumer: "c".into(),
            position: StoredPosition {
                next,
                seq: next,
                ..StoredPosition::default()
            },
        }
    }

    fn fence(s: &mut MetaState, term: u64, broker: BrokerId) -> MetaOutcome {
        s.apply(&MetaCommand::DeliverPartition {
            topic: "t".into(),
            topic_id: "id1".into(),
            partition: 1,
            term,
            broker,
        })
    }

    #[test]
    fn only_the_fenced_term_writes_positions() {
        let mut s = state();
        assert_eq!(
            s.apply(&MetaCommand::SetPositions {
                writes: vec![write(3, 10)]
            }),
            MetaOutcome::Each(vec![Some("t/1 has no leader that fenced it".into())])
        );
        assert_eq!(fence(&mut s, 3, 1), MetaOutcome::Done);
        s.apply(&MetaCommand::SetPositions {
            writes: vec![write(3, 10)],
        });
        assert_eq!(s.delivery("t", "id1", 1).unwrap().positions["c"].next, 10);
        // A new leader fences; the old one's late write is refused, the new one's taken.
        assert_eq!(fence(&mut s, 4, 2), MetaOutcome::Done);
        let MetaOutcome::Each(each) = s.apply(&MetaCommand::SetPositions {
            writes: vec![write(3, 20), write(4, 15)],
        }) else {
            panic!("not per entry")
        };
        assert!(each[0].is_some() && each[1].is_none());
        assert_eq!(s.delivery("t", "id1", 1).unwrap().positions["c"].next, 15);
        // A write of the same term that arrives after a later one is refused.
        let MetaOutcome::Each(each) = s.apply(&MetaCommand::SetPositions {
            writes: vec![write(4, 12)],
        }) else {
            panic!("not per entry")
        };
        assert!(each[0].is_some());
        assert_eq!(s.delivery("t", "id1", 1).unwrap().positions["c"].next, 15);
        // An older term cannot fence again, nor another broker in the same term.
        assert!(matches!(fence(&mut s, 3, 1), MetaOutcome::Refused(_)));
        assert!(matches!(fence(&mut s, 4, 3), MetaOutcome::Refused(_)));
        assert_eq!(fence(&mut s, 4, 2), MetaOutcome::Done);
    }

    #[test]
    fn a_topic_deleted_takes_its_positions() {
        let mut s = state();
        fence(&mut s, 1, 1);
        s.apply(&MetaCommand::DeleteTopic { name: "t".into() });
        assert!(s.delivery("t", "id1", 1).is_none());
        assert!(matches!(fence(&mut s, 2, 1), MetaOutcome::Refused(_)));
    }
}
