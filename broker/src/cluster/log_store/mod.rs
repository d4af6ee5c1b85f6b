//! The Raft log of a clustered partition is its segment log (docs/cluster.md, "Clustered
//! partitions on disk"): [`SegmentLogStore`] is openraft's log store on a
//! [`Log`] whose frames carry log ids, so a message is written once, with one fsync per group
//! commit as on a single node, and its offset is dense.
//!
//! - Message entries are frames of the segment log, one offset each; an append's messages go
//!   through the log's group commit, and its callback fires once they are durable.
//! - Entries that carry no message (blanks, memberships) are records of a sidecar file and take
//!   no offset; an append writes and fsyncs them before it queues its messages, so only appends
//!   that hold one pay a second fsync.
//! - An index's offset follows from an anchor and the few sidecar entries after it (`layout`).
//! - The vote and the purge point are small files replaced atomically (`files`).
//! - At open, the log is the longest run of consecutive indexes (`recover`), and a purge a crash
//!   interrupted is finished (`purge`, which also answers what retention needs of the log).
//! - The trait implementations (`storage`) keep messages not yet durable in memory, so that an
//!   append's entries can be read (replicated) at once, before its fsync returns.
//!
//! The partition's state machine (`super::machine`) shares the log: it makes applied entries
//! visible to readers and starts the log over when it installs a snapshot.

mod files;
mod layout;
mod purge;
mod recover;
mod storage;

#[cfg(test)]
mod power_tests;
#[cfg(test)]
mod recovery_tests;
#[cfg(test)]
mod retention_tests;
#[cfg(test)]
mod suite;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use files::Sidecar;
pub use files::{ENTRIES, PURGED, Parsed, RAFT_DIR, VOTE, parse as parse_sidecar};
pub(crate) use files::{read_json, write_json};
use layout::Layout;
pub use layout::NotNext;
use recover::Fix;
use storage::Flush;

use crate::cluster::types::{GroupKind, LogId, Raft};
use crate::storage::vfs::Vfs;
use crate::storage::{Log, LogConfig, StorageError};

/// The log id of the entry at `index` written by the leader of `term` (standard Raft: one leader a
/// term).
pub(crate) fn log_id(term: u64, index: u64) -> LogId {
    LogId {
        leader_id: openraft::vote::leader_id_std::CommittedLeaderId::new(term),
        index,
    }
}

/// A vote as the store keeps it.
pub type Vote = openraft::alias::VoteOf<Raft>;

/// The purge point as `raft/purged` holds it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PurgeFile {
    /// The last purged log id.
    pub log_id: LogId,
    /// The offset of the first message after it.
    pub next_offset: u64,
}

/// Errors of the log store; openraft gets them as `io::Error`s.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The segment log or a file refused.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A file of the store cannot be read as what it should hold.
    #[error("{path}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The segment log and the store's files contradict each other.
    #[error("{dir}: {reason}")]
    Inconsistent {
        /// The partition's directory.
        dir: PathBuf,
        /// What contradicts what.
        reason: String,
    },
    /// Entries offered where they cannot follow the log.
    #[error(transparent)]
    NotNext(#[from] NotNext),
    /// An earlier write failed: what the log holds on disk is no longer known, so it takes no
    /// more writes until it is opened again (recovery reads the truth from the files).
    #[error("{dir}: not accepting writes since an earlier failure: {cause}")]
    Failed {
        /// The partition's directory.
        dir: PathBuf,
        /// The failure.
        cause: String,
    },
    /// A blocking task did not finish (a runtime shutting down).
    #[error("a storage task did not finish: {0}")]
    Join(String),
}

impl From<StoreError> for std::io::Error {
    fn from(e: StoreError) -> Self {
        std::io::Error::other(e)
    }
}

/// Runs blocking file work off the async executor.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Join(e.to_string()))?
}

/// The Raft log store of one group on its segment log. Cheap to clone; every clone is the same
/// store (its log reader is a clone).
#[derive(Clone)]
pub struct SegmentLogStore {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for SegmentLogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentLogStore")
            .field("dir", &self.shared.log.dir())
            .finish_non_exhaustive()
    }
}

/// What every clone of a store shares, and the partition's state machine with them.
pub(crate) struct Shared {
    pub(crate) log: Log,
    pub(crate) vfs: Arc<dyn Vfs>,
    pub(crate) raft_dir: PathBuf,
    pub(crate) kind: GroupKind,
    pub(crate) state: Mutex<State>,
    /// Locked on blocking threads only.
    sidecar: Mutex<Sidecar>,
    /// Why the store stopped taking writes, once a write failed.
    failed: Arc<Mutex<Option<String>>>,
    /// Appends waiting for their messages to be durable, in order.
    flusher: mpsc::UnboundedSender<Flush>,
}

/// The store's memory.
pub(crate) struct State {
    layout: Layout,
    /// Messages appended whose frames may not be durable yet (and those of the last append,
    /// which replication reads next), by offset.
    pending: VecDeque<(u64, LogId, Bytes)>,
    vote: Option<Vote>,
}

impl SegmentLogStore {
    /// Opens (or creates) the Raft log of the group whose segment log is in `dir`: the segment
    /// log with log ids (whatever `config.raft_header` says), its `raft/` files, and recovery
    /// of the longest run of indexes (see `recover`). Must run within a Tokio runtime.
    pub async fn open(
        dir: &Path,
        vfs: Arc<dyn Vfs>,
        config: LogConfig,
        kind: GroupKind,
    ) -> Result<Self, StoreError> {
        let config = LogConfig {
            raft_header: true,
            ..config
        };
        let log = {
            let (dir, vfs) = (dir.to_owned(), vfs.clone());
            blocking(move || Ok(Log::open(&dir, vfs, config)?)).await?
        };
        Self::on_log(log, vfs, kind).await
    }

    /// The Raft log of a group on a clustered segment log already open (a topic's partition,
    /// which its readers share): its `raft/` files beside it, and recovery of the longest run
    /// of indexes (see `recover`). Must run within a Tokio runtime.
    pub async fn on_log(log: Log, vfs: Arc<dyn Vfs>, kind: GroupKind) -> Result<Self, StoreError> {
        let dir = log.dir().to_owned();
        if !log.clustered() {
            return Err(StoreError::Inconsistent {
                dir,
                reason: "a Raft log on a segment log without log ids".to_owned(),
            });
        }
        let raft_dir = dir.join(RAFT_DIR);
        let recovered = {
            let (log, vfs, raft_dir) = (log.clone(), vfs.clone(), raft_dir.clone());
            blocking(move || {
                if !vfs.is_dir(&raft_dir) && log.durable_end() > log.first_offset() {
                    // Frames without log ids: read with them, their bytes would be misread.
                    return Err(StoreError::Inconsistent {
                        dir: log.dir().to_owned(),
                        reason: "a single-node log (no raft/ directory) cannot be opened as a \
                                 clustered partition's"
                            .to_owned(),
                    });
                }
                // At once, so that the directory says what it is (`mmmq inspect` reads it so).
                crate::storage::vfs::create_dir_durably(&*vfs, &raft_dir)?;
                recover::recover(&log, &vfs, &raft_dir)
            })
            .await?
        };
        match recovered.fix {
            Fix::None => {}
            Fix::Truncate(end) => log.truncate(end).await?,
            Fix::Reset(next) => log.reset(next).await?,
        }
        let sidecar = {
            let (log, mut sidecar) = (log.clone(), recovered.sidecar);
            let purged = recovered.layout.purged();
            blocking(move || {
                purge::finish(&log, &mut sidecar, purged)?;
                Ok(sidecar)
            })
            .await?
        };
        let failed = Arc::new(Mutex::new(None));
        let (flusher, queue) = mpsc::unbounded_channel();
        tokio::spawn(storage::flush(queue, failed.clone(), dir));
        Ok(Self {
            shared: Arc::new(Shared {
                log,
                vfs,
                raft_dir,
                kind,
                state: Mutex::new(State {
                    layout: recovered.layout,
                    pending: VecDeque::new(),
                    vote: recovered.vote,
                }),
                sidecar: Mutex::new(sidecar),
                failed,
                flusher,
            }),
        })
    }

    /// The segment log: what the partition's readers read (up to what was applied).
    pub fn log(&self) -> &Log {
        &self.shared.log
    }

    /// Waits for the appends made so far to be durable, then closes the segment log (its exact
    /// layout, as a clean shutdown leaves it).
    pub async fn close(&self) -> Result<(), StoreError> {
        self.shared.barrier().await?;
        Ok(self.shared.log.close().await?)
    }
}

impl Shared {
    fn dir(&self) -> PathBuf {
        self.log.dir().to_owned()
    }

    fn check_failed(&self) -> Result<(), StoreError> {
        match &*self.failed.lock() {
            Some(cause) => Err(StoreError::Failed {
                dir: self.dir(),
                cause: cause.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Stops the store taking writes after `error`.
    fn fail(&self, error: &StoreError) {
        tracing::error!(dir = %self.dir().display(), %error, "Raft log write failed; the log takes no more writes until it is opened again");
        self.failed.lock().get_or_insert_with(|| error.to_string());
    }

    /// `result`, having stopped the store taking writes if it is a failure.
    fn failing<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(e) = &result {
            self.fail(e);
        }
        result
    }

    /// Records the purge point durably (before anything it covers is removed).
    async fn write_purged(
        self: &Arc<Self>,
        log_id: LogId,
        next_offset: u64,
    ) -> Result<(), StoreError> {
        let this = self.clone();
        blocking(move || {
            write_json(
                &*this.vfs,
                &this.raft_dir.join(PURGED),
                &PurgeFile {
                    log_id,
                    next_offset,
                },
            )
        })
        .await
    }

    /// The last log id the log holds (or its purge point).
    pub(crate) fn last_log_id(&self) -> Option<LogId> {
        self.state.lock().layout.last_log_id()
    }

    /// The offset a message after `index` takes.
    pub(crate) fn next_offset_after(&self, index: u64) -> u64 {
        self.state.lock().layout.offset_at(index + 1)
    }

    /// The offset of the message at `index`, if the log holds a message there.
    pub(crate) fn offset_of(&self, index: u64) -> Option<u64> {
        self.state.lock().layout.message_offset(index)
    }

    /// Makes the log continue after a snapshot's last log id `last`, its next message at
    /// `next_offset`: nothing to do if the log holds `last` (what follows it agrees with the
    /// snapshot), else every entry goes and the segment log starts over, empty, at
    /// `next_offset` — the purge point first, so that a power cut part way is finished at the
    /// next open.
    pub(crate) async fn continue_after(
        self: &Arc<Self>,
        last: LogId,
        next_offset: u64,
    ) -> Result<(), StoreError> {
        self.check_failed()?;
        self.barrier().await?;
        let offset = self.offset_of(last.index);
        let term = match offset {
            Some(offset) => {
                let log = self.log.clone();
                blocking(move || Ok(term_at(&log, offset))).await?
            }
            None => None,
        };
        if self.state.lock().layout.holds(&last, |_| term) {
            return Ok(());
        }
        {
            let mut st = self.state.lock();
            st.layout.reset(last, next_offset);
            st.pending.clear();
        }
        let result = async {
            self.write_purged(last, next_offset).await?;
            let this = self.clone();
            blocking(move || this.sidecar.lock().cut_from(0)).await?;
            self.log.reset(next_offset).await?;
            Ok(())
        }
        .await;
        self.failing(result)
    }
}

/// The term of the frame at `offset`, if it reads.
fn term_at(log: &Log, offset: u64) -> Option<u64> {
    let frame = log.read_raft_from(offset, 1, 1).ok()?.pop()?;
    (frame.offset == offset).then_some(frame.entry.ok()?.0.0)
}
