//! How a log writes: when an append counts as durable, segment size, batch size, what happens
//! after a failure, and the open-file cache it shares with every other log of the broker.

use std::sync::Arc;
use std::time::Duration;

use crate::storage::files::FileCache;
pub use crate::storage::scan::TailCheck;

/// When an append counts as durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlushMode {
    /// Many concurrent appends share one data fsync, the commit point (the default).
    #[default]
    GroupCommit,
    /// Every append gets its own data fsync and index fsync, one after another (MMMQ's behaviour;
    /// kept for comparison).
    PerAppend,
    /// No fsync at all: an append is acknowledged once it is in the page cache. A power cut can
    /// lose acknowledged messages; a process crash cannot.
    NoSync,
}

impl std::str::FromStr for FlushMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "group" | "group-commit" => Ok(Self::GroupCommit),
            "per-append" | "always" => Ok(Self::PerAppend),
            "none" | "no-sync" => Ok(Self::NoSync),
            _ => Err(format!(
                "unknown flush mode {s:?}: use group, per-append or none"
            )),
        }
    }
}

/// Called after every commit with the number of entries it made durable (for metrics).
pub type CommitObserver = Arc<dyn Fn(u64) + Send + Sync>;

/// How a log writes.
#[derive(Clone)]
pub struct LogConfig {
    /// A new segment starts when the tail has reached this many bytes before an append (a soft
    /// cap: an entry is never split).
    pub segment_max_bytes: u64,
    /// When an append counts as durable.
    pub flush: FlushMode,
    /// Upper bound on the bytes one group commit writes, so that one huge burst does not hold
    /// every waiting append behind a single enormous write.
    pub max_batch_bytes: usize,
    /// Told about every commit.
    pub on_commit: Option<CommitObserver>,
    /// After a failed write, how long appends are refused before the log tries to recover in
    /// place (so that a failing disk is not hammered by every client's retry).
    pub retry_after: Duration,
    /// The open-file cap shared by every log of a broker (each segment's files are closed when
    /// unused for longest and the cap is reached, and reopened on the next use).
    pub files: Arc<FileCache>,
    /// How closely recovery checks the tail segment (see [`TailCheck`]).
    pub tail_check: TailCheck,
    /// Most zeros written ahead of the tail's data (capped at `segment_max_bytes`), so that a
    /// commit's `fdatasync` seldom has a new file size to write: measured here, a sync of a file
    /// that grew costs about four synchronous writes, one that did not about three. A tail gets
    /// about as many zeros as it holds data, from 4 KiB up to this (see
    /// `storage::segment::preallocation`), so an idle partition costs no more than its data and a
    /// block. 0 turns it off.
    pub preallocate_bytes: u64,
    /// The tail's index is written after each commit but synced at most this often (and at
    /// rotation and close): it only saves recovery the re-indexing of the frames past it.
    pub index_sync_interval: Duration,
    /// A clustered partition's log (docs/cluster.md, "Clustered partitions on disk"): every frame's
    /// payload starts with the entry's Raft log id, readers see entries only once the state
    /// machine made them visible, and the log can be cut back or reset. Off (a single-node log,
    /// byte for byte the layout of docs/storage.md) by default.
    pub raft_header: bool,
}

impl std::fmt::Debug for LogConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogConfig")
            .field("segment_max_bytes", &self.segment_max_bytes)
            .field("flush", &self.flush)
            .field("max_batch_bytes", &self.max_batch_bytes)
            .field("retry_after", &self.retry_after)
            .field("max_open_files", &self.files.capacity())
            .field("preallocate_bytes", &self.preallocate_bytes)
            .field("raft_header", &self.raft_header)
            .finish_non_exhaustive()
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_max_bytes: 64 * 1024 * 1024,
            flush: FlushMode::GroupCommit,
            max_batch_bytes: 8 * 1024 * 1024,
            on_commit: None,
            retry_after: Duration::from_secs(1),
            files: FileCache::for_process(DEFAULT_FD_RESERVE),
            tail_check: TailCheck::Full,
            preallocate_bytes: 1024 * 1024,
            index_sync_interval: Duration::from_secs(1),
            raft_header: false,
        }
    }
}

/// Descriptors a default [`LogConfig`] leaves outside its file cache (sockets, checkpoints,
/// plugins, the runtime's own).
pub const DEFAULT_FD_RESERVE: u64 = 1024;
