//! Produce ids in a cluster (docs/cluster.md, "Produce ids in a cluster"): the dedupe window of
//! contract §9 kept with each partition's replicated log, so that it survives a change of leader.
//!
//! Every replica remembers the id of each message its state machine applies (a committed
//! message), in its topic's table ([`crate::topics::dedup`]), and rebuilds the window from its
//! log when the group opens (in the background: the leader waits for it before deciding). Only a
//! partition's leader decides whether a message is new: after its term's first entry is applied
//! (then every message a previous leader committed is applied here too, and remembered), it
//! claims each id and proposes the new messages on the condition that its term has not changed;
//! an id already stored is answered with where it is, and an id still being written (a retry
//! racing its original) waits for that write. From its claims on, a write runs to its end in a
//! task of its own, so every claim is settled whatever happens to the request: stored when its
//! message is applied, withdrawn when its write fails (if that write was committed after all,
//! its leader having lost its leadership just after, the replicas remember it once they apply
//! it, and the next leader answers its retry `duplicate`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;

use super::rpc::{Endpoint, WriteRefused, with_lease, write_once};
use super::supervise::PartitionRaft;
use super::types::{Applied, Command};
use crate::storage::StorageError;
use crate::topics::TopicLog;
use crate::topics::dedup::{Claim, Ticket};

/// How long a write with ids waits for its leader's term to be applied here, for the ids to be
/// restored, or for a write of one of its ids under way, before it is refused as one to try
/// again (nothing written).
const WAIT: Duration = Duration::from_secs(3);

/// The produce ids of one partition's topic, as its group on this broker uses them.
pub struct PartitionIds {
    topic: Arc<TopicLog>,
    partition: u32,
    /// Whether the window was read from the log since the group opened.
    restored: AtomicBool,
    restored_now: tokio::sync::Notify,
}

impl std::fmt::Debug for PartitionIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionIds")
            .field("topic", &self.topic.topic)
            .field("partition", &self.partition)
            .finish_non_exhaustive()
    }
}

/// What a write with ids does with one of its messages.
enum Slot {
    /// Proposed (no id, or a new one: its claim).
    Write(Option<Ticket>),
    /// Already stored there: answered as a duplicate.
    Stored(u32, u64),
    /// The same id as an earlier message of this write: answered as that one's duplicate.
    Repeat(usize),
}

/// The id and timestamp of a stored message payload, if it carries an id. The payload is the
/// JSON `{"timestamp":…,"key":…,"content":…,"id":"…"}` with the id last
/// (`mmmq_core::write_produced_payload`), so only its ends are read: its content, however
/// large, is never parsed. A payload whose last field is not a string `id` has none (an
/// unescaped `,"id":"` cannot occur inside a JSON string, and content that ends the payload
/// ends in `}`, `]`, a literal or a string followed by the closing brace, never `"}` after an
/// `,"id":"`, unless it is the id).
///
/// A plugin's emit on a cluster member carries an id and its origin after it (docs/cluster.md,
/// "Delivery in a cluster"): a payload that may end with an origin is parsed whole instead
/// (its content skipped, not kept).
pub fn id_of(payload: &[u8]) -> Option<(String, u64)> {
    if let Some(found) = id_at_end(payload) {
        return Some(found);
    }
    if !payload.ends_with(b"}}") || memchr::memmem::rfind(payload, b",\"origin\":{").is_none() {
        return None;
    }
    #[derive(serde::Deserialize)]
    struct Head {
        timestamp: u64,
        #[serde(default)]
        id: Option<String>,
    }
    let head: Head = serde_json::from_slice(payload).ok()?;
    head.id.map(|id| (id, head.timestamp))
}

/// [`id_of`] for a payload whose last field is its id.
fn id_at_end(payload: &[u8]) -> Option<(String, u64)> {
    let body = payload.strip_suffix(b"}")?;
    if !body.ends_with(b"\"") {
        return None;
    }
    let at = memchr::memmem::rfind(body, b",\"id\":\"")?;
    let id: String = serde_json::from_slice(&body[at + 6..]).ok()?;
    let rest = payload.strip_prefix(b"{\"timestamp\":")?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    let timestamp = std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
    Some((id, timestamp))
}

impl PartitionIds {
    /// The ids of `partition` of `topic`, remembered for the topic's `dedupWindowMs` (read at
    /// each use: a topic's configuration can change).
    pub fn new(topic: Arc<TopicLog>, partition: u32) -> Self {
        Self {
            topic,
            partition,
            restored: AtomicBool::new(false),
            restored_now: tokio::sync::Notify::new(),
        }
    }

    /// The state machine applied `payload` at `offset`: its id, if it has one, is remembered.
    pub(super) fn applied(&self, payload: &[u8], offset: u64) {
        if let Some((id, at_ms)) = id_of(payload) {
            let position = (self.partition, offset);
            let (now, window) = (mmmq_core::now_ms(), self.topic.dedup_window_ms());
            self.topic
                .dedup
                .remember_applied(&id, at_ms, position, now, window);
        }
    }

    /// Whether [`PartitionIds::restore`] was done: a group opened again (after a storage error)
    /// keeps the ids it had, every one of them applied, so it does not read them again.
    pub(super) fn restored(&self) -> bool {
        self.restored.load(Ordering::SeqCst)
    }

    /// Remembers the ids of the window the partition's log holds up to its visible end (what
    /// its state machine applied), when its group first opens; the leader decides on ids only
    /// once this is done. Blocking.
    pub(super) fn restore(&self) -> Result<u64, StorageError> {
        let scanned = match self.topic.partition(self.partition) {
            Some(partition) => {
                let horizon = mmmq_core::now_ms().saturating_sub(self.topic.dedup_window_ms());
                crate::topics::id_restore::scan(&self.topic, &partition, 0, horizon)?
            }
            None => 0,
        };
        self.restored.store(true, Ordering::SeqCst);
        self.restored_now.notify_waiters();
        Ok(scanned)
    }

    /// Waits (up to [`WAIT`]) until [`PartitionIds::restore`] is done.
    async fn until_restored(&self) -> Result<(), WriteRefused> {
        let wait = async {
            loop {
                let notified = self.restored_now.notified();
                if self.restored.load(Ordering::SeqCst) {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(WAIT, wait).await.map_err(|_| {
            WriteRefused::Retry(
                "the partition's produce ids are still being read from its log".into(),
            )
        })
    }

    /// Writes `commands` at this broker, the partition's leader, storing only the messages whose
    /// ids are new (see the module's doc).
    pub(super) async fn write(
        self: &Arc<Self>,
        raft: &PartitionRaft,
        commands: Vec<Command>,
    ) -> Result<Vec<Applied>, WriteRefused> {
        let ids: Vec<Option<String>> = commands
            .iter()
            .map(|c| id_of(c.payload()).map(|(id, _)| id))
            .collect();
        if ids.iter().all(Option::is_none) {
            return Endpoint::write(raft, commands).await;
        }
        self.until_restored().await?;
        let (slots, term) = self.claim(raft, &ids).await?;
        // From here on the write is settled in a task of its own: dropped (a timeout, a request
        // gone), it would leave its claims pending and every retry of its ids waiting.
        let (this, raft) = (self.clone(), raft.clone());
        tokio::spawn(async move { this.propose(&raft, term, slots, commands).await })
            .await
            .unwrap_or_else(|e| Err(WriteRefused::Failed(format!("a write task failed: {e}"))))
    }

    /// Proposes the new messages of a claimed write in `term` (refused if the term changed:
    /// another term's leader has not been through [`term_applied`]), settles its claims and
    /// answers every message.
    async fn propose(
        &self,
        raft: &PartitionRaft,
        term: u64,
        slots: Vec<Slot>,
        commands: Vec<Command>,
    ) -> Result<Vec<Applied>, WriteRefused> {
        let proposed: Vec<Command> = slots
            .iter()
            .zip(commands)
            .filter_map(|(slot, c)| matches!(slot, Slot::Write(_)).then_some(c))
            .collect();
        let written = if proposed.is_empty() {
            Ok(Vec::new())
        } else {
            with_lease(raft, || async {
                if raft.metrics().borrow_watched().current_term != term {
                    return Err(WriteRefused::Retry(
                        "the partition's leader changed term before the write".into(),
                    ));
                }
                write_once(raft, proposed.clone()).await
            })
            .await
        };
        let written = match written {
            Ok(written) => written,
            Err(e) => {
                self.withdraw(&slots);
                return Err(e);
            }
        };
        let mut written = written.into_iter();
        let mut answers: Vec<Applied> = Vec::with_capacity(slots.len());
        for slot in &slots {
            let answer = match slot {
                Slot::Write(ticket) => {
                    let applied = written.next().unwrap_or(Applied::Nothing);
                    if let (Some(ticket), Applied::Offset(offset)) = (ticket, &applied) {
                        self.topic.dedup.stored(ticket, self.partition, *offset);
                    }
                    applied
                }
                Slot::Stored(partition, offset) => Applied::Duplicate {
                    partition: *partition,
                    offset: *offset,
                },
                Slot::Repeat(first) => match &answers[*first] {
                    Applied::Offset(offset) => Applied::Duplicate {
                        partition: self.partition,
                        offset: *offset,
                    },
                    other => other.clone(),
                },
            };
            answers.push(answer);
        }
        Ok(answers)
    }

    fn withdraw(&self, slots: &[Slot]) {
        for slot in slots {
            if let Slot::Write(Some(ticket)) = slot {
                self.topic.dedup.withdraw(ticket);
            }
        }
    }

    /// Claims every id of a write, in the term this leader applied its first entry of (checked
    /// again before every try). An id another write is storing is waited for with no claim held
    /// (two writes that each waited on the other's id while holding their own would wait
    /// forever), then every id is claimed again.
    async fn claim(
        &self,
        raft: &PartitionRaft,
        ids: &[Option<String>],
    ) -> Result<(Vec<Slot>, u64), WriteRefused> {
        let dedup = &self.topic.dedup;
        let mut first_of: HashMap<&str, usize> = HashMap::new();
        'again: loop {
            let term = term_applied(raft).await?;
            let (now, window) = (mmmq_core::now_ms(), self.topic.dedup_window_ms());
            first_of.clear();
            let mut slots: Vec<Slot> = Vec::with_capacity(ids.len());
            for (i, id) in ids.iter().enumerate() {
                let Some(id) = id else {
                    slots.push(Slot::Write(None));
                    continue;
                };
                if let Some(&first) = first_of.get(id.as_str()) {
                    slots.push(Slot::Repeat(first));
                    continue;
                }
                first_of.insert(id, i);
                match dedup.claim(id, now, window) {
                    Claim::New(ticket) => slots.push(Slot::Write(Some(ticket))),
                    Claim::Stored(partition, offset) => slots.push(Slot::Stored(partition, offset)),
                    Claim::Pending(other) => {
                        self.withdraw(&slots);
                        if tokio::time::timeout(WAIT, dedup.wait(&other))
                            .await
                            .is_err()
                        {
                            return Err(WriteRefused::Retry(format!(
                                "a write of produce id {id:?} is still under way"
                            )));
                        }
                        continue 'again;
                    }
                }
            }
            return Ok((slots, term));
        }
    }
}

/// Waits until this broker, leading the group, applied its term's first entry: then every
/// message committed before its term is applied here, and its id remembered. Answers the term;
/// refused as "not the leader" if it does not lead (or stops leading meanwhile).
pub(super) async fn term_applied(raft: &PartitionRaft) -> Result<u64, WriteRefused> {
    let applied = raft
        .wait(Some(WAIT))
        .metrics(
            |m| {
                m.state != openraft::ServerState::Leader
                    || m.last_applied
                        .is_some_and(|l| l.committed_leader_id().term == m.current_term)
            },
            "the leader's term applied",
        )
        .await;
    match applied {
        Ok(m) if m.state == openraft::ServerState::Leader => Ok(m.current_term),
        Ok(m) => Err(WriteRefused::NotLeader {
            leader: m.current_leader.filter(|l| *l != m.id),
        }),
        Err(e) => Err(WriteRefused::Retry(format!(
            "the leader has not applied its term's first entry yet ({e})"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::id_of;

    fn payload(content: &str, key: Option<&str>, id: Option<&str>) -> Vec<u8> {
        let mut out = Vec::new();
        let content: Box<serde_json::value::RawValue> =
            serde_json::value::RawValue::from_string(content.to_owned()).unwrap();
        mmmq_core::write_produced_payload(&mut out, 1234, key, &content, id);
        out
    }

    #[test]
    fn the_id_is_read_from_the_payloads_end_and_never_from_its_content() {
        assert_eq!(
            id_of(&payload(r#"{"a":1}"#, Some("k"), Some("order-1"))),
            Some(("order-1".to_owned(), 1234))
        );
        assert_eq!(
            id_of(&payload(r#""x""#, None, Some(r#"we"ird,"id":"x"#))),
            Some((r#"we"ird,"id":"x"#.to_owned(), 1234))
        );
        for content in [
            r#"{"id":"x"}"#,
            r#"{"a":{"b":1},"id":"x"}"#,
            r#"["id","x"]"#,
            r#"",\"id\":\"x""#,
            r#""x""#,
            "17",
        ] {
            assert_eq!(id_of(&payload(content, Some("k"), None)), None, "{content}");
            assert_eq!(id_of(&payload(content, None, None)), None, "{content}");
        }
    }

    #[test]
    fn an_emits_id_is_read_before_its_origin_and_never_from_content() {
        let emit = |content: &str, id: Option<&str>| {
            mmmq_core::StoredMessage {
                timestamp: 99,
                key: Some("k".into()),
                content: serde_json::value::RawValue::from_string(content.to_owned()).unwrap(),
                id: id.map(str::to_owned),
                origin: Some(mmmq_core::Origin {
                    consumer_id: "router".into(),
                    topic: "orders".into(),
                    partition: 0,
                    offset: 7,
                    index: 1,
                    topic_id: None,
                }),
                binary: Default::default(),
            }
            .to_payload()
        };
        assert_eq!(
            id_of(&emit(r#"{"a":1}"#, Some("__emit.x"))),
            Some(("__emit.x".to_owned(), 99))
        );
        assert_eq!(id_of(&emit(r#"{"id":"fake","origin":{}}"#, None)), None);
        assert_eq!(
            id_of(&payload(
                r#"{"x":"a","id":"fake","origin":{"consumerId":"c"}}"#,
                None,
                None
            )),
            None
        );
    }
}
