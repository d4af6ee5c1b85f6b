//! The storage layer's errors. Every variant that comes from a file names the file: the first thing
//! an operator needs when a disk misbehaves is where.

use std::io;
use std::path::PathBuf;

use super::frame::FrameFault;

/// One entry that cannot be read back as written. It is isolated: the entries around it read fine,
/// so dispatchers log it, count it and go on; pull leaves it out.
#[derive(Debug, Clone, thiserror::Error)]
#[error("corrupt entry at offset {offset} ({path}, byte {position}): {fault}")]
pub struct CorruptEntry {
    /// The segment data file.
    pub path: PathBuf,
    /// The entry's offset in the log.
    pub offset: u64,
    /// The entry's start position in the data file.
    pub position: u64,
    /// What is wrong with it.
    pub fault: FrameFault,
}

/// Errors of the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The operating system refused an operation on a file.
    // The OS error is part of the message (HTTP answers and logs show only the top error), so it
    // is deliberately not also exposed as `source`, which would print it twice in a chain.
    #[error("I/O error on {path}: {error}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the OS said.
        error: io::Error,
    },
    /// A skippable, isolated corrupt entry (see [`CorruptEntry`]).
    #[error(transparent)]
    Corrupt(#[from] CorruptEntry),
    /// The files on disk contradict each other in a way recovery must not paper over (an index
    /// that points past its data, segments that leave a gap). The log refuses to open.
    #[error("{path}: {reason}")]
    Inconsistent {
        /// The file at fault.
        path: PathBuf,
        /// What is inconsistent.
        reason: String,
    },
    /// An earlier write or fsync failed, so what is on disk is no longer known; the log takes no
    /// more appends until it is reopened (recovery re-reads the truth from the index).
    #[error("{dir}: not accepting writes since an earlier failure: {cause}")]
    Poisoned {
        /// The log's directory.
        dir: PathBuf,
        /// The failure that stopped it.
        cause: String,
    },
    /// A payload larger than a frame can carry.
    #[error("payload of {len} bytes exceeds the {max}-byte limit of one entry")]
    PayloadTooLarge {
        /// The payload's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Creating or growing a topic would pass one of the broker's caps ([`Limit`]); nothing of
    /// it was created.
    #[error("{limit}; {topic:?} was not {}", if *grown { "grown" } else { "created" })]
    TopicLimit {
        /// The topic that was refused.
        topic: String,
        /// The cap it would pass.
        limit: Limit,
        /// It exists and was to grow (else it was to be created).
        grown: bool,
    },
    /// The topic is being deleted; it can be created again once its files are gone.
    #[error("topic {topic:?} is being deleted; retry to create it anew")]
    Deleting {
        /// The topic.
        topic: String,
    },
    /// A checkpoint write after its topic was deleted (it would bring the directory back).
    #[error("{dir}: its topic was deleted")]
    Retired {
        /// The checkpoint directory.
        dir: PathBuf,
    },
    /// An operation this log cannot do in its mode: an append without a log id to a clustered
    /// log (or one with a log id to a single-node log), a cut below what readers already see.
    #[error("{dir}: {reason}")]
    Refused {
        /// The log's directory.
        dir: PathBuf,
        /// Why.
        reason: String,
    },
    /// The log was closed while the operation waited.
    #[error("log closed")]
    Closed,
    /// Another process holds the root dir ([`super::lock`]); nothing in it was touched.
    #[error(transparent)]
    Locked(#[from] super::lock::LockError),
    /// Recovery at boot was told to stop (a shutdown signal) before it was done.
    #[error("recovery interrupted after {done} of {total} topics")]
    Interrupted {
        /// Topic directories recovered.
        done: usize,
        /// Topic directories found.
        total: usize,
    },
}

/// A cap on what topics may cost the broker (docs/operations.md, "`mmmq serve`").
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Limit {
    /// `--max-topics`: each topic costs a directory, files and descriptors.
    #[error(
        "topic limit reached: this broker holds its maximum of {max} topics (mmmq serve --max-topics)"
    )]
    Topics {
        /// The cap.
        max: usize,
    },
    /// `--max-partitions`, over all topics: each partition is a log, with its files, its tail's
    /// positions in memory, a writer thread while it writes and a worker per dispatcher.
    #[error(
        "partition limit reached: this broker holds {used} partitions over all topics, and {asked} more would pass its maximum of {max} (mmmq serve --max-partitions)"
    )]
    Partitions {
        /// Partitions that exist (or are being created) now.
        used: usize,
        /// Partitions asked for.
        asked: usize,
        /// The cap.
        max: usize,
    },
}

impl StorageError {
    /// Wraps an I/O error with the file it happened on.
    pub fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io {
            path: path.into(),
            error: source,
        }
    }
}

/// Adds the path to an `io::Result`.
pub(crate) trait IoContext<T> {
    fn at(self, path: &std::path::Path) -> Result<T, StorageError>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn at(self, path: &std::path::Path) -> Result<T, StorageError> {
        self.map_err(|e| StorageError::io(path, e))
    }
}
