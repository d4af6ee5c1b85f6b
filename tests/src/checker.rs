//! The cluster checker (docs/cluster.md, "What a run is checked for"): after a fault run, every
//! replica's log and every acknowledgement producers received are compared, and what contract
//! §13 forbids is counted: acknowledged messages lost, offsets that hold different messages on
//! two replicas, messages no producer sent. Messages stored twice are counted too; they are
//! allowed only from a producer's retry without an id.
//!
//! Producers send contents `{"p": producer, "s": sequence}`, unique per message, so that a
//! stored message says which send it came from.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::Value;

/// One message as producers number it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MsgId {
    /// The producer.
    pub producer: u64,
    /// Its sequence number.
    pub seq: u64,
}

impl MsgId {
    /// The content a producer sends for this message.
    pub fn content(&self) -> Value {
        serde_json::json!({ "p": self.producer, "s": self.seq })
    }

    /// The message a stored content is, if it is one of ours.
    pub fn of(content: &Value) -> Option<MsgId> {
        Some(MsgId {
            producer: content.get("p")?.as_u64()?,
            seq: content.get("s")?.as_u64()?,
        })
    }
}

/// A partition: (topic, partition).
pub type PartitionKey = (String, u32);

/// An acknowledgement a producer received: the message is at that offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    /// Where.
    pub partition: PartitionKey,
    /// The offset the broker answered.
    pub offset: u64,
    /// What was sent.
    pub msg: MsgId,
}

/// What one broker's replica of a partition holds: offset → content.
#[derive(Debug, Clone, Default)]
pub struct Replica {
    /// The broker.
    pub broker: u64,
    /// Its contents by offset.
    pub entries: BTreeMap<u64, Value>,
}

/// What a run broke. Every list but `duplicates` must be empty.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Acknowledged messages not at their offset on some replica that holds that offset range,
    /// or on none at all.
    pub lost: Vec<String>,
    /// Offsets that hold different contents on two replicas.
    pub divergent: Vec<String>,
    /// Stored messages no producer sent.
    pub phantom: Vec<String>,
    /// Messages stored at more than one offset (a retry without an id).
    pub duplicates: usize,
    /// Which messages those are (once per extra copy), for a caller that tells producers apart.
    pub duplicated: Vec<MsgId>,
    /// Acknowledgements checked.
    pub acks: usize,
}

impl Report {
    /// Whether the run kept every promise of contract §13.
    pub fn clean(&self) -> bool {
        self.lost.is_empty() && self.divergent.is_empty() && self.phantom.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} acks: {} lost, {} divergent, {} phantom, {} stored twice",
            self.acks,
            self.lost.len(),
            self.divergent.len(),
            self.phantom.len(),
            self.duplicates
        )?;
        for (what, list) in [
            ("lost", &self.lost),
            ("divergent", &self.divergent),
            ("phantom", &self.phantom),
        ] {
            for line in list.iter().take(10) {
                write!(f, "\n  {what}: {line}")?;
            }
        }
        Ok(())
    }
}

/// Compares `replicas` (per partition) with `acks` and the set of messages producers `sent`.
pub fn check(
    replicas: &BTreeMap<PartitionKey, Vec<Replica>>,
    acks: &[Ack],
    sent: &BTreeSet<MsgId>,
) -> Report {
    let mut report = Report {
        acks: acks.len(),
        ..Report::default()
    };
    for ((topic, p), reps) in replicas {
        // One history: every offset two replicas both hold is the same message.
        let mut merged: BTreeMap<u64, (&Value, u64)> = BTreeMap::new();
        for r in reps {
            for (offset, content) in &r.entries {
                match merged.get(offset) {
                    Some((other, by)) if *other != content => report.divergent.push(format!(
                        "{topic}/{p} offset {offset}: broker {by} has {other}, broker {} has {content}",
                        r.broker
                    )),
                    Some(_) => {}
                    None => {
                        merged.insert(*offset, (content, r.broker));
                    }
                }
            }
        }
        let mut seen: BTreeMap<MsgId, u64> = BTreeMap::new();
        for (offset, (content, by)) in &merged {
            match MsgId::of(content) {
                Some(id) if sent.contains(&id) => {
                    if seen.insert(id, *offset).is_some() {
                        report.duplicates += 1;
                        report.duplicated.push(id);
                    }
                }
                _ => report.phantom.push(format!(
                    "{topic}/{p} offset {offset} on broker {by}: {content}"
                )),
            }
        }
    }
    for ack in acks {
        let (topic, p) = &ack.partition;
        let want = ack.msg.content();
        let reps = replicas
            .get(&ack.partition)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let holders: Vec<_> = reps
            .iter()
            .filter(|r| r.entries.get(&ack.offset) == Some(&want))
            .map(|r| r.broker)
            .collect();
        // Every replica must hold it: the run ends with every broker back and caught up.
        if holders.len() != reps.len() || reps.is_empty() {
            report.lost.push(format!(
                "{topic}/{p} offset {} ({:?}): held by brokers {holders:?} of {}",
                ack.offset,
                ack.msg,
                reps.len()
            ));
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: u64) -> MsgId {
        MsgId {
            producer: 1,
            seq: s,
        }
    }

    fn replica(broker: u64, seqs: &[u64]) -> Replica {
        Replica {
            broker,
            entries: seqs
                .iter()
                .enumerate()
                .map(|(o, s)| (o as u64, id(*s).content()))
                .collect(),
        }
    }

    fn run(reps: Vec<Replica>, acked: &[(u64, u64)], sent: &[u64]) -> Report {
        let key = ("t".to_owned(), 0);
        let acks: Vec<Ack> = acked
            .iter()
            .map(|(offset, s)| Ack {
                partition: key.clone(),
                offset: *offset,
                msg: id(*s),
            })
            .collect();
        let sent = sent.iter().map(|s| id(*s)).collect();
        check(&BTreeMap::from([(key, reps)]), &acks, &sent)
    }

    #[test]
    fn a_clean_run_is_clean() {
        let r = run(
            vec![replica(1, &[0, 1, 2]), replica(2, &[0, 1, 2])],
            &[(0, 0), (2, 2)],
            &[0, 1, 2],
        );
        assert!(r.clean(), "{r}");
        assert_eq!(r.duplicates, 0);
    }

    #[test]
    fn each_broken_promise_is_counted() {
        // Broker 2 lost offset 2 and holds another message at offset 1.
        let r = run(
            vec![replica(1, &[0, 1, 2]), replica(2, &[0, 3])],
            &[(0, 0), (2, 2)],
            &[0, 1, 2, 3],
        );
        assert_eq!(r.lost.len(), 1, "{r}");
        assert_eq!(r.divergent.len(), 1, "{r}");
        let phantom = run(vec![replica(1, &[0, 9])], &[], &[0]);
        assert_eq!(phantom.phantom.len(), 1);
        let twice = run(vec![replica(1, &[0, 0])], &[], &[0]);
        assert_eq!(twice.duplicates, 1);
        assert_eq!(twice.duplicated, [id(0)]);
        assert!(twice.clean());
        let wrong_offset = run(vec![replica(1, &[1, 0])], &[(0, 0)], &[0, 1]);
        assert_eq!(wrong_offset.lost.len(), 1);
    }
}
