//! Produce ids in a cluster (docs/cluster.md, "Produce ids in a cluster"): the dedupe window of
//! contract §9 kept with each partition's replicated log, so that it survives a change of leader.
//!
//! Every replica remembers the id of each message its state machine applies (a committed
//! message), in its topic's table ([`crate::topics::dedup`]), and rebuilds the window from its
//! log when the group opens. Only a partition's leader decides whether a message is new: after
//! its term's first entry is applied (then every message a previous leader committed is applied
//! here too, and remembered), it claims each id before it proposes the message; an id already
//! stored is answered with where it is, and an id still being written (a retry racing its
//! original) waits for that write. A claim whose write fails is withdrawn, as on one broker; if
//! the write was committed after all (its leader lost its leadership just after), the replicas
//! remember it once they apply it, and the next leader answers its retry `duplicate`.

use std::sync::Arc;

use super::rpc::{Endpoint, WriteRefused};
use super::supervise::PartitionRaft;
use super::types::{Applied, Command};
use crate::storage::StorageError;
use crate::topics::TopicLog;
use crate::topics::dedup::{Claim, Ticket};

/// How long a write with ids waits for its leader's term to be applied here (a new leader
/// applies what it holds of its predecessors' entries first).
const BARRIER_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The produce ids of one partition's topic, as its group on this broker uses them.
pub struct PartitionIds {
    topic: Arc<TopicLog>,
    partition: u32,
    /// The topic's `dedupWindowMs` now (a topic's configuration can change).
    window_ms: Box<dyn Fn() -> u64 + Send + Sync>,
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

/// The id and timestamp of a stored message payload, if it carries an id (docs/storage.md:
/// the payload is JSON with `timestamp`, `key`, `content` and, last, `id`). A payload without
/// `"id":` anywhere is passed over without being parsed.
pub fn id_of(payload: &[u8]) -> Option<(String, u64)> {
    #[derive(serde::Deserialize)]
    struct IdAndTime {
        timestamp: u64,
        #[serde(default)]
        id: Option<String>,
    }
    memchr::memmem::find(payload, b"\"id\":")?;
    let m: IdAndTime = serde_json::from_slice(payload).ok()?;
    Some((m.id?, m.timestamp))
}

impl PartitionIds {
    /// The ids of `partition` of `topic`, remembered for `window_ms()`.
    pub fn new(
        topic: Arc<TopicLog>,
        partition: u32,
        window_ms: Box<dyn Fn() -> u64 + Send + Sync>,
    ) -> Self {
        Self {
            topic,
            partition,
            window_ms,
        }
    }

    /// The state machine applied `payload` at `offset`: its id, if it has one, is remembered.
    pub(super) fn applied(&self, payload: &[u8], offset: u64) {
        if let Some((id, at_ms)) = id_of(payload) {
            self.topic
                .dedup
                .remember(&id, at_ms, self.partition, offset);
        }
    }

    /// Remembers the ids of the window the partition's log holds up to its visible end (what
    /// its state machine applied), when its group opens. Blocking.
    pub(super) fn restore(&self) -> Result<u64, StorageError> {
        let Some(partition) = self.topic.partition(self.partition) else {
            return Ok(0);
        };
        let horizon = mmmq_core::now_ms().saturating_sub((self.window_ms)());
        crate::topics::id_restore::scan(&self.topic, &partition, 0, horizon)
    }

    /// Writes `commands` at this broker, the partition's leader, storing only the messages whose
    /// ids are new (see the module's doc).
    pub(super) async fn write(
        &self,
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
        term_applied(raft).await?;
        let slots = self.claim(&ids).await;
        let mut proposed = Vec::new();
        for (slot, command) in slots.iter().zip(commands) {
            if let Slot::Write(_) = slot {
                proposed.push(command);
            }
        }
        let written = if proposed.is_empty() {
            Vec::new()
        } else {
            match Endpoint::write(raft, proposed).await {
                Ok(written) => written,
                Err(e) => {
                    for slot in &slots {
                        if let Slot::Write(Some(ticket)) = slot {
                            self.topic.dedup.withdraw(ticket);
                        }
                    }
                    return Err(e);
                }
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

    /// Claims every id of a write. An id another write is storing is waited for with no claim
    /// held (two writes that each waited on the other's id while holding their own would wait
    /// forever), then every id is claimed again.
    async fn claim(&self, ids: &[Option<String>]) -> Vec<Slot> {
        let dedup = &self.topic.dedup;
        'again: loop {
            let (now, window) = (mmmq_core::now_ms(), (self.window_ms)());
            let mut slots: Vec<Slot> = Vec::with_capacity(ids.len());
            for (i, id) in ids.iter().enumerate() {
                let Some(id) = id else {
                    slots.push(Slot::Write(None));
                    continue;
                };
                if let Some(first) = ids[..i].iter().position(|e| e.as_ref() == Some(id)) {
                    slots.push(Slot::Repeat(first));
                    continue;
                }
                match dedup.claim(id, now, window) {
                    Claim::New(ticket) => slots.push(Slot::Write(Some(ticket))),
                    Claim::Stored(partition, offset) => slots.push(Slot::Stored(partition, offset)),
                    Claim::Pending(other) => {
                        for slot in &slots {
                            if let Slot::Write(Some(mine)) = slot {
                                dedup.withdraw(mine);
                            }
                        }
                        dedup.wait(&other).await;
                        continue 'again;
                    }
                }
            }
            return slots;
        }
    }
}

/// Waits until this broker, leading the group, applied its term's first entry: then every
/// message committed before its term is applied here, and its id remembered. Refused as "not
/// the leader" if it does not lead (or stops leading meanwhile).
async fn term_applied(raft: &PartitionRaft) -> Result<(), WriteRefused> {
    let applied = raft
        .wait(Some(BARRIER_WAIT))
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
        Ok(m) if m.state == openraft::ServerState::Leader => Ok(()),
        Ok(m) => Err(WriteRefused::NotLeader {
            leader: m.current_leader.filter(|l| *l != m.id),
        }),
        // Nothing was written: a retry (these writes carry ids) is safe.
        Err(e) => Err(WriteRefused::Unknown(format!(
            "the leader has not applied its term's first entry yet ({e}); nothing was written"
        ))),
    }
}
