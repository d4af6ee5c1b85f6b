//! Reading a log directory as it is on disk, without changing it: which segments there are, what
//! each index says, and where the files disagree. Recovery ([`super::log::Log::open`]) acts on a
//! scan; `mmmq inspect` prints one.

use std::path::{Path, PathBuf};

use super::error::{IoContext, StorageError};
use super::frame::{self, HEADER_LEN, Header};
use super::index;
use super::repair::{self, Repair};
use super::vfs::{OpenMode, Vfs};

/// Extension of segment data files.
pub const DATA_EXT: &str = "mmm";
/// Extension of offset index files.
pub const INDEX_EXT: &str = "idx";
/// Bytes per index entry: one big-endian u64 position (see [`super::index`]).
pub const INDEX_ENTRY_LEN: u64 = index::ENTRY_LEN;

/// The file name of a segment file: its start offset in 19 digits (the width of `i64::MAX`, as in
/// MMMQ), so that names sort in offset order.
pub fn segment_file_name(start: u64, ext: &str) -> String {
    format!("{start:019}.{ext}")
}

/// The two files of one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentFiles {
    /// The offset of the segment's first entry.
    pub start: u64,
    /// The `.mmm` file.
    pub data: PathBuf,
    /// The `.idx` file.
    pub index: PathBuf,
}

impl SegmentFiles {
    /// The files of the segment starting at `start` in `dir`.
    pub fn new(dir: &Path, start: u64) -> Self {
        Self {
            start,
            data: dir.join(segment_file_name(start, DATA_EXT)),
            index: dir.join(segment_file_name(start, INDEX_EXT)),
        }
    }
}

/// The segments found in a directory, in offset order, plus the names that looked like segment
/// files but are not (they are left alone and reported).
#[derive(Debug, Default)]
pub struct Listing {
    /// Segments by start offset.
    pub segments: Vec<SegmentFiles>,
    /// `.mmm`/`.idx` files whose name is not a 19-digit offset.
    pub strays: Vec<String>,
}

/// Lists the segments of the log in `dir`.
pub fn list_segments(vfs: &dyn Vfs, dir: &Path) -> Result<Listing, StorageError> {
    let mut starts = std::collections::BTreeSet::new();
    let mut strays = Vec::new();
    for name in vfs.read_dir(dir).at(dir)? {
        let Some((stem, ext)) = name.rsplit_once('.') else {
            continue;
        };
        if ext != DATA_EXT && ext != INDEX_EXT {
            continue;
        }
        match stem.parse::<u64>() {
            Ok(start) if stem.len() == 19 => {
                starts.insert(start);
            }
            _ => strays.push(name),
        }
    }
    Ok(Listing {
        segments: starts
            .into_iter()
            .map(|s| SegmentFiles::new(dir, s))
            .collect(),
        strays,
    })
}

/// What one segment's files say, read-only.
#[derive(Debug, Clone)]
pub struct SegmentScan {
    /// Its files.
    pub files: SegmentFiles,
    /// Start positions of the committed entries; read whole only for the tail (and by
    /// `mmmq inspect`): for a sealed segment at boot only the first and last are read.
    pub positions: Vec<u64>,
    /// Committed entries (the index's whole entries, or after a repair the entries kept).
    pub entries: u64,
    /// Whether each file exists.
    pub data_exists: bool,
    /// Whether the index file exists.
    pub index_exists: bool,
    /// Length of the data file.
    pub data_len: u64,
    /// Length of the index file.
    pub index_len: u64,
    /// Where the last indexed entry ends: everything after it is uncommitted.
    pub committed_end: u64,
    /// Why the files cannot be trusted, if they cannot. Recovery refuses to open such a log.
    pub inconsistency: Option<String>,
    /// Whether the inconsistency is an index entry that does not follow the one before it (in
    /// the tail, [`scan_log`] reconciles the index with the data's frames).
    pub chain_break: bool,
    /// How the tail's index was reconciled with its frames, when it had to be: recovery rewrites
    /// the entries it names, cuts its torn zeros and appends the entries found past it.
    pub repair: Option<Repair>,
    /// Whether the data past the last indexed entry starts with a complete, CRC-valid frame. In
    /// the tail that is an entry the lazily written index had not caught up with (re-indexed); in
    /// a sealed segment, whose index is synced before the next segment exists, it cannot happen
    /// by itself and may have been acknowledged, so it stops the boot.
    pub frame_past_index: bool,
    /// Whether this is a tail whose index was reconciled with its frames. Recovery then syncs
    /// both files: after a process crash, what it read may still be only in the page cache, and
    /// an entry recovery makes visible must already survive a power cut.
    pub reconciled: bool,
}

impl SegmentScan {
    /// Committed entries.
    pub fn count(&self) -> u64 {
        self.entries
    }

    /// The offset after the last committed entry.
    pub fn end_offset(&self) -> u64 {
        self.files.start + self.count()
    }

    /// Index bytes after the last entry recovery keeps: a torn entry (an index length that is not
    /// a multiple of 8), and in the tail, zero entries of a torn, never-synced write.
    pub fn torn_index_bytes(&self) -> u64 {
        if self.inconsistency.is_some() {
            return self.index_len % INDEX_ENTRY_LEN;
        }
        let kept = self
            .repair
            .as_ref()
            .map_or(self.count(), |r| r.indexed as u64);
        self.index_len.saturating_sub(kept * INDEX_ENTRY_LEN)
    }

    /// Data bytes after the last committed entry (an append that never reached its commit point).
    pub fn uncommitted_bytes(&self) -> u64 {
        self.data_len.saturating_sub(self.committed_end)
    }
}

/// How closely recovery at open checks the tail segment against its frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TailCheck {
    /// Read the tail's data whole and reconcile every index entry with its frame (after a crash,
    /// or when nothing says the last stop was clean): torn writes are cut and flipped bits
    /// anywhere in the tail index repaired.
    #[default]
    Full,
    /// After a clean shutdown: check the last entry's frame, the first entry and that the index
    /// follows itself, and reconcile only when one of those fails. A bit flipped at rest that
    /// keeps the index in order then shows as an isolated CRC mismatch on read (and in
    /// `mmmq inspect`) instead of being repaired at boot.
    Quick,
}

/// Scans every segment of a log as recovery reads it.
///
/// The tail (the last segment holding any data or index entry) is where the commit point moves:
/// its data is synced before its index, and its index lags. It is reconciled with its CRC-valid
/// frames ([`repair`]): a torn, never-synced index write (zeros where a sector was
/// lost) is cut, an entry that contradicts a CRC-valid frame (a flipped bit, wherever it is) is
/// rewritten from it, entries past the index are re-indexed, and what cannot be reconciled stays an
/// inconsistency that stops recovery. [`TailCheck::Full`] reads the tail's data file once (at
/// most about `segment-max-bytes`); [`TailCheck::Quick`] (after a clean shutdown, which leaves the
/// exact layout) reads only its last entry, and reconciles only when that, the index's order or
/// the data's length looks wrong.
///
/// Sealed segments are trusted as their index says, and only the index's first and last entries
/// are read (`whole_sealed` reads them whole, for `mmmq inspect`): boot costs a few reads per
/// segment, not a pass over every index.
pub fn scan_log(
    vfs: &dyn Vfs,
    listing: &Listing,
    check: TailCheck,
    whole_sealed: bool,
) -> Result<Vec<SegmentScan>, StorageError> {
    let mut scans = listing
        .segments
        .iter()
        .map(|files| scan_segment(vfs, files, whole_sealed))
        .collect::<Result<Vec<_>, _>>()?;
    let tail = scans.iter().rposition(|s| s.count() > 0 || s.data_len > 0);
    for (i, s) in scans.iter_mut().enumerate() {
        if Some(i) != tail && s.frame_past_index && s.inconsistency.is_none() {
            s.inconsistency = Some(format!(
                "a CRC-valid entry at byte {} of the data file follows the last index entry of a \
                 sealed segment; it may have been acknowledged, so nothing is cut",
                s.committed_end
            ));
        }
    }
    let Some(tail) = tail else {
        return Ok(scans);
    };
    let last = &mut scans[tail];
    if !whole_sealed && last.index_exists {
        *last = scan_segment(vfs, &last.files, true)?;
    }
    if last.data_exists
        && last.index_exists
        && (check == TailCheck::Full
            || last.inconsistency.is_some()
            || last.data_len != last.committed_end
            || !last_frame_verifies(vfs, last)?)
    {
        reconcile_tail(vfs, last)?;
    }
    Ok(scans)
}

/// Whether the last indexed entry of a consistent scan is a complete frame matching its CRC.
fn last_frame_verifies(vfs: &dyn Vfs, scan: &SegmentScan) -> Result<bool, StorageError> {
    let Some(&pos) = scan.positions.last() else {
        return Ok(true);
    };
    let data = vfs
        .open(&scan.files.data, OpenMode::ReadOnly)
        .at(&scan.files.data)?;
    Ok(frame_at(&*data, pos, scan.data_len))
}

/// Reads the tail's whole data file and reconciles its index with the frames.
fn reconcile_tail(vfs: &dyn Vfs, scan: &mut SegmentScan) -> Result<(), StorageError> {
    let data = vfs
        .open(&scan.files.data, OpenMode::ReadOnly)
        .at(&scan.files.data)?;
    let mut bytes = vec![0u8; scan.data_len as usize];
    data.read_exact_at(&mut bytes, 0).at(&scan.files.data)?;
    // The scan holds every whole index entry as read (it never cuts them), so the index is not
    // read again.
    scan.reconciled = true;
    match repair::reconcile(&scan.positions, &bytes) {
        Ok(r) => {
            scan.positions = r.positions.clone();
            scan.entries = r.positions.len() as u64;
            scan.committed_end = r.committed_end;
            scan.inconsistency = None;
            scan.chain_break = false;
            scan.frame_past_index = false;
            scan.repair = (r.changes_index() || r.committed_end != scan.data_len).then_some(r);
        }
        Err(reason) => scan.inconsistency = Some(reason),
    }
    Ok(())
}

/// Reads one segment's index and checks it against its data file, trusting the index (docs/storage.md,
/// "Storage"): only the last entry's header is read from the data, and with `whole == false` only
/// the index's first and last entries (the positions are then left empty).
pub fn scan_segment(
    vfs: &dyn Vfs,
    files: &SegmentFiles,
    whole: bool,
) -> Result<SegmentScan, StorageError> {
    let data_exists = vfs.exists(&files.data);
    let index_exists = vfs.exists(&files.index);
    let data = if data_exists {
        Some(vfs.open(&files.data, OpenMode::ReadOnly).at(&files.data)?)
    } else {
        None
    };
    let data_len = match &data {
        Some(f) => f.len().at(&files.data)?,
        None => 0,
    };
    let mut positions = Vec::new();
    let mut ends = None;
    let mut index_len = 0;
    if index_exists {
        let index = vfs
            .open(&files.index, OpenMode::ReadOnly)
            .at(&files.index)?;
        index_len = index.len().at(&files.index)?;
        let entries = index_len / INDEX_ENTRY_LEN;
        if whole {
            let mut raw = vec![0u8; index::whole_len(index_len) as usize];
            index.read_exact_at(&mut raw, 0).at(&files.index)?;
            positions = index::decode(&raw);
        } else if entries > 0 {
            let mut first = [0u8; INDEX_ENTRY_LEN as usize];
            let mut last = [0u8; INDEX_ENTRY_LEN as usize];
            index.read_exact_at(&mut first, 0).at(&files.index)?;
            index
                .read_exact_at(&mut last, index::entry_pos(entries - 1))
                .at(&files.index)?;
            ends = Some((u64::from_be_bytes(first), u64::from_be_bytes(last)));
        }
    }
    let mut scan = SegmentScan {
        files: files.clone(),
        entries: index_len / INDEX_ENTRY_LEN,
        positions,
        data_exists,
        index_exists,
        data_len,
        index_len,
        committed_end: 0,
        inconsistency: None,
        chain_break: false,
        repair: None,
        frame_past_index: false,
        reconciled: false,
    };
    let ends = ends.or_else(|| Some((*scan.positions.first()?, *scan.positions.last()?)));
    scan.inconsistency = check(&mut scan, ends, data.as_deref());
    if scan.inconsistency.is_none()
        && let Some(data) = &data
        && scan.committed_end < data_len
    {
        scan.frame_past_index = frame_at(&**data, scan.committed_end, data_len);
    }
    Ok(scan)
}

/// Whether a complete, CRC-valid, non-empty frame starts at `pos`.
fn frame_at(data: &dyn super::vfs::VfsFile, pos: u64, data_len: u64) -> bool {
    let mut raw = [0u8; HEADER_LEN];
    if pos + HEADER_LEN as u64 > data_len || data.read_exact_at(&mut raw, pos).is_err() {
        return false;
    }
    let h = Header::parse(&raw).expect("8 bytes");
    if h.len == 0 || pos.saturating_add(h.frame_len()) > data_len {
        return false;
    }
    let mut frame = vec![0u8; h.frame_len() as usize];
    data.read_exact_at(&mut frame, pos).is_ok() && frame::decode(&frame).is_ok()
}

fn check(
    scan: &mut SegmentScan,
    ends: Option<(u64, u64)>,
    data: Option<&dyn super::vfs::VfsFile>,
) -> Option<String> {
    if !scan.index_exists && scan.data_len > 0 {
        return Some(format!(
            "index file is missing but the data file holds {} bytes",
            scan.data_len
        ));
    }
    // Every segment's first entry is at byte 0 of its data file.
    let (first, last) = ends?;
    if first != 0 {
        return Some(format!(
            "index entry 0 points to byte {first}; a segment's first entry is at byte 0"
        ));
    }
    let unfollowed = scan
        .positions
        .windows(2)
        .position(|pair| pair[1] < pair[0].saturating_add(HEADER_LEN as u64));
    if let Some(i) = unfollowed {
        scan.chain_break = true;
        let pair = &scan.positions[i..i + 2];
        return Some(format!(
            "index entry {} (position {}) does not follow entry {} (position {})",
            i + 1,
            pair[1],
            i,
            pair[0]
        ));
    }
    let last_i = scan.entries - 1;
    let Some(data) = data else {
        return Some(format!(
            "index holds {} entries but the data file is missing",
            scan.entries
        ));
    };
    if last.saturating_add(HEADER_LEN as u64) > scan.data_len {
        return Some(format!(
            "index entry {last_i} points to byte {last}, past the end of the data file ({} bytes)",
            scan.data_len
        ));
    }
    let mut raw = [0u8; HEADER_LEN];
    if let Err(e) = data.read_exact_at(&mut raw, last) {
        return Some(format!("cannot read the last entry's header: {e}"));
    }
    let end = last.saturating_add(Header::parse(&raw).expect("8 bytes").frame_len());
    if end > scan.data_len {
        return Some(format!(
            "index entry {last_i} (position {last}) ends at byte {end}, past the end of the data file ({} bytes)",
            scan.data_len
        ));
    }
    scan.committed_end = end;
    None
}

/// How a run of segments fits together: each must start where the one before ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainGap {
    /// Segment `index` starts after the previous one ends, and it and all after it are empty:
    /// left over from a rotation whose previous batch never committed. Safe to remove.
    EmptyTail {
        /// Position in the scan list of the first leftover segment.
        index: usize,
    },
    /// A gap or an overlap with entries after it: the log cannot be trusted.
    Broken {
        /// Position in the scan list of the segment that does not fit.
        index: usize,
        /// What is wrong.
        reason: String,
    },
}

/// Checks that the scanned segments follow each other without gaps or overlaps.
pub fn check_chain(scans: &[SegmentScan]) -> Option<ChainGap> {
    for i in 1..scans.len() {
        let expected = scans[i - 1].end_offset();
        let start = scans[i].files.start;
        if start == expected {
            continue;
        }
        if start > expected && scans[i..].iter().all(|s| s.count() == 0) {
            return Some(ChainGap::EmptyTail { index: i });
        }
        return Some(ChainGap::Broken {
            index: i,
            reason: format!(
                "segment starts at offset {start} but the segment before it ends at offset {expected}"
            ),
        });
    }
    None
}
