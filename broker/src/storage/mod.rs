//! The durable segment store (docs/storage.md, "Storage").
//!
//! # Layout
//! - [`frame`]: `[u32 length][u32 CRC32C][payload]`, pure encode/decode.
//! - [`index`]: the offset index encoding, pure.
//! - [`vfs`]: the file abstraction every byte goes through (fault injection lives behind it).
//! - [`scan`]: read-only reading of a log directory: segments, indexes, inconsistencies. Recovery
//!   and `mmmq inspect` share it.
//! - [`repair`]: reconciling the tail's index with its CRC-valid frames at recovery, so that a
//!   torn unsynced write is cut and a flipped bit in acknowledged entries is repaired, never cut.
//! - `segment`: one data file and its index, with committed positions in memory.
//! - [`log`]: a chain of segments with a pipelined group-commit writer and lock-light readers;
//!   its configuration, writer, poison-and-heal and the state those two share each in a file of
//!   their own, and what a clustered partition's log does besides (docs/cluster.md, "Clustered
//!   partitions on disk").
//! - [`checkpoint`]: per-consumer next offsets, replaced atomically.
//! - [`lock`]: the OS lock that keeps a second process off a root dir.
//! - [`clean`]: the clean-shutdown marker that spares the next boot a full check of the tails.
//! - [`error`]: [`StorageError`], and [`CorruptEntry`] for isolated, skippable corruption.
//!
//! # File descriptors
//! A segment needs its data file, and the tail segment its index too (indexes of segments sealed
//! before the process started are read once and closed). They are held through [`files`]: one
//! cache per broker that keeps at most `--max-open-files` of them open, closing the least recently
//! used and reopening on the next use, so ten thousand idle topics cost no descriptors while the
//! busy ones keep theirs. `mmmq serve` raises its soft `RLIMIT_NOFILE` to the hard limit at start
//! and sizes the cache to that limit minus what sockets need.

pub mod checkpoint;
pub mod clean;
pub mod error;
pub mod files;
pub mod frame;
pub mod index;
pub mod lock;
pub mod log;
pub mod repair;
pub mod scan;
mod segment;
pub mod vfs;

pub use checkpoint::{Checkpoints, Position};
pub use error::{CorruptEntry, Limit, StorageError};
pub use files::FileCache;
pub use log::{Committing, FlushMode, Log, LogConfig, LogStats, RaftFrame, SegmentSummary, Settle};
pub use segment::Entry;
pub use vfs::{OsFs, Vfs};

#[cfg(test)]
mod power_tests;
#[cfg(test)]
mod tests;
