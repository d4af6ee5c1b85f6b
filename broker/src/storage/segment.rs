//! One segment: a data file of framed entries and its offset index, plus the committed positions
//! held in memory so that a read costs one `pread` and never waits for the writer.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use super::error::{CorruptEntry, IoContext, StorageError};
use super::files::{CachedFile, FileCache};
use super::frame::{self, FrameFault, HEADER_LEN, MAX_PAYLOAD_LEN};
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

pub(crate) struct Segment {
    pub files: SegmentFiles,
    /// Open while in use; the broker's [`FileCache`] may close it between uses.
    data: CachedFile,
    /// `None` for segments sealed before this process started: their index is only read, once.
    index: Option<CachedFile>,
    /// Start positions of committed entries. Pushed to only after the index fsync that covers them.
    positions: RwLock<Vec<u64>>,
    /// End of the last committed entry in the data file.
    committed_end: AtomicU64,
    /// Entries written to the index file so far (only the index stage touches it).
    indexed: AtomicU64,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("start", &self.files.start)
            .field("committed", &self.positions.read().len())
            .finish()
    }
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
            index: Some(cache.adopt(vfs.clone(), &files.index, index)),
            files,
            positions: RwLock::new(Vec::new()),
            committed_end: AtomicU64::new(0),
            indexed: AtomicU64::new(0),
        })
    }

    /// Opens a segment whose scan found it consistent, cutting what was never committed: a torn
    /// index entry and data after the last indexed entry. `writable` is for the tail segment.
    pub fn recover(
        vfs: &Arc<dyn Vfs>,
        cache: &Arc<FileCache>,
        scan: SegmentScan,
        writable: bool,
    ) -> Result<Self, StorageError> {
        let files = scan.files.clone();
        let dir = files.data.parent().unwrap_or(Path::new("."));
        let mut created = false;
        let data = if scan.data_exists {
            vfs.open(&files.data, OpenMode::ReadWrite).at(&files.data)?
        } else {
            created = true;
            vfs.open(&files.data, OpenMode::CreateNew).at(&files.data)?
        };
        let index = if scan.index_exists {
            vfs.open(&files.index, OpenMode::ReadWrite)
                .at(&files.index)?
        } else {
            created = true;
            vfs.open(&files.index, OpenMode::CreateNew)
                .at(&files.index)?
        };
        if created {
            vfs.sync_dir(dir).at(dir)?;
        }
        if let Some(repair) = &scan.repair {
            for &(entry, said, is) in &repair.rewritten {
                tracing::warn!(file = %files.index.display(), entry, said, frames_say = is, "index entry contradicts its CRC-valid frame; rewritten from the frame");
                index
                    .write_all_at(&index::encode(&[is]), index::entry_pos(entry as u64))
                    .at(&files.index)?;
            }
            if !repair.rewritten.is_empty() {
                index.sync_data().at(&files.index)?;
            }
        }
        if scan.torn_index_bytes() > 0 {
            tracing::warn!(file = %files.index.display(), bytes = scan.torn_index_bytes(), "cutting a torn, never-synced index tail");
            index
                .set_len(scan.index_len - scan.torn_index_bytes())
                .at(&files.index)?;
            index.sync_data().at(&files.index)?;
        }
        if scan.uncommitted_bytes() > 0 {
            tracing::warn!(file = %files.data.display(), bytes = scan.uncommitted_bytes(), "cutting uncommitted data after the last indexed entry");
            data.set_len(scan.committed_end).at(&files.data)?;
            data.sync_data().at(&files.data)?;
        }
        let count = scan.count();
        Ok(Self {
            data: cache.adopt(vfs.clone(), &files.data, data),
            index: writable.then(|| cache.adopt(vfs.clone(), &files.index, index)),
            files,
            positions: RwLock::new(scan.positions),
            committed_end: AtomicU64::new(scan.committed_end),
            indexed: AtomicU64::new(count),
        })
    }

    pub fn start(&self) -> u64 {
        self.files.start
    }

    /// Whether this segment takes appends (the tail at open, or created since).
    pub fn writable(&self) -> bool {
        self.index.is_some()
    }

    pub fn committed_count(&self) -> u64 {
        self.positions.read().len() as u64
    }

    pub fn committed_bytes(&self) -> u64 {
        self.committed_end.load(Ordering::Acquire)
    }

    // ---- the append side (called only from the log's data and index stages) ----

    /// Writes `buf` at `pos` of the data file; returns the open file, which the caller holds until
    /// the fsync that makes the write durable (see [`FileCache`]).
    pub fn write_data(&self, buf: &[u8], pos: u64) -> Result<Arc<dyn VfsFile>, StorageError> {
        let data = self.data.get().at(&self.files.data)?;
        data.write_all_at(buf, pos).at(&self.files.data)?;
        Ok(data)
    }

    /// Appends index entries for `positions` (not yet visible to readers); returns the open
    /// index file, to be held until its fsync.
    pub fn write_index(&self, positions: &[u64]) -> Result<Arc<dyn VfsFile>, StorageError> {
        let index = self
            .index
            .as_ref()
            .ok_or_else(|| StorageError::Inconsistent {
                path: self.files.index.clone(),
                reason: "append to a sealed segment".into(),
            })?
            .get()
            .at(&self.files.index)?;
        let at = index::entry_pos(self.indexed.load(Ordering::Relaxed));
        index
            .write_all_at(&index::encode(positions), at)
            .at(&self.files.index)?;
        self.indexed
            .fetch_add(positions.len() as u64, Ordering::Relaxed);
        Ok(index)
    }

    /// Cuts data and index entries written after the last commit (a batch that failed), and
    /// makes the cut durable.
    pub fn cut_uncommitted(&self) -> Result<(), StorageError> {
        let count = self.committed_count();
        let data = self.data.get().at(&self.files.data)?;
        data.set_len(self.committed_bytes()).at(&self.files.data)?;
        data.sync_data().at(&self.files.data)?;
        if let Some(index) = &self.index {
            let index = index.get().at(&self.files.index)?;
            index
                .set_len(index::entry_pos(count))
                .at(&self.files.index)?;
            index.sync_data().at(&self.files.index)?;
        }
        self.indexed.store(count, Ordering::Relaxed);
        Ok(())
    }

    /// Makes entries visible to readers, after their index fsync.
    pub fn publish(&self, positions: &[u64], end: u64) {
        self.positions.write().extend_from_slice(positions);
        self.committed_end.store(end, Ordering::Release);
    }

    // ---- the read side ----

    /// Reads up to `max_count` committed entries from `offset`, stopping early once `max_bytes` of
    /// payload are gathered (always returning at least one entry when there is one). One `pread`
    /// covers the whole run.
    pub fn read_from(
        &self,
        offset: u64,
        max_count: usize,
        max_bytes: usize,
    ) -> Result<Vec<Entry>, StorageError> {
        let (first, spans) = {
            let positions = self.positions.read();
            let Some(i) = offset.checked_sub(self.start()) else {
                return Ok(Vec::new());
            };
            let i = i as usize;
            if i >= positions.len() {
                return Ok(Vec::new());
            }
            let end_all = self.committed_end.load(Ordering::Acquire);
            let mut spans = Vec::new();
            let mut total = 0usize;
            for j in i..positions.len().min(i.saturating_add(max_count)) {
                let start = positions[j];
                let end = positions.get(j + 1).copied().unwrap_or(end_all);
                let len = end.saturating_sub(start) as usize;
                if !spans.is_empty() && total + len > max_bytes {
                    break;
                }
                total += len;
                spans.push((start, end));
            }
            (i, spans)
        };
        let Some(&(lo, _)) = spans.first() else {
            return Ok(Vec::new());
        };
        let hi = spans.last().map(|s| s.1).unwrap_or(lo);
        let mut buf = vec![0u8; (hi - lo) as usize];
        self.data
            .get()
            .at(&self.files.data)?
            .read_exact_at(&mut buf, lo)
            .at(&self.files.data)?;
        Ok(spans
            .iter()
            .enumerate()
            .map(|(k, &(start, end))| {
                let offset = self.start() + (first + k) as u64;
                let bytes = &buf[(start - lo) as usize..(end - lo) as usize];
                Entry {
                    offset,
                    payload: self.decode(bytes, offset, start),
                }
            })
            .collect())
    }

    fn decode(&self, bytes: &[u8], offset: u64, position: u64) -> Result<Vec<u8>, CorruptEntry> {
        let corrupt = |fault| CorruptEntry {
            path: self.files.data.clone(),
            offset,
            position,
            fault,
        };
        if let Some(h) = frame::Header::parse(bytes)
            && h.len as usize > MAX_PAYLOAD_LEN
        {
            return Err(corrupt(FrameFault::Truncated {
                declared: h.len,
                available: bytes.len().saturating_sub(HEADER_LEN),
            }));
        }
        frame::decode(bytes).map(<[u8]>::to_vec).map_err(corrupt)
    }
}
