//! One segment: a data file of framed entries and its offset index.
//!
//! Memory is bounded by open segments, not by stored messages (docs/storage.md, "Storage"): only the tail
//! segment keeps its entries' positions in memory (a read of it costs one `pread` and never waits
//! for the writer); a sealed segment keeps its count and size, and a read of it first reads the
//! positions it needs from its index file.
//!
//! The tail's data file is preallocated with real zeros ahead of the writes (so that a commit's
//! `fdatasync` writes the data and no metadata), about as many as it holds data, up to the log's
//! cap (see [`preallocation`]); its index is written after the data is durable and synced lazily.
//! Sealing makes the layout exact again: data cut to its last entry, index complete and synced.
//!
//! The read side is in `read`.

mod read;

pub(crate) use read::LogIdPart;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use super::error::{CorruptEntry, IoContext, StorageError};
use super::files::{CachedFile, FileCache};
use super::index;
use super::scan::{SegmentFiles, SegmentScan};
use super::vfs::{OpenMode, Vfs, VfsFile};

/// One entry read back: its offset, and its payload or why it cannot be trusted.
#[derive(Debug)]
pub struct Entry {
    /// The entry's offset.
    pub offset: u64,
    /// The payload, or the isolated corruption that replaces it.
    pub payload: Result<Vec<u8>, CorruptEntry>,
}

/// What readers see of a segment's committed entries.
#[derive(Debug, Default)]
struct Committed {
    /// Start positions, while the segment is the tail; empty once it is sealed.
    positions: Vec<u64>,
    /// Committed entries.
    count: u64,
    /// Sealed: the index file is complete and synced, positions are read from it.
    sealed: bool,
}

pub(crate) struct Segment {
    pub files: SegmentFiles,
    /// Open while in use; the broker's [`FileCache`] may close it between uses.
    data: CachedFile,
    index: CachedFile,
    committed: RwLock<Committed>,
    /// End of the last committed entry in the data file.
    committed_end: AtomicU64,
    /// Entries written to the index file so far (only the writer touches it).
    indexed: AtomicU64,
    /// Length of the data file, preallocation included (only the writer touches it).
    allocated: AtomicU64,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("start", &self.files.start)
            .field("committed", &self.committed_count())
            .finish()
    }
}

/// Zeros written ahead of the tail's writes at a time, at most.
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

/// The fewest zeros kept ahead of a tail's writes (one page, one filesystem block): what a tail
/// that received a message or two costs on disk beyond its data.
pub(crate) const MIN_PREALLOCATION: u64 = 4 * 1024;

/// How many zeros to keep ahead of a tail whose data ends at `end`, given the log's cap `max`
/// (0: none): as many as the tail holds data, from [`MIN_PREALLOCATION`] up to `max`. The zeros
/// grow in proportion to what the tail received, so an idle or barely used partition holds
/// almost nothing extra on disk (a thousand partitions of one message each are a few MiB, not a
/// thousand times `max`), while a busy tail's file grows geometrically: about twenty size changes
/// until the zeros reach `max`, then one per `max / 2` written, so its commits' `fdatasync` still
/// seldom has a file size to write (docs/storage.md, "Storage").
pub(crate) fn preallocation(end: u64, max: u64) -> u64 {
    end.max(MIN_PREALLOCATION).min(max)
}

impl Segment {
    /// Creates the two empty files of a new segment and makes their names durable.
    pub fn create(
        vfs: &Arc<dyn Vfs>,
        cache: &Arc<FileCache>,
        dir: &Path,
        start: u64,
    ) -> Result<Self, StorageError> {
        let files = SegmentFiles::new(dir, start);
        let data = vfs.open(&files.data, OpenMode::CreateNew).at(&files.data)?;
        let index = vfs
            .open(&files.index, OpenMode::CreateNew)
            .at(&files.index)?;
        vfs.sync_dir(dir).at(dir)?;
        Ok(Self {
            data: cache.adopt(vfs.clone(), &files.data, data),
            index: cache.adopt(vfs.clone(), &files.index, index),
            files,
            committed: RwLock::new(Committed::default()),
            committed_end: AtomicU64::new(0),
            indexed: AtomicU64::new(0),
            allocated: AtomicU64::new(0),
        })
    }

    /// Opens a segment as its scan found it, making the files agree with what recovery keeps:
    /// index entries rewritten or appended from the frames, a torn index tail cut, data past the
    /// last entry (preallocated zeros, a torn write) cut. `tail` keeps positions in memory; any
    /// other segment is sealed and opens no file until it is read.
    pub fn recover(
        vfs: &Arc<dyn Vfs>,
        cache: &Arc<FileCache>,
        scan: SegmentScan,
        tail: bool,
    ) -> Result<Self, StorageError> {
        let files = scan.files.clone();
        let dir = files.data.parent().unwrap_or(Path::new("."));
        let changes_index = scan.torn_index_bytes() > 0
            || scan.repair.as_ref().is_some_and(|r| r.changes_index())
            || !scan.index_exists;
        let changes_data = scan.data_len > scan.committed_end || !scan.data_exists;
        if changes_index || changes_data || scan.reconciled {
            let mut created = false;
            let mut open = |path: &Path, exists: bool| {
                created |= !exists;
                let mode = if exists {
                    OpenMode::ReadWrite
                } else {
                    OpenMode::CreateNew
                };
                vfs.open(path, mode).at(path)
            };
            let data = open(&files.data, scan.data_exists)?;
            let index = open(&files.index, scan.index_exists)?;
            if created {
                vfs.sync_dir(dir).at(dir)?;
            }
            if changes_index {
                fix_index(&*index, &scan)?;
            } else if scan.reconciled {
                index.sync_data().at(&files.index)?;
            }
            if scan.data_len > scan.committed_end {
                let torn = scan.repair.as_ref().is_some_and(|r| r.torn_data);
                if torn || !tail {
                    tracing::warn!(file = %files.data.display(), bytes = scan.data_len - scan.committed_end, "cutting data after the last complete entry (a write that was never acknowledged)");
                }
                data.set_len(scan.committed_end).at(&files.data)?;
                data.sync_data().at(&files.data)?;
            } else if scan.reconciled {
                data.sync_data().at(&files.data)?;
            }
        }
        let count = scan.count();
        let (data, index) = (
            cache.lazy(vfs.clone(), &files.data),
            cache.lazy(vfs.clone(), &files.index),
        );
        Ok(Self {
            data,
            index,
            files,
            committed: RwLock::new(Committed {
                positions: if tail { scan.positions } else { Vec::new() },
                count,
                sealed: !tail,
            }),
            committed_end: AtomicU64::new(scan.committed_end),
            indexed: AtomicU64::new(count),
            allocated: AtomicU64::new(scan.committed_end),
        })
    }

    pub fn start(&self) -> u64 {
        self.files.start
    }

    /// Whether the segment is sealed (complete, synced, never written again).
    pub fn sealed(&self) -> bool {
        self.committed.read().sealed
    }

    pub fn committed_count(&self) -> u64 {
        self.committed.read().count
    }

    pub fn committed_bytes(&self) -> u64 {
        self.committed_end.load(Ordering::Acquire)
    }

    // ---- the append side (called only from the log's writer) ----

    /// Writes `buf` at `pos` of the data file, then tops up the zeros ahead of it to
    /// [`preallocation`]`(end, max_preallocate)` once fewer than half of those remain (so that
    /// most commits' `fdatasync` has no file size to write); returns the open file, which the
    /// caller holds until the fsync that makes the write durable (see [`FileCache`]).
    pub fn write_data(
        &self,
        buf: &[u8],
        pos: u64,
        max_preallocate: u64,
    ) -> Result<Arc<dyn VfsFile>, StorageError> {
        let data = self.data.get().at(&self.files.data)?;
        data.write_all_at(buf, pos).at(&self.files.data)?;
        let end = pos + buf.len() as u64;
        let mut allocated = self.allocated.load(Ordering::Relaxed).max(end);
        let ahead = preallocation(end, max_preallocate);
        if ahead > 0 && allocated < end + ahead / 2 {
            let target = end + ahead;
            while allocated < target {
                let n = (target - allocated).min(ZEROS.len() as u64) as usize;
                data.write_all_at(&ZEROS[..n], allocated)
                    .at(&self.files.data)?;
                allocated += n as u64;
            }
        }
        self.allocated.store(allocated, Ordering::Relaxed);
        Ok(data)
    }

    /// Appends the index entries of committed entries not yet written to the index file (and
    /// `more`, entries of a batch being sealed into this segment), without syncing.
    fn write_index(&self, more: &[u64]) -> Result<Arc<dyn VfsFile>, StorageError> {
        let index = self.index.get().at(&self.files.index)?;
        let from = self.indexed.load(Ordering::Relaxed);
        let mut raw = {
            let committed = self.committed.read();
            let start = (from as usize).min(committed.positions.len());
            index::encode(&committed.positions[start..])
        };
        raw.extend(index::encode(more));
        if !raw.is_empty() {
            index
                .write_all_at(&raw, index::entry_pos(from))
                .at(&self.files.index)?;
            self.indexed
                .fetch_add(raw.len() as u64 / index::ENTRY_LEN, Ordering::Relaxed);
        }
        Ok(index)
    }

    /// Brings the index file up to the committed entries, without syncing: after a commit, off
    /// the commit's critical path.
    pub fn index_lazily(&self) -> Result<(), StorageError> {
        self.write_index(&[]).map(drop)
    }

    /// Syncs the index file (its entries so far).
    pub fn sync_index(&self) -> Result<(), StorageError> {
        self.write_index(&[])?.sync_data().at(&self.files.index)
    }

    /// Makes this segment's layout exact and durable before the next segment is created: the data
    /// cut to `end` (the end of `more`, the last entries a batch put here) and synced, the index
    /// complete and synced. Recovery trusts every segment but the last as its index says, so a
    /// segment is never followed by another before this returns. Readers still see it as the tail
    /// until [`Segment::publish_sealed`].
    pub fn seal_durably(&self, more: &[u64], end: u64) -> Result<(), StorageError> {
        let data = self.data.get().at(&self.files.data)?;
        data.set_len(end).at(&self.files.data)?;
        data.sync_data().at(&self.files.data)?;
        self.allocated.store(end, Ordering::Relaxed);
        self.write_index(more)?.sync_data().at(&self.files.index)
    }

    /// Cuts index and data back to the committed entries (a batch that failed), rewriting the
    /// index from memory (it may hold entries of the failed batch, or lag behind), and makes the
    /// cut durable. The segment takes appends again, even if the failed batch had sealed it.
    ///
    /// The index is cut and synced before the data is cut: a failed batch that sealed this
    /// segment on its way synced index entries for its own frames, and a power cut between the
    /// two cuts must not leave them pointing past the data (recovery refuses such an index,
    /// docs/storage.md, "Storage"). Cut in this order, a power cut leaves at worst the failed batch's
    /// frames past the index, which recovery re-indexes or cuts like any unindexed tail.
    pub fn cut_uncommitted(&self) -> Result<(), StorageError> {
        let committed = self.committed.read();
        let index = self.index.get().at(&self.files.index)?;
        index
            .set_len(index::entry_pos(committed.count))
            .at(&self.files.index)?;
        if !committed.sealed {
            index
                .write_all_at(&index::encode(&committed.positions), 0)
                .at(&self.files.index)?;
        }
        index.sync_data().at(&self.files.index)?;
        self.indexed.store(committed.count, Ordering::Relaxed);
        let end = self.committed_bytes();
        let data = self.data.get().at(&self.files.data)?;
        data.set_len(end).at(&self.files.data)?;
        data.sync_data().at(&self.files.data)?;
        self.allocated.store(end, Ordering::Relaxed);
        Ok(())
    }

    /// Keeps only the first `keep` committed entries in memory, as the tail (a clustered log cut
    /// back, docs/cluster.md, "Clustered partitions on disk"): a sealed segment reads its
    /// positions back from its index and becomes the tail again. The files are cut by
    /// [`Segment::cut_uncommitted`] next, which makes them agree with this.
    pub fn forget_after(&self, keep: u64) -> Result<(), StorageError> {
        let (positions, end) = match self.spans_of(0, keep)? {
            Some((positions, end)) if keep > 0 => (positions, end),
            _ => (Vec::new(), 0),
        };
        let mut committed = self.committed.write();
        let keep = positions.len() as u64;
        committed.positions = positions;
        committed.count = keep;
        committed.sealed = false;
        self.committed_end.store(end, Ordering::Release);
        self.indexed.fetch_min(keep, Ordering::Relaxed);
        Ok(())
    }

    /// Leaves the exact layout of a sealed segment (a clean shutdown): index complete and synced,
    /// preallocated zeros cut.
    pub fn close(&self) -> Result<(), StorageError> {
        if self.sealed() {
            return Ok(());
        }
        let end = self.committed_bytes();
        if self.allocated.load(Ordering::Relaxed) != end {
            let data = self.data.get().at(&self.files.data)?;
            data.set_len(end).at(&self.files.data)?;
            data.sync_data().at(&self.files.data)?;
            self.allocated.store(end, Ordering::Relaxed);
        }
        self.sync_index()
    }

    /// Makes entries visible to readers, after the data fsync that commits them.
    pub fn publish(&self, positions: &[u64], end: u64) {
        let mut committed = self.committed.write();
        committed.positions.extend_from_slice(positions);
        committed.count += positions.len() as u64;
        self.committed_end.store(end, Ordering::Release);
    }

    /// Readers read positions from the (sealed, synced) index from now on; the memory goes.
    pub fn publish_sealed(&self) {
        let mut committed = self.committed.write();
        committed.sealed = true;
        committed.positions = Vec::new();
    }
}

/// Makes a recovered segment's index file say what the scan keeps: entries rewritten from their
/// frames, a torn tail cut, entries found past it appended; then syncs it.
fn fix_index(index: &dyn VfsFile, scan: &SegmentScan) -> Result<(), StorageError> {
    let path = &scan.files.index;
    let kept_on_file = scan
        .repair
        .as_ref()
        .map_or(scan.count(), |r| r.indexed as u64);
    if let Some(repair) = &scan.repair {
        for &(entry, said, is) in &repair.rewritten {
            tracing::warn!(file = %path.display(), entry, said, frames_say = is, "index entry contradicts its CRC-valid frame; rewritten from the frame");
            index
                .write_all_at(&index::encode(&[is]), index::entry_pos(entry as u64))
                .at(path)?;
        }
    }
    if scan.torn_index_bytes() > 0 {
        tracing::warn!(file = %path.display(), bytes = scan.torn_index_bytes(), "cutting a torn, never-synced index tail");
    }
    index.set_len(index::entry_pos(kept_on_file)).at(path)?;
    if let Some(repair) = scan.repair.as_ref().filter(|r| r.reindexed() > 0) {
        tracing::info!(file = %path.display(), entries = repair.reindexed(), "re-indexed committed entries past the last index entry");
        index
            .write_all_at(
                &index::encode(&repair.positions[repair.indexed..]),
                index::entry_pos(kept_on_file),
            )
            .at(path)?;
    }
    index.sync_data().at(path)
}
