//! `mmmq inspect DIR`: reads a topic directory offline, without changing a byte, and says entry by
//! entry what is there and what is wrong. It is what an operator reaches for when a disk
//! misbehaves, so it keeps going past every problem and reports them all.
//!
//! `DIR` may be a topic directory, a `topics/` directory or a root dir; the latter two inspect
//! every topic under them. Exit status: 0 when everything is sound (an uncommitted tail that
//! recovery will cut is sound), 1 when any entry is corrupt or the files are inconsistent.
//!
//! A clustered partition's directory (one with a `raft/` directory, docs/cluster.md, "Clustered
//! partitions on disk") is read the same way; each entry shows its Raft term and index, and the
//! `raft/` files are listed after the segments (`raft`).

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::cluster::log_store::RAFT_DIR;
use crate::storage::Checkpoints;
use crate::storage::error::StorageError;
use crate::storage::frame::{self, FrameFault};
use crate::storage::scan::{self, ChainGap, SegmentScan, TailCheck};
use crate::storage::vfs::{OpenMode, Vfs, VfsFile};

mod raft;

/// Options of the command.
#[derive(Debug, Clone, Default)]
pub struct InspectOptions {
    /// Leave payloads out (large topics, or when only the verdict matters).
    pub no_payload: bool,
}

/// What an inspection found, summed over every topic inspected.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Topic directories inspected.
    pub topics: usize,
    /// Segments found.
    pub segments: usize,
    /// Indexed entries.
    pub entries: u64,
    /// Entries whose frame or JSON is damaged.
    pub corrupt: u64,
    /// Inconsistencies between files (each would stop the broker's boot).
    pub inconsistencies: usize,
    /// Data bytes past the last indexed entry (recovery cuts them; not an error).
    pub uncommitted_bytes: u64,
}

impl Summary {
    /// Whether the inspected data is sound.
    pub fn is_clean(&self) -> bool {
        self.corrupt == 0 && self.inconsistencies == 0
    }
}

/// Finds the topic directories `dir` stands for.
pub fn topic_dirs(vfs: &dyn Vfs, dir: &Path) -> Result<Vec<PathBuf>, StorageError> {
    let topics = dir.join("topics");
    let container = if vfs.is_dir(&topics) {
        topics
    } else {
        let listing = scan::list_segments(vfs, dir)?;
        if !listing.segments.is_empty() || !has_subdirs_with_segments(vfs, dir)? {
            return Ok(vec![dir.to_owned()]);
        }
        dir.to_owned()
    };
    let mut names: Vec<String> = vfs
        .read_dir(&container)
        .map_err(|e| StorageError::io(&container, e))?
        .into_iter()
        .filter(|n| vfs.is_dir(&container.join(n)))
        .collect();
    names.sort();
    Ok(names.into_iter().map(|n| container.join(n)).collect())
}

fn has_subdirs_with_segments(vfs: &dyn Vfs, dir: &Path) -> Result<bool, StorageError> {
    for name in vfs.read_dir(dir).map_err(|e| StorageError::io(dir, e))? {
        let sub = dir.join(&name);
        if vfs.is_dir(&sub) && !scan::list_segments(vfs, &sub)?.segments.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Why an inspection could not finish (problems *in* the data are reported, not errors).
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// A file could not be read at all.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The report could not be written (a closed pipe, a full disk).
    #[error("cannot write the report: {0}")]
    Output(#[from] io::Error),
}

/// Inspects `dir` and writes the report to `out`.
pub fn run(
    vfs: &Arc<dyn Vfs>,
    dir: &Path,
    options: &InspectOptions,
    out: &mut dyn Write,
) -> Result<Summary, InspectError> {
    if !vfs.is_dir(dir) {
        return Err(StorageError::io(
            dir,
            io::Error::new(io::ErrorKind::NotFound, "no such directory"),
        )
        .into());
    }
    let mut summary = Summary::default();
    let dirs = topic_dirs(&**vfs, dir)?;
    for topic in &dirs {
        inspect_topic(vfs, topic, options, out, &mut summary)?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "{}",
        format_args!(
            "summary: {} topic(s), {} segment(s), {} entries, {} corrupt, {} inconsistenc{}, {} uncommitted byte(s)",
            summary.topics,
            summary.segments,
            summary.entries,
            summary.corrupt,
            summary.inconsistencies,
            if summary.inconsistencies == 1 {
                "y"
            } else {
                "ies"
            },
            summary.uncommitted_bytes
        ),
    )?;
    if summary.is_clean() {
        writeln!(out, "status: OK")?;
    } else {
        writeln!(out, "status: DAMAGED (see the lines marked !)")?;
    }
    Ok(summary)
}

fn inspect_topic(
    vfs: &Arc<dyn Vfs>,
    dir: &Path,
    options: &InspectOptions,
    out: &mut dyn Write,
    summary: &mut Summary,
) -> Result<(), InspectError> {
    summary.topics += 1;
    writeln!(out, "topic directory {}", dir.display())?;
    let listing = scan::list_segments(&**vfs, dir)?;
    for stray in &listing.strays {
        writeln!(
            out,
            "  ! {stray}: not named like a segment (19-digit start offset); ignored"
        )?;
        summary.inconsistencies += 1;
    }
    if listing.segments.is_empty() {
        writeln!(out, "  (no segments)")?;
    }
    let scans = scan::scan_log(&**vfs, &listing, TailCheck::Full, true)?;
    let clustered = vfs.is_dir(&dir.join(RAFT_DIR));
    for scan in &scans {
        summary.segments += 1;
        inspect_segment(&**vfs, scan, clustered, options, out, summary)?;
    }
    match scan::check_chain(&scans) {
        None => {}
        Some(ChainGap::EmptyTail { index }) => writeln!(
            out,
            "  note: segment {} and after are empty leftovers of an interrupted rotation (recovery removes them)",
            scan::segment_file_name(scans[index].files.start, scan::DATA_EXT)
        )?,
        Some(ChainGap::Broken { index, reason }) => {
            summary.inconsistencies += 1;
            writeln!(out, "  ! {}: {reason}", scans[index].files.index.display())?;
        }
    }
    if clustered {
        raft::inspect(&**vfs, &dir.join(RAFT_DIR), out, summary)?;
    }
    let checkpoints = Checkpoints::new(dir.join("checkpoints"), vfs.clone());
    match checkpoints.list() {
        Ok(list) if !list.is_empty() => {
            writeln!(out, "  checkpoints (next offset per consumer):")?;
            for (id, next) in list {
                writeln!(out, "    {id:<32} {next}")?;
            }
        }
        Ok(_) => {}
        Err(e) => {
            summary.inconsistencies += 1;
            writeln!(out, "  ! {e}")?;
        }
    }
    Ok(())
}

fn inspect_segment(
    vfs: &dyn Vfs,
    scan: &SegmentScan,
    clustered: bool,
    options: &InspectOptions,
    out: &mut dyn Write,
    summary: &mut Summary,
) -> Result<(), InspectError> {
    let files = &scan.files;
    writeln!(
        out,
        "  segment {}  data {} B, index {} B, {}",
        scan::segment_file_name(files.start, scan::DATA_EXT),
        scan.data_len,
        scan.index_len,
        match scan.count() {
            0 => "no entries".to_owned(),
            1 => format!("1 entry (offset {})", files.start),
            n => format!(
                "{n} entries (offsets {}-{})",
                files.start,
                scan.end_offset() - 1
            ),
        }
    )?;
    if let Some(reason) = &scan.inconsistency {
        summary.inconsistencies += 1;
        writeln!(out, "  ! {}: {reason}", files.index.display())?;
    }
    if let Some(repair) = &scan.repair {
        for (entry, said, is) in &repair.rewritten {
            // Damage to acknowledged entries, repairable without loss: still worth a non-zero exit.
            summary.inconsistencies += 1;
            writeln!(
                out,
                "  ! {}: entry {entry} says position {said} but its CRC-valid frame is at {is} (recovery rewrites it)",
                files.index.display()
            )?;
        }
    }
    if scan.torn_index_bytes() > 0 {
        writeln!(
            out,
            "  note: {} trailing index byte(s) are a torn, never-synced write (recovery cuts them)",
            scan.torn_index_bytes()
        )?;
    }
    summary.entries += scan.count();
    if scan.count() > 0 && scan.data_exists {
        let log_id_columns = if clustered {
            format!(" {:>8} {:>12}", "TERM", "INDEX")
        } else {
            String::new()
        };
        writeln!(
            out,
            "    {:>12} {:>12} {:>9}  {:<9}{log_id_columns} PAYLOAD",
            "OFFSET", "POSITION", "SIZE", "CRC"
        )?;
        let data = vfs
            .open(&files.data, OpenMode::ReadOnly)
            .map_err(|e| StorageError::io(&files.data, e))?;
        for (i, &position) in scan.positions.iter().enumerate() {
            let offset = files.start + i as u64;
            let bytes = entry_bytes(&*data, scan, i)?;
            let size = frame::Header::parse(&bytes).map_or(0, |h| h.frame_len());
            let mut log_id = String::new();
            let verdict = match frame::decode(&bytes).and_then(|payload| {
                if !clustered {
                    return Ok(payload);
                }
                let ((term, index), message) =
                    frame::split_log_id(payload).ok_or(FrameFault::MissingLogId {
                        len: payload.len() as u32,
                    })?;
                log_id = format!(" {term:>8} {index:>12}");
                Ok(message)
            }) {
                Ok(payload) => match std::str::from_utf8(payload)
                    .ok()
                    .filter(|s| serde_json::from_str::<&serde_json::value::RawValue>(s).is_ok())
                {
                    Some(json) => Ok(json.to_owned()),
                    None => Err("payload is not UTF-8 JSON".to_owned()),
                },
                Err(fault) => Err(fault.to_string()),
            };
            if clustered && log_id.is_empty() {
                log_id = format!(" {:>8} {:>12}", "?", "?");
            }
            let (crc, text) = match verdict {
                Ok(json) => (
                    "ok",
                    if options.no_payload {
                        String::new()
                    } else {
                        json
                    },
                ),
                Err(why) => {
                    summary.corrupt += 1;
                    let crc = match frame::decode(&bytes) {
                        Err(FrameFault::CrcMismatch { .. }) => "MISMATCH",
                        Err(_) => "TRUNCATED",
                        Ok(p) if clustered && p.len() < frame::LOG_ID_LEN => "SHORT",
                        Ok(_) => "ok",
                    };
                    (crc, format!("! {why}"))
                }
            };
            writeln!(
                out,
                "    {offset:>12} {position:>12} {size:>9}  {crc:<9}{log_id} {text}"
            )?;
        }
    }
    if let Some(repair) = scan.repair.as_ref().filter(|r| r.reindexed() > 0) {
        writeln!(
            out,
            "  note: {} complete entr(ies) past the last index entry (the index lags the data; recovery indexes them)",
            repair.reindexed()
        )?;
    }
    if scan.uncommitted_bytes() > 0 && scan.inconsistency.is_none() {
        let torn = scan.repair.as_ref().is_none_or(|r| r.torn_data);
        if torn {
            summary.uncommitted_bytes += scan.uncommitted_bytes();
            writeln!(
                out,
                "  note: {} byte(s) after the last complete entry were never committed (recovery cuts them)",
                scan.uncommitted_bytes()
            )?;
        } else {
            writeln!(
                out,
                "  note: {} zero byte(s) preallocated past the last entry (a running or crashed tail; recovery cuts them)",
                scan.uncommitted_bytes()
            )?;
        }
    }
    Ok(())
}

/// What [`read_entry`] found at an offset.
#[derive(Debug, PartialEq, Eq)]
pub enum Entry {
    /// The entry's payload (CRC checked).
    Payload(Vec<u8>),
    /// No committed entry has that offset: `first`…`next`−1 do.
    Missing {
        /// The first offset kept.
        first: u64,
        /// The offset after the last committed entry.
        next: u64,
    },
    /// The entry is there but damaged.
    Corrupt(String),
}

/// Reads the entry at `offset` of the log in `dir` (a partition's directory) without changing a
/// byte, as `mmmq inspect` reads (for `mmmq plugin replay`, which may run beside a live broker).
pub fn read_entry(vfs: &dyn Vfs, dir: &Path, offset: u64) -> Result<Entry, StorageError> {
    let listing = scan::list_segments(vfs, dir)?;
    let first = listing.segments.first().map_or(0, |s| s.start);
    let Some(files) = listing.segments.iter().rev().find(|s| s.start <= offset) else {
        let next = match listing.segments.last() {
            Some(last) => scan::scan_segment(vfs, last, false)?.end_offset(),
            None => 0,
        };
        return Ok(Entry::Missing { first, next });
    };
    let scan = scan::scan_segment(vfs, files, true)?;
    let i = (offset - files.start) as usize;
    if offset >= scan.end_offset() || i >= scan.positions.len() {
        let last = listing.segments.last().expect("a segment was found");
        let next = if last.start == files.start {
            scan.end_offset()
        } else {
            scan::scan_segment(vfs, last, false)?.end_offset()
        };
        return Ok(Entry::Missing { first, next });
    }
    let data = vfs
        .open(&files.data, OpenMode::ReadOnly)
        .map_err(|e| StorageError::io(&files.data, e))?;
    let bytes = entry_bytes(&*data, &scan, i)?;
    let clustered = vfs.is_dir(&dir.join(RAFT_DIR));
    let decoded = frame::decode(&bytes).and_then(|payload| match clustered {
        false => Ok(payload),
        true => frame::split_log_id(payload)
            .map(|(_, message)| message)
            .ok_or(FrameFault::MissingLogId {
                len: payload.len() as u32,
            }),
    });
    Ok(match decoded {
        Ok(payload) => Entry::Payload(payload.to_vec()),
        Err(fault) => Entry::Corrupt(format!(
            "offset {offset} in {}: {fault}",
            files.data.display()
        )),
    })
}

/// The bytes of entry `i` of a scanned segment: from its position to the next entry's (the last
/// one to the committed end), within the data file.
fn entry_bytes(data: &dyn VfsFile, scan: &SegmentScan, i: usize) -> Result<Vec<u8>, StorageError> {
    let position = scan.positions[i];
    let end = scan
        .positions
        .get(i + 1)
        .copied()
        .unwrap_or(scan.committed_end.max(position))
        .min(scan.data_len);
    let mut bytes = vec![0u8; end.saturating_sub(position) as usize];
    if !bytes.is_empty() {
        data.read_exact_at(&mut bytes, position)
            .map_err(|e| StorageError::io(&scan.files.data, e))?;
    }
    Ok(bytes)
}
