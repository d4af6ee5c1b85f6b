//! Which plugin version handled which message (docs/plugins.md, "Replay"): what `mmmq plugin replay`
//! reads to run the exact version that handled a message.
//!
//! A plugin dispatcher keeps, beside its checkpoint in each partition it reads,
//! `checkpoints/{consumerId}.handlers`, JSON lines appended and synced before a version handles
//! its first message where that record does not already say so:
//!
//! ```text
//! {"session":{"next":120,"done":[[130,140]],"lanes":4,"laneHash":"xxh3"},"at":1764561600000}   a start
//! {"lane":0,"from":120,"version":"82a820d4f2b06a63"}                          lane 0 runs this version from offset 120
//! ```
//!
//! Within one lane messages are handled in offset order, one run after another, so "version V
//! from offset F" is exact for that lane until its next line — including a retry, which is a new
//! run from the retried offset. A session line starts a dispatcher's life over a partition (a
//! restart, a changed `dispatchers.json`) with the position it resumed from: a message below
//! `next` or in a `done` range was handled in an earlier session. So the version that last
//! handled offset N with key K is found by going back through the sessions to the first that did
//! not resume past N, and taking the last line of N's lane there (the lane is K's, or N's
//! without a key, by the session's lane count and [`LaneHash`]) whose `from` is at or before N.
//!
//! The bytes of each version are kept where replay finds them: a deployed plugin's in the plugin
//! store, and what a `plugin.path` dispatcher loaded in [`Handlers::loaded_dir`] (written by the
//! plugin target before the version serves).
//!
//! The steady state costs nothing on disk: a line is written only at a start and when a lane
//! first runs another version. Runs of a redrive are not recorded (replay them with
//! `--version`). The file is cut to its newer half when a start finds it over
//! [`MAX_FILE_BYTES`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Weak};

use mmmq_core::{ConsumerId, Topic};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::dispatch::LaneHash;
use crate::storage::{Checkpoints, StorageError};
use crate::topics::{Partition, Registry};

/// The extension of the record beside a checkpoint.
pub const EXT: &str = "handlers";

/// Past this size a start rewrites the record keeping its newer half (whole sessions).
pub const MAX_FILE_BYTES: usize = 256 << 10;

/// One line of the record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Line {
    /// A dispatcher started reading the partition.
    Session {
        /// Where it resumed.
        session: Resumed,
        /// When, in milliseconds since the epoch.
        at: u64,
    },
    /// A lane runs `version` from offset `from` on.
    Lane {
        /// The lane.
        lane: u32,
        /// The first offset of its first run on that version.
        from: u64,
        /// The version (16 hex digits of the component's SHA-256).
        version: String,
    },
}

/// The position a session resumed from, and its lane count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resumed {
    /// Everything below was done before.
    pub next: u64,
    /// Ranges `[start, end)` above `next` done before.
    #[serde(default)]
    pub done: Vec<(u64, u64)>,
    /// The dispatcher's lanes (`maxInFlight`).
    pub lanes: u32,
    /// How it spread keys over them; a record written before lanes had their own hash names
    /// none (the partitioner's).
    #[serde(default, rename = "laneHash")]
    pub lane_hash: LaneHash,
}

/// The record of one plugin dispatcher, over every partition it reads.
pub struct Handlers {
    registry: Arc<Registry>,
    consumer_id: ConsumerId,
    lanes: u32,
    parts: Mutex<HashMap<(Topic, u32), Part>>,
}

/// What is recorded for one partition in this session: the version each lane last ran.
struct Part {
    /// The partition object (a topic deleted and created again is another one, with an empty
    /// record).
    of: Weak<Partition>,
    lanes: Vec<Option<String>>,
}

impl Handlers {
    /// The record of `consumer_id`, whose dispatcher runs `lanes` lanes per partition.
    pub fn new(registry: Arc<Registry>, consumer_id: ConsumerId, lanes: u32) -> Self {
        Self {
            registry,
            consumer_id,
            lanes: lanes.max(1),
            parts: Mutex::new(HashMap::new()),
        }
    }

    /// Where a `plugin.path` dispatcher keeps the versions it loads, so replay finds each of them
    /// after its file changed ([`crate::plugin::kept::loaded_dir`]), in the root dir: the directory
    /// that holds `topics/`.
    pub fn loaded_dir(&self) -> Option<PathBuf> {
        let root = self.registry.dir().parent()?;
        Some(crate::plugin::kept::loaded_dir(
            root,
            self.consumer_id.as_str(),
        ))
    }

    /// Records, if it is not already recorded, that `lane` of `partition` of `topic` runs
    /// `version` from offset `from`. Durable when it returns. Blocking: an fsync when it writes.
    pub fn note(
        &self,
        topic: &Topic,
        partition: u32,
        lane: u32,
        from: u64,
        version: &str,
    ) -> Result<(), StorageError> {
        let Some(p) = self
            .registry
            .get(topic)
            .and_then(|t| t.partition(partition))
        else {
            // The topic is gone: nothing of it is left to replay.
            return Ok(());
        };
        let mut parts = self.parts.lock();
        let key = (topic.clone(), partition);
        let known = parts
            .get(&key)
            .is_some_and(|part| Weak::ptr_eq(&part.of, &Arc::downgrade(&p)));
        if known
            && parts[&key]
                .lanes
                .get(lane as usize)
                .and_then(Option::as_deref)
                == Some(version)
        {
            return Ok(());
        }
        let mut lines = String::new();
        if !known {
            compact(&p.checkpoints, &self.consumer_id)?;
            let resumed = p
                .checkpoints
                .read_position(&self.consumer_id)?
                .unwrap_or_default();
            push_line(
                &mut lines,
                &Line::Session {
                    session: Resumed {
                        next: resumed.next,
                        done: resumed.done,
                        lanes: self.lanes,
                        lane_hash: LaneHash::Xxh3,
                    },
                    at: mmmq_core::now_ms(),
                },
            );
        }
        push_line(
            &mut lines,
            &Line::Lane {
                lane,
                from,
                version: version.to_owned(),
            },
        );
        p.checkpoints
            .append_beside(&self.consumer_id, EXT, lines.as_bytes())?;
        let part = parts.entry(key).or_insert_with(|| Part {
            of: Arc::downgrade(&p),
            lanes: Vec::new(),
        });
        if !known {
            part.of = Arc::downgrade(&p);
            part.lanes.clear();
        }
        if part.lanes.len() <= lane as usize {
            part.lanes.resize(lane as usize + 1, None);
        }
        part.lanes[lane as usize] = Some(version.to_owned());
        Ok(())
    }
}

fn push_line(out: &mut String, line: &Line) {
    out.push_str(&serde_json::to_string(line).expect("a line serializes"));
    out.push('\n');
}

/// Rewrites the record keeping its newer half when it has grown past [`MAX_FILE_BYTES`].
fn compact(checkpoints: &Checkpoints, id: &ConsumerId) -> Result<(), StorageError> {
    let Some(raw) = checkpoints.read_beside(id, EXT)? else {
        return Ok(());
    };
    if raw.len() <= MAX_FILE_BYTES {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&raw);
    let half = text.len() / 2;
    // The first session line in the newer half.
    let cut = text
        .match_indices('\n')
        .map(|(i, _)| i + 1)
        .filter(|&i| i >= half)
        .find(|&i| text[i..].starts_with("{\"session\""))
        .unwrap_or(text.len());
    checkpoints.write_beside(id, EXT, text[cut..].as_bytes())
}

/// Reads a record (a torn or unreadable line is skipped).
pub fn parse(raw: &[u8]) -> Vec<Line> {
    String::from_utf8_lossy(raw)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The version that last handled the message at `offset` with `key`, by the record's `lines`
/// (see the module's documentation), or `None` if the record does not say.
pub fn version_for(lines: &[Line], offset: u64, key: Option<&str>) -> Option<String> {
    let starts: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| matches!(l, Line::Session { .. }))
        .map(|(i, _)| i)
        .collect();
    for (n, &start) in starts.iter().enumerate().rev() {
        let Line::Session { session, .. } = &lines[start] else {
            unreachable!("a session start")
        };
        let before =
            offset < session.next || session.done.iter().any(|&(s, e)| (s..e).contains(&offset));
        if before {
            continue;
        }
        let end = starts.get(n + 1).copied().unwrap_or(lines.len());
        let lane = session.lane_hash.lane(key, offset, session.lanes as usize) as u32;
        let found = lines[start + 1..end].iter().rev().find_map(|l| match l {
            Line::Lane {
                lane: l,
                from,
                version,
            } if *l == lane && *from <= offset => Some(version.clone()),
            _ => None,
        });
        if found.is_some() {
            return found;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(next: u64, done: Vec<(u64, u64)>, lanes: u32) -> Line {
        Line::Session {
            session: Resumed {
                next,
                done,
                lanes,
                lane_hash: LaneHash::Xxh3,
            },
            at: 0,
        }
    }

    fn lane(lane: u32, from: u64, version: &str) -> Line {
        Line::Lane {
            lane,
            from,
            version: version.into(),
        }
    }

    #[test]
    fn a_lane_runs_each_version_from_its_line_until_the_next() {
        let lines = vec![session(0, vec![], 1), lane(0, 0, "v1"), lane(0, 7, "v2")];
        assert_eq!(version_for(&lines, 0, None).as_deref(), Some("v1"));
        assert_eq!(version_for(&lines, 6, None).as_deref(), Some("v1"));
        assert_eq!(version_for(&lines, 7, None).as_deref(), Some("v2"));
        // A retry of 5 on v2 (after 7 was handled) is a line from 5: v2 handled 5 last.
        let mut retried = lines.clone();
        retried.push(lane(0, 5, "v2"));
        assert_eq!(version_for(&retried, 5, None).as_deref(), Some("v2"));
    }

    #[test]
    fn lanes_switch_on_their_own_and_a_message_is_found_in_its_lane() {
        // Two lanes by offset (keyless): lane 1 still ran v1 on 9 after lane 0 switched at 6.
        let lines = vec![
            session(0, vec![], 2),
            lane(0, 0, "v1"),
            lane(1, 1, "v1"),
            lane(0, 6, "v2"),
            lane(1, 11, "v2"),
        ];
        assert_eq!(version_for(&lines, 8, None).as_deref(), Some("v2"));
        assert_eq!(version_for(&lines, 9, None).as_deref(), Some("v1"));
        assert_eq!(version_for(&lines, 11, None).as_deref(), Some("v2"));
        // By key: the lane is the key's.
        let k = "customer-42";
        let l = crate::dispatch::lane_of(Some(k), 0, 2) as u32;
        let keyed = vec![
            session(0, vec![], 2),
            lane(l, 3, "v1"),
            lane(1 - l, 0, "v9"),
        ];
        assert_eq!(version_for(&keyed, 4, Some(k)).as_deref(), Some("v1"));
    }

    #[test]
    fn a_message_done_before_a_restart_belongs_to_the_session_that_did_it() {
        let lines = vec![
            session(0, vec![], 2),
            lane(0, 0, "v1"),
            lane(1, 1, "v1"),
            // Restarted at 4 with 5 done, on v2.
            session(4, vec![(5, 6)], 2),
            lane(0, 4, "v2"),
            lane(1, 7, "v2"),
        ];
        assert_eq!(version_for(&lines, 3, None).as_deref(), Some("v1"));
        assert_eq!(version_for(&lines, 4, None).as_deref(), Some("v2"));
        assert_eq!(version_for(&lines, 5, None).as_deref(), Some("v1"));
        assert_eq!(version_for(&lines, 7, None).as_deref(), Some("v2"));
        assert_eq!(version_for(&[], 0, None), None);
    }

    /// A session written before lanes had their own hash names no function: its keys are found
    /// in the lanes Kafka's partitioner gave them, a later session's in their own.
    #[test]
    fn a_session_that_names_no_lane_hash_spread_keys_by_the_partitioner() {
        let k = (0..)
            .map(|i| format!("k{i}"))
            .find(|k| LaneHash::Murmur2.lane(Some(k), 0, 8) != LaneHash::Xxh3.lane(Some(k), 0, 8))
            .unwrap();
        let (old, new) = (
            LaneHash::Murmur2.lane(Some(&k), 0, 8),
            LaneHash::Xxh3.lane(Some(&k), 0, 8),
        );
        let raw = format!(
            "{{\"session\":{{\"next\":0,\"lanes\":8}},\"at\":5}}\n\
             {{\"lane\":{old},\"from\":0,\"version\":\"old\"}}\n\
             {{\"lane\":{new},\"from\":0,\"version\":\"other\"}}\n"
        );
        let mut lines = parse(raw.as_bytes());
        assert_eq!(lines.len(), 3);
        assert_eq!(version_for(&lines, 3, Some(&k)).as_deref(), Some("old"));
        lines.extend([
            session(10, vec![], 8),
            lane(new as u32, 10, "v2"),
            lane(old as u32, 10, "wrong"),
        ]);
        assert_eq!(version_for(&lines, 3, Some(&k)).as_deref(), Some("old"));
        assert_eq!(version_for(&lines, 12, Some(&k)).as_deref(), Some("v2"));
        let written = serde_json::to_string(&lines[3]).unwrap();
        assert!(written.contains(r#""laneHash":"xxh3""#), "{written}");
    }

    #[test]
    fn torn_lines_are_skipped() {
        let raw = b"{\"session\":{\"next\":0,\"lanes\":1},\"at\":5}\n{\"lane\":0,\"from\":0,\"version\":\"v1\"}\n{\"lane\":0,\"fr";
        let lines = parse(raw);
        assert_eq!(lines.len(), 2);
        assert_eq!(version_for(&lines, 3, None).as_deref(), Some("v1"));
    }
}
