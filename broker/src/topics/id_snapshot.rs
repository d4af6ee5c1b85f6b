//! The snapshot of a topic's produce ids, `topics/{topic}/ids` (docs/storage.md, "Produce-id
//! snapshots"): what [`super::dedup::Dedup`] held, so that a boot restores the dedupe window
//! without reading the messages of the window again.
//!
//! Layout, integers big-endian:
//!
//! ```text
//! magic "MMMQIDS\0" | version u32 = 1 | topic id [16] | seed u64 | partitions u32
//! scannedTo u64 (one per partition) | entries u64
//! entry: key u128 | partition u32 | offset u64 | atMs u64   (36 bytes each)
//! CRC32C u32 of every byte before it
//! ```
//!
//! The promise a file makes: every id of the window whose message is stored in partition `p`
//! below `scannedTo[p]` is among its entries (unless the table had already forgotten it), and
//! every entry is below its partition's `scannedTo`. Boot reads the log from there on. Any file
//! that keeps the promise is correct however old it is, so it is written with a rename but never
//! fsynced: a power cut leaves an old file, a torn one (its CRC fails) or none, and each of those
//! costs only a longer scan.

use std::path::Path;

use mmmq_core::{Topic, TopicId};

use super::dedup::Key;
use crate::storage::error::IoContext;
use crate::storage::vfs::{OpenMode, read_whole};
use crate::storage::{StorageError, Vfs};

/// The snapshot's file name, in the topic's directory (partition 0's log directory: not named
/// like a segment, so the log's listing passes over it, as over `topic.json`).
pub const FILE: &str = "ids";
/// What a file starts with.
const MAGIC: &[u8; 8] = b"MMMQIDS\0";
/// The only layout there is.
const VERSION: u32 = 1;
/// Magic, version, topic id, seed, partition count.
const HEAD_LEN: usize = 8 + 4 + 16 + 8 + 4;
/// Key, partition, offset, time.
pub const ENTRY_LEN: usize = 16 + 4 + 8 + 8;

/// One remembered id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdEntry {
    /// Its key under the snapshot's seed.
    pub key: Key,
    /// Where its message went.
    pub partition: u32,
    /// Its offset there.
    pub offset: u64,
    /// When it was claimed (or, found in the log, its message's timestamp).
    pub at_ms: u64,
}

/// Why a snapshot file is not used (boot then rebuilds the window from the log).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    /// It does not start like a snapshot.
    #[error("not a produce-id snapshot (bad magic)")]
    Magic,
    /// A layout this broker does not read.
    #[error("layout version {0}; this broker reads version {VERSION}")]
    Version(u32),
    /// Shorter or longer than its counts say.
    #[error("{len} bytes, not the {expected} its counts say")]
    Length {
        /// The file's length.
        len: usize,
        /// What its header and counts add up to.
        expected: usize,
    },
    /// Its bytes are not the ones written.
    #[error("CRC32C mismatch")]
    Checksum,
    /// Written for an earlier incarnation of the topic (deleted and made again).
    #[error("written for topic id {0}, not this incarnation's")]
    Incarnation(TopicId),
    /// It lists partitions the topic does not have.
    #[error("lists {listed} partitions; the topic has {has}")]
    Partitions {
        /// Partitions in the file.
        listed: u32,
        /// Partitions of the topic.
        has: u32,
    },
    /// A partition's log ends before where the snapshot says it was read to: the log was cut
    /// since (a repair), so its entries may name messages that are gone.
    #[error("partition {partition} was read to offset {scanned_to}, past its log's end {next}")]
    PastEnd {
        /// The partition.
        partition: u32,
        /// Its `scannedTo`.
        scanned_to: u64,
        /// Its log's next offset.
        next: u64,
    },
    /// An entry outside what its partition was read to.
    #[error("entry {index} at partition {partition} offset {offset} is outside what was read")]
    Entry {
        /// Its position among the entries.
        index: u64,
        /// Its partition.
        partition: u32,
        /// Its offset.
        offset: u64,
    },
    /// The file cannot be read.
    #[error("cannot read it: {0}")]
    Read(String),
}

/// A snapshot that passed every check against the topic it is loaded for.
#[derive(Debug)]
pub struct Snapshot {
    /// The seed its keys were made with.
    pub seed: u64,
    /// Per partition, the offset below which every stored id is among the entries.
    pub scanned_to: Vec<u64>,
    bytes: Vec<u8>,
    entries_at: usize,
    count: usize,
}

impl Snapshot {
    /// Its entries, in the order written (each shard's in claim order).
    pub fn entries(&self) -> impl Iterator<Item = IdEntry> + '_ {
        self.bytes[self.entries_at..self.entries_at + self.count * ENTRY_LEN]
            .chunks_exact(ENTRY_LEN)
            .map(decode_entry)
    }

    /// How many entries it holds.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

fn be<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    b[at..at + N].try_into().expect("length checked")
}

fn decode_entry(e: &[u8]) -> IdEntry {
    IdEntry {
        key: u128::from_be_bytes(be(e, 0)),
        partition: u32::from_be_bytes(be(e, 16)),
        offset: u64::from_be_bytes(be(e, 20)),
        at_ms: u64::from_be_bytes(be(e, 28)),
    }
}

/// Writes a snapshot: the header, then entries as they come, then the count and the CRC.
#[derive(Debug)]
pub struct Encoder {
    buf: Vec<u8>,
    count_at: usize,
    count: u64,
    scanned_to: Vec<u64>,
}

impl Encoder {
    /// A snapshot of topic incarnation `id` whose keys are made with `seed`, read to
    /// `scanned_to` (one offset per partition).
    pub fn new(id: TopicId, seed: u64, scanned_to: Vec<u64>) -> Self {
        let mut buf = Vec::with_capacity(HEAD_LEN + 8 * scanned_to.len() + 12);
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&VERSION.to_be_bytes());
        buf.extend_from_slice(id.as_bytes());
        buf.extend_from_slice(&seed.to_be_bytes());
        buf.extend_from_slice(&(scanned_to.len() as u32).to_be_bytes());
        for s in &scanned_to {
            buf.extend_from_slice(&s.to_be_bytes());
        }
        let count_at = buf.len();
        buf.extend_from_slice(&0u64.to_be_bytes());
        Self {
            buf,
            count_at,
            count: 0,
            scanned_to,
        }
    }

    /// Adds `e` if it keeps the file's promise (below its partition's `scannedTo`); an id
    /// stored at or past it is found by the boot's scan of the log instead.
    pub fn push(&mut self, e: IdEntry) -> bool {
        let below = self
            .scanned_to
            .get(e.partition as usize)
            .is_some_and(|&s| e.offset < s);
        if below {
            self.buf.extend_from_slice(&e.key.to_be_bytes());
            self.buf.extend_from_slice(&e.partition.to_be_bytes());
            self.buf.extend_from_slice(&e.offset.to_be_bytes());
            self.buf.extend_from_slice(&e.at_ms.to_be_bytes());
            self.count += 1;
        }
        below
    }

    /// The file's bytes.
    pub fn finish(mut self) -> Written {
        self.buf[self.count_at..self.count_at + 8].copy_from_slice(&self.count.to_be_bytes());
        let crc = crc32c::crc32c(&self.buf);
        self.buf.extend_from_slice(&crc.to_be_bytes());
        Written {
            bytes: self.buf,
            scanned_to: self.scanned_to,
        }
    }
}

/// A snapshot ready to be written.
#[derive(Debug)]
pub struct Written {
    /// The file's bytes.
    pub bytes: Vec<u8>,
    /// What it was read to, per partition.
    pub scanned_to: Vec<u64>,
}

/// Checks `bytes` against the topic incarnation `id` whose partitions' logs end at `next`.
pub fn decode(bytes: Vec<u8>, id: TopicId, next: &[u64]) -> Result<Snapshot, Rejected> {
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(Rejected::Magic);
    }
    let short = |expected| Rejected::Length {
        len: bytes.len(),
        expected,
    };
    if bytes.len() < HEAD_LEN {
        return Err(short(HEAD_LEN));
    }
    let version = u32::from_be_bytes(be(&bytes, 8));
    if version != VERSION {
        return Err(Rejected::Version(version));
    }
    let partitions = u32::from_be_bytes(be(&bytes, HEAD_LEN - 4));
    let entries_at = HEAD_LEN + 8 * partitions as usize + 8;
    if bytes.len() < entries_at + 4 {
        return Err(short(entries_at + 4));
    }
    let count = u64::from_be_bytes(be(&bytes, entries_at - 8));
    let expected = usize::try_from(count)
        .ok()
        .and_then(|c| c.checked_mul(ENTRY_LEN))
        .and_then(|n| n.checked_add(entries_at + 4));
    if expected != Some(bytes.len()) {
        return Err(short(expected.unwrap_or(usize::MAX)));
    }
    let crc_at = bytes.len() - 4;
    if crc32c::crc32c(&bytes[..crc_at]) != u32::from_be_bytes(be(&bytes, crc_at)) {
        return Err(Rejected::Checksum);
    }
    let written_for = TopicId::from_bytes(be(&bytes, 12));
    if written_for != id {
        return Err(Rejected::Incarnation(written_for));
    }
    if partitions as usize > next.len() {
        return Err(Rejected::Partitions {
            listed: partitions,
            has: next.len() as u32,
        });
    }
    let scanned_to: Vec<u64> = (0..partitions as usize)
        .map(|p| u64::from_be_bytes(be(&bytes, HEAD_LEN + 8 * p)))
        .collect();
    for (p, (&s, &n)) in scanned_to.iter().zip(next).enumerate() {
        if s > n {
            return Err(Rejected::PastEnd {
                partition: p as u32,
                scanned_to: s,
                next: n,
            });
        }
    }
    let snapshot = Snapshot {
        seed: u64::from_be_bytes(be(&bytes, 28)),
        scanned_to,
        count: count as usize,
        entries_at,
        bytes,
    };
    for (index, e) in snapshot.entries().enumerate() {
        let inside = snapshot
            .scanned_to
            .get(e.partition as usize)
            .is_some_and(|&s| e.offset < s);
        if !inside {
            return Err(Rejected::Entry {
                index: index as u64,
                partition: e.partition,
                offset: e.offset,
            });
        }
    }
    Ok(snapshot)
}

/// The snapshot in the topic directory `dir`, if there is one that is valid for incarnation
/// `id` with logs ending at `next`; a file that is not is named in a warning and passed over
/// (left in place: the next snapshot replaces it). Blocking.
pub fn load(
    vfs: &dyn Vfs,
    dir: &Path,
    topic: &Topic,
    id: TopicId,
    next: &[u64],
) -> Option<Snapshot> {
    let path = dir.join(FILE);
    let checked = match read_whole(vfs, &path) {
        Ok(None) => return None,
        Ok(Some(bytes)) => decode(bytes, id, next),
        Err(e) => Err(Rejected::Read(e.to_string())),
    };
    checked
        .inspect_err(|why| {
            tracing::warn!(topic = %topic, file = %path.display(), %why, "ignoring the produce-id snapshot; reading the window's messages instead");
        })
        .ok()
}

/// Replaces the snapshot in the topic directory `dir` (a temporary file renamed over it; not
/// synced, see the module's docs). Never creates `dir`: a topic deleted meanwhile stays gone.
/// Blocking.
pub fn write(vfs: &dyn Vfs, dir: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    let (path, tmp) = (dir.join(FILE), dir.join(format!("{FILE}.tmp")));
    let file = vfs.open(&tmp, OpenMode::CreateTruncate).at(&tmp)?;
    let written = file.write_all_at(bytes, 0).at(&tmp);
    drop(file);
    if written.is_err() {
        // A full disk: the half-written file would hold space the logs need.
        let _ = vfs.remove_file(&tmp);
    }
    written?;
    vfs.rename(&tmp, &path).at(&path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> TopicId {
        TopicId::from_bytes([n; 16])
    }

    fn sample() -> Vec<u8> {
        let mut e = Encoder::new(id(1), 0x0102_0304_0506_0708, vec![3, 0]);
        assert!(e.push(IdEntry {
            key: 0xAA,
            partition: 0,
            offset: 2,
            at_ms: 9,
        }));
        // At or past `scannedTo`, or in a partition it does not list: left to the scan.
        for (partition, offset) in [(0, 3), (1, 0), (2, 0)] {
            assert!(!e.push(IdEntry {
                key: 1,
                partition,
                offset,
                at_ms: 9,
            }));
        }
        e.finish().bytes
    }

    #[test]
    fn the_layout_is_the_documented_one_byte_for_byte() {
        let b = sample();
        assert_eq!(b.len(), HEAD_LEN + 2 * 8 + 8 + ENTRY_LEN + 4);
        assert_eq!(&b[..8], b"MMMQIDS\0");
        assert_eq!(b[8..12], [0, 0, 0, 1]);
        assert_eq!(b[12..28], [1; 16]);
        assert_eq!(b[28..36], [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(b[36..40], [0, 0, 0, 2], "partitions");
        assert_eq!(b[40..48], 3u64.to_be_bytes(), "scannedTo of partition 0");
        assert_eq!(b[48..56], 0u64.to_be_bytes(), "scannedTo of partition 1");
        assert_eq!(b[56..64], 1u64.to_be_bytes(), "entries");
        assert_eq!(b[64..80], 0xAAu128.to_be_bytes());
        assert_eq!(b[80..84], [0; 4]);
        assert_eq!(b[84..92], 2u64.to_be_bytes());
        assert_eq!(b[92..100], 9u64.to_be_bytes());
        assert_eq!(b[100..], crc32c::crc32c(&b[..100]).to_be_bytes());
        let s = decode(b, id(1), &[3, 0, 5]).unwrap();
        assert_eq!(
            (s.seed, s.scanned_to.clone()),
            (0x0102030405060708, vec![3, 0])
        );
        assert_eq!(
            s.entries().collect::<Vec<_>>(),
            [IdEntry {
                key: 0xAA,
                partition: 0,
                offset: 2,
                at_ms: 9
            }]
        );
    }

    #[test]
    fn a_file_that_is_not_exactly_what_was_written_is_rejected() {
        let good = sample();
        let check = |b: Vec<u8>| decode(b, id(1), &[3, 0]).unwrap_err();
        assert_eq!(check(Vec::new()), Rejected::Magic);
        assert_eq!(check(b"MMMQIDX\0rest".to_vec()), Rejected::Magic);
        for cut in [9, HEAD_LEN, 60, good.len() - 1] {
            assert!(
                matches!(check(good[..cut].to_vec()), Rejected::Length { .. }),
                "cut at {cut}"
            );
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(matches!(check(longer), Rejected::Length { .. }));
        let mut v2 = good.clone();
        v2[11] = 2;
        assert_eq!(check(v2), Rejected::Version(2));
        for at in [28, 44, 70, 95, good.len() - 1] {
            let mut flipped = good.clone();
            flipped[at] ^= 0x10;
            assert_eq!(check(flipped), Rejected::Checksum, "bit flipped at {at}");
        }
        // A huge entry count does not overflow or allocate.
        let mut huge = good.clone();
        huge[56..64].copy_from_slice(&u64::MAX.to_be_bytes());
        assert!(matches!(check(huge), Rejected::Length { .. }));
    }

    #[test]
    fn a_file_of_another_incarnation_or_a_longer_log_is_rejected() {
        let b = sample;
        assert_eq!(
            decode(b(), id(2), &[3, 0]).unwrap_err(),
            Rejected::Incarnation(id(1))
        );
        assert_eq!(
            decode(b(), id(1), &[3]).unwrap_err(),
            Rejected::Partitions { listed: 2, has: 1 }
        );
        assert_eq!(
            decode(b(), id(1), &[2, 0]).unwrap_err(),
            Rejected::PastEnd {
                partition: 0,
                scanned_to: 3,
                next: 2
            }
        );
        // An entry at or past its partition's scannedTo breaks the promise (written by hand:
        // the encoder never writes one).
        let mut e = Encoder::new(id(1), 0, vec![3]);
        e.scanned_to = vec![9];
        e.push(IdEntry {
            key: 1,
            partition: 0,
            offset: 5,
            at_ms: 0,
        });
        let bytes = e.finish().bytes;
        assert_eq!(bytes[40..48], 3u64.to_be_bytes(), "the header says 3");
        assert_eq!(
            decode(bytes, id(1), &[9]).unwrap_err(),
            Rejected::Entry {
                index: 0,
                partition: 0,
                offset: 5
            }
        );
    }
}
