//! A clustered partition's state machine (docs/cluster.md, "Clustered partitions on disk"). The
//! partition's messages are its log's frames already, so applying one moves nothing but the
//! log's visible end: readers (pull, dispatch, listings) see a message once a majority holds it
//! and it was applied, and the write that proposed it hears its offset.
//!
//! Its state is three values: the last applied log id, the last membership, and the offset the
//! next message takes. They are written to `raft/applied` lazily — about once a second while it
//! applies, and at [`PartitionMachine::close`] — since a lower bound is safe: openraft applies
//! the entries after it again, which recomputes the same offsets and only moves the visible end
//! forward. A snapshot is those three values too ([`PartitionSnapshot`]): what a follower that
//! installs one holds is a log that starts over, empty, at its next offset (the messages before
//! it are on the replicas that kept them).
//!
//! Snapshots are taken only where retention purges the log (`retain`: at the last entry of the
//! segments it deletes, docs/cluster.md, "Retention in a cluster").

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{FutureExt, Stream, StreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::ids::PartitionIds;
use super::log_store::{SegmentLogStore, Shared, StoreError, blocking};
use super::network::SnapshotBytes;
use super::types::{Applied, Command, GroupKind, LogId, Raft};

mod retain;
pub use retain::RetentionTarget;

/// The state machine's file of its last applied state, in `raft/`.
pub const APPLIED: &str = "applied";
/// The current snapshot's file, in `raft/`.
pub const SNAPSHOT: &str = "snapshot";

/// How often, at most, applying writes the applied state.
const PERSIST_EVERY: Duration = Duration::from_secs(1);

/// A membership as a state machine keeps it.
pub type Membership = openraft::alias::StoredMembershipOf<Raft>;
/// A snapshot's metadata.
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<Raft>;
/// A snapshot of a partition.
pub type Snapshot = openraft::alias::SnapshotOf<Raft, SnapshotBytes>;

/// All a partition's state machine holds, and so its snapshot: a follower that installs it
/// continues at `next_offset`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionSnapshot {
    /// The last applied log id.
    pub last_log_id: Option<LogId>,
    /// The last membership applied.
    pub membership: Membership,
    /// The offset of the next message.
    pub next_offset: u64,
}

/// The current snapshot as `raft/snapshot` holds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SnapshotFile {
    pub(crate) meta: SnapshotMeta,
    pub(crate) data: PartitionSnapshot,
}

/// A partition's state machine on its [`SegmentLogStore`].
pub struct PartitionMachine {
    shared: Arc<Shared>,
    state: PartitionSnapshot,
    /// When the applied state was last written.
    persisted: Instant,
    /// The current snapshot (shared with the snapshot builders).
    current: Arc<Mutex<Option<SnapshotFile>>>,
    /// The topic's produce ids, told of every message applied (docs/cluster.md, "Produce ids in
    /// a cluster"); `None` in the log store's own tests.
    ids: Option<Arc<PartitionIds>>,
    /// The snapshot retention asked for, built at its purge point (`retain`).
    retain_at: Option<PartitionSnapshot>,
}

impl std::fmt::Debug for PartitionMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionMachine")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

/// Builds a snapshot of the state as it was when the builder was made.
pub struct PartitionSnapshotBuilder {
    shared: Arc<Shared>,
    state: PartitionSnapshot,
    current: Arc<Mutex<Option<SnapshotFile>>>,
}

/// A snapshot on the wire: its state as JSON (one snapshot type serves every group's traffic).
fn encode(state: &PartitionSnapshot) -> Result<SnapshotBytes, io::Error> {
    serde_json::to_vec(state).map_err(io::Error::other)
}

fn file(shared: &Shared, name: &str) -> PathBuf {
    shared.raft_dir.join(name)
}

impl PartitionMachine {
    /// The state machine of the partition whose log `store` is: its last state as written (or
    /// its snapshot's, if later), made visible in the log. A snapshot installed as a power cut
    /// stopped it is finished here (the log then continues after it).
    pub async fn open(store: &SegmentLogStore) -> Result<Self, StoreError> {
        let shared = store.shared.clone();
        if shared.kind != GroupKind::Partition {
            return Err(StoreError::Inconsistent {
                dir: shared.log.dir().to_owned(),
                reason: "a partition's state machine on another group's log".to_owned(),
            });
        }
        let (applied, snapshot) = {
            let shared = shared.clone();
            blocking(move || {
                let applied: Option<PartitionSnapshot> =
                    super::log_store::read_json(&*shared.vfs, &file(&shared, APPLIED))?;
                let snapshot: Option<SnapshotFile> =
                    super::log_store::read_json(&*shared.vfs, &file(&shared, SNAPSHOT))?;
                Ok((applied, snapshot))
            })
            .await?
        };
        // A snapshot the log does not reach: an install the power cut short. The log continues
        // after it.
        let from_snapshot = snapshot.as_ref().map(|s| s.data.clone());
        if let Some(s) = &from_snapshot
            && let Some(last) = s.last_log_id
            && shared.last_log_id().is_none_or(|l| l.index < last.index)
        {
            shared.continue_after(last, s.next_offset).await?;
        }
        // An applied state is written only once what it applied is durable here; one past the
        // log anyway is not trusted (a lower bound is: Raft applies the rest again).
        let log_last = shared.last_log_id();
        let applied = applied.filter(|a| {
            let within = a
                .last_log_id
                .is_none_or(|last| log_last.is_some_and(|l| l.index >= last.index));
            if !within {
                tracing::warn!(dir = %shared.log.dir().display(), applied = ?a.last_log_id, log = ?log_last, "the state machine's applied state is past the log; starting from its snapshot");
            }
            within
        });
        let state = match (applied, from_snapshot) {
            (Some(a), Some(s)) => {
                if s.last_log_id > a.last_log_id {
                    s
                } else {
                    a
                }
            }
            (a, s) => a.or(s).unwrap_or_else(|| PartitionSnapshot {
                next_offset: shared.log.first_offset(),
                ..PartitionSnapshot::default()
            }),
        };
        shared.log.advance_visible(state.next_offset);
        Ok(Self {
            shared,
            state,
            persisted: Instant::now(),
            current: Arc::new(Mutex::new(snapshot)),
            ids: None,
            retain_at: None,
        })
    }

    /// Tells `ids` of every message applied from now on.
    pub(super) fn remember_ids(&mut self, ids: Arc<PartitionIds>) {
        self.ids = Some(ids);
    }

    /// The offset the next applied message takes.
    pub fn next_offset(&self) -> u64 {
        self.state.next_offset
    }

    /// Writes the applied state once what it applied is durable here (a clean shutdown; it is
    /// written about once a second anyway).
    pub async fn close(&mut self) -> Result<(), StoreError> {
        self.shared.barrier().await?;
        self.persist().await
    }

    /// Writes the applied state, unless a message it applied is not durable here yet (a leader
    /// applies what the followers hold before its own fsync returns): written then, it would
    /// claim, after a power cut, entries this replica lost.
    async fn persist(&mut self) -> Result<(), StoreError> {
        if self.state.next_offset > self.shared.log.durable_end() {
            return Ok(());
        }
        let (shared, state) = (self.shared.clone(), self.state.clone());
        blocking(move || {
            super::log_store::write_json(&*shared.vfs, &file(&shared, APPLIED), &state)
        })
        .await?;
        self.persisted = Instant::now();
        Ok(())
    }

    /// The answer to a message entry at `index`: its offset, which the log must agree with.
    fn apply_message(&mut self, id: LogId) -> Result<Applied, StoreError> {
        let offset = self.state.next_offset;
        match self.shared.offset_of(id.index) {
            Some(o) if o == offset => {}
            found => {
                return Err(StoreError::Inconsistent {
                    dir: self.shared.log.dir().to_owned(),
                    reason: format!(
                        "the state machine applies entry {id} at offset {offset}, the log holds it at {found:?}"
                    ),
                });
            }
        }
        self.state.next_offset += 1;
        Ok(Applied::Offset(offset))
    }

    /// Makes what was applied visible, then answers the writes that wait for it.
    fn publish(&self, replies: &mut Vec<(openraft::storage::ApplyResponder<Raft>, Applied)>) {
        self.shared.log.advance_visible(self.state.next_offset);
        for (responder, reply) in replies.drain(..) {
            responder.send(reply);
        }
    }
}

impl RaftStateMachine<Raft> for PartitionMachine {
    type SnapshotData = SnapshotBytes;
    type SnapshotBuilder = PartitionSnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, Membership), io::Error> {
        Ok((self.state.last_log_id, self.state.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<Raft>, io::Error>> + Unpin + OptionalSend,
    {
        // Answers wait until what they answer is visible; that is published once per run of
        // entries that are ready together, not once per entry.
        let mut replies = Vec::new();
        let result = loop {
            let next = match entries.next().now_or_never() {
                Some(next) => next,
                None => {
                    self.publish(&mut replies);
                    entries.next().await
                }
            };
            let (entry, responder) = match next {
                None => break Ok(()),
                Some(Err(e)) => break Err(e),
                Some(Ok(item)) => item,
            };
            let reply = match &entry.payload {
                EntryPayload::Normal(Command::Message(payload)) => {
                    match self.apply_message(entry.log_id) {
                        Ok(reply) => {
                            if let (Some(ids), Applied::Offset(offset)) = (&self.ids, &reply) {
                                ids.applied(payload, *offset);
                            }
                            reply
                        }
                        Err(e) => break Err(e.into()),
                    }
                }
                EntryPayload::Normal(Command::Meta(_)) => {
                    break Err(io::Error::other(StoreError::Inconsistent {
                        dir: self.shared.log.dir().to_owned(),
                        reason: format!("metadata entry {} in a partition's log", entry.log_id),
                    }));
                }
                EntryPayload::Membership(m) => {
                    self.state.membership = Membership::new(Some(entry.log_id), m.clone());
                    Applied::Nothing
                }
                EntryPayload::Blank => Applied::Nothing,
            };
            self.state.last_log_id = Some(entry.log_id);
            if let Some(responder) = responder {
                replies.push((responder, reply));
            }
            if replies.len() >= 1024 {
                self.publish(&mut replies);
            }
        };
        self.publish(&mut replies);
        result?;
        if self.persisted.elapsed() >= PERSIST_EVERY {
            self.persist().await?;
        }
        Ok(())
    }

    /// A partition's snapshot is built where retention purges (`retain`), and otherwise only
    /// when openraft must have one (`force`: none to send a follower), at the applied state.
    async fn try_create_snapshot_builder(&mut self, force: bool) -> Option<Self::SnapshotBuilder> {
        match self.retain_at.take() {
            Some(state) => Some(PartitionSnapshotBuilder {
                shared: self.shared.clone(),
                state,
                current: self.current.clone(),
            }),
            None if force => Some(self.get_snapshot_builder().await),
            None => None,
        }
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        PartitionSnapshotBuilder {
            shared: self.shared.clone(),
            state: self.state.clone(),
            current: self.current.clone(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotBytes,
    ) -> Result<(), io::Error> {
        let snapshot: PartitionSnapshot = serde_json::from_slice(&snapshot)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let data = PartitionSnapshot {
            last_log_id: meta.last_log_id,
            membership: meta.last_membership.clone(),
            next_offset: snapshot.next_offset,
        };
        let stored = SnapshotFile {
            meta: meta.clone(),
            data: data.clone(),
        };
        // The snapshot and the state first: if the power fails before the log starts over,
        // opening the state machine finishes it.
        let (shared, current) = (self.shared.clone(), self.current.clone());
        blocking(move || retain::save(&shared, &current, stored, true)).await?;
        if let Some(last) = data.last_log_id {
            self.shared.continue_after(last, data.next_offset).await?;
            // A log that holds the snapshot's last entry kept its messages: they must end where
            // the snapshot says.
            let end = self.shared.next_offset_after(last.index);
            if end != data.next_offset {
                return Err(StoreError::Inconsistent {
                    dir: self.shared.log.dir().to_owned(),
                    reason: format!(
                        "the snapshot at {last} continues at offset {}, the log at {end}",
                        data.next_offset
                    ),
                }
                .into());
            }
        }
        self.state = data;
        self.persisted = Instant::now();
        self.retain_at = None;
        self.shared.log.advance_visible(self.state.next_offset);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let current = self.current.lock().clone();
        current
            .map(|s| {
                Ok(Snapshot {
                    meta: s.meta,
                    snapshot: encode(&s.data)?,
                })
            })
            .transpose()
    }
}

impl RaftSnapshotBuilder<Raft> for PartitionSnapshotBuilder {
    type SnapshotData = SnapshotBytes;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let meta = SnapshotMeta {
            last_log_id: self.state.last_log_id,
            last_membership: self.state.membership.clone(),
        };
        let stored = SnapshotFile {
            meta,
            data: self.state.clone(),
        };
        // A newer snapshot installed meanwhile stays the current one.
        let (shared, current) = (self.shared.clone(), self.current.clone());
        let kept = blocking(move || retain::save(&shared, &current, stored, false)).await?;
        Ok(Snapshot {
            snapshot: encode(&kept.data)?,
            meta: kept.meta,
        })
    }
}
