//! Dead-letter redrives in the cluster's metadata (docs/cluster.md, "Delivery in a cluster").
//!
//! On one broker a redrive is a set of workers in that broker's memory. In a cluster the
//! dead-letter partition's leader can change mid-redrive, so the redrive itself is metadata: its
//! range per partition and the name of its position. Every broker runs a redrive worker per
//! dead-letter partition for the newest record; the partition's leader delivers, from the
//! replicated position, and the next leader continues from there, until the position reaches
//! the range's end.
//!
//! - A redrive without `from` keeps its position as `__redrive`, the one the next such redrive
//!   starts from (as on one broker). One of an explicit range keeps it as `__redrive.{run}`, a
//!   name no other run uses, dropped when the next redrive starts.
//! - A redrive is running while one of its partitions' replicated positions is short of its
//!   end; one at a time per dispatcher: a `StartRedrive` while one runs is refused, here, where
//!   every broker decides alike.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::meta_state::MetaState;

/// The position name of a redrive that continues the last one (`dispatch::redrive`'s).
pub const CONTINUED: &str = "__redrive";

/// One partition of a redrive: offsets `from`…`to`−1 of the dead-letter topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RedrivePart {
    /// The dead-letter topic's partition.
    pub partition: u32,
    /// Where it starts.
    pub from: u64,
    /// Where it ends (exclusive).
    pub to: u64,
}

/// A redrive as it is asked for: what the broker asked decided (`StartRedrive` carries it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RedriveAsked {
    /// The dead-letter topic.
    pub topic: String,
    /// The dead-letter topic's id (the incarnation it redrives).
    pub topic_id: String,
    /// When it was asked for (milliseconds since the Unix epoch).
    pub started_at: u64,
    /// Its range per partition.
    pub parts: Vec<RedrivePart>,
}

/// A dispatcher's last redrive, as every broker runs it: what was asked, with what applying it
/// gave it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RedriveMeta {
    /// Its number, unique in the cluster: a broker runs a record once.
    pub run: u64,
    /// The name its position is replicated under.
    pub position: String,
    /// What was asked.
    #[serde(flatten)]
    pub asked: RedriveAsked,
}

impl MetaState {
    /// `StartRedrive`: `consumer`'s new redrive of its dead-letter topic, refused while the
    /// last one runs or when the topic is not the incarnation the request names.
    pub(super) fn start_redrive(
        &mut self,
        consumer: &str,
        request: &RedriveAsked,
        continues: bool,
    ) -> Result<(), String> {
        let topic = request.topic.as_str();
        let t = self
            .topics
            .get(topic)
            .filter(|t| t.id == request.topic_id)
            .ok_or_else(|| format!("topic {topic:?} is not in the cluster (any more)"))?;
        if let Some(p) = request
            .parts
            .iter()
            .find(|p| p.partition as usize >= t.placement.len() || p.from > p.to)
        {
            return Err(format!(
                "no partition {} of {topic:?} to redrive",
                p.partition
            ));
        }
        if self.redrive_running(consumer) {
            return Err(format!(
                "a redrive of {consumer:?} is already running; its progress is in the dispatcher's status"
            ));
        }
        self.redrive_runs += 1;
        let run = self.redrive_runs;
        let position = if continues {
            CONTINUED.to_owned()
        } else {
            format!("{CONTINUED}.{run}")
        };
        // The last explicit range's position is of no use any more.
        let explicit = format!("{CONTINUED}.");
        if let Some(partitions) = self.deliveries.get_mut(topic) {
            for d in partitions.values_mut() {
                d.positions.retain(|name, _| !name.starts_with(&explicit));
            }
        }
        self.redrives.insert(
            consumer.to_owned(),
            RedriveMeta {
                run,
                position,
                asked: request.clone(),
            },
        );
        Ok(())
    }

    /// `consumer`'s last redrive, if its dead-letter topic is still the incarnation it
    /// redrives.
    pub fn redrive(&self, consumer: &str) -> Option<&RedriveMeta> {
        let r = self.redrives.get(consumer)?;
        let t = self.topics.get(&r.asked.topic)?;
        (t.id == r.asked.topic_id).then_some(r)
    }

    /// Where `part` of the redrive `r` got to, as replicated (its `from` until a leader wrote
    /// a position).
    pub fn redrive_next(&self, r: &RedriveMeta, part: &RedrivePart) -> u64 {
        self.delivery(&r.asked.topic, &r.asked.topic_id, part.partition)
            .and_then(|d| d.positions.get(&r.position))
            .map_or(part.from, |p| p.next)
            .max(part.from)
    }

    /// Whether `consumer`'s last redrive has a partition short of its end.
    pub fn redrive_running(&self, consumer: &str) -> bool {
        self.redrive(consumer)
            .is_some_and(|r| r.asked.parts.iter().any(|p| self.redrive_next(r, p) < p.to))
    }

    /// A deleted dead-letter topic takes its dispatcher's redrive with it.
    pub(super) fn forget_redrives(&mut self, topic: &str) {
        self.redrives.retain(|_, r| r.asked.topic != topic);
    }
}

/// Every redrive record by consumerId (the metadata's field).
pub type Redrives = BTreeMap<String, RedriveMeta>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::meta_state::{MetaCommand, MetaOutcome, PositionWrite, StoredPosition};

    const DLQ: &str = "__dlq.c";

    fn state() -> MetaState {
        let mut s = MetaState::default();
        s.apply(&MetaCommand::AddBroker {
            id: 1,
            addr: "h:1".into(),
        });
        s.apply(&MetaCommand::PutTopic {
            name: DLQ.into(),
            config: serde_json::json!({"partitions": 1}),
            replication_factor: None,
            id: Some("id1".into()),
        });
        s
    }

    fn start(s: &mut MetaState, from: Option<u64>, to: u64) -> MetaOutcome {
        s.apply(&MetaCommand::StartRedrive {
            consumer: "c".into(),
            continues: from.is_none(),
            redrive: RedriveAsked {
                topic: DLQ.into(),
                topic_id: "id1".into(),
                started_at: 7,
                parts: vec![RedrivePart {
                    partition: 0,
                    from: from.unwrap_or(0),
                    to,
                }],
            },
        })
    }

    fn reach(s: &mut MetaState, position: &str, term: u64, next: u64) {
        s.apply(&MetaCommand::DeliverPartition {
            topic: DLQ.into(),
            topic_id: "id1".into(),
            partition: 0,
            term,
            broker: 1,
        });
        let written = s.apply(&MetaCommand::SetPositions {
            writes: vec![PositionWrite {
                topic: DLQ.into(),
                topic_id: "id1".into(),
                partition: 0,
                term,
                consumer: position.into(),
                position: StoredPosition {
                    next,
                    seq: next,
                    ..StoredPosition::default()
                },
            }],
        });
        assert_eq!(written, MetaOutcome::Each(vec![None]));
    }

    #[test]
    fn one_redrive_at_a_time_each_with_its_own_position() {
        let mut s = state();
        assert_eq!(start(&mut s, None, 10), MetaOutcome::Done);
        let r = s.redrive("c").unwrap().clone();
        assert_eq!((r.run, r.position.as_str()), (1, "__redrive"));
        assert!(s.redrive_running("c"));
        // Refused while it runs, across a change of the partition's leader.
        reach(&mut s, "__redrive", 1, 6);
        assert!(matches!(start(&mut s, None, 12), MetaOutcome::Refused(_)));
        reach(&mut s, "__redrive", 2, 10);
        assert!(!s.redrive_running("c"));
        // An explicit range has a position of its own, which the next redrive drops.
        assert_eq!(start(&mut s, Some(2), 4), MetaOutcome::Done);
        let r = s.redrive("c").unwrap().clone();
        assert_eq!((r.run, r.position.as_str()), (2, "__redrive.2"));
        assert_eq!(s.redrive_next(&r, &r.asked.parts[0]), 2);
        reach(&mut s, "__redrive.2", 2, 4);
        assert!(!s.redrive_running("c"));
        assert_eq!(start(&mut s, None, 12), MetaOutcome::Done);
        let positions = &s.delivery(DLQ, "id1", 0).unwrap().positions;
        assert_eq!(positions.keys().collect::<Vec<_>>(), ["__redrive"]);
        // It continues where the last redrive without `from` stopped.
        let r = &s.redrives["c"];
        assert_eq!(s.redrive_next(r, &r.asked.parts[0]), 10);
    }

    #[test]
    fn a_deleted_dead_letter_topic_takes_its_redrive() {
        let mut s = state();
        assert_eq!(start(&mut s, None, 10), MetaOutcome::Done);
        s.apply(&MetaCommand::DeleteTopic { name: DLQ.into() });
        assert!(s.redrives.is_empty() && !s.redrive_running("c"));
        // Another incarnation's id is refused.
        assert!(matches!(start(&mut s, None, 1), MetaOutcome::Refused(_)));
        let roundtrip: MetaState =
            serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(roundtrip, s);
    }
}
