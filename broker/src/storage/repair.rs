//! Reconciling the tail segment's index with its data frames at recovery (docs/storage.md, "Storage"):
//! the data fsync is the commit point, so every acknowledged entry has a complete, CRC-valid frame,
//! while the index may lag behind the data (it is written after the commit and synced lazily) or be
//! damaged. The frames decide.
//!
//! The index of the tail segment can disagree with its data for three reasons: entries never
//! written or never synced (the index lags), a torn index write (a lost sector reads as zeros), and
//! a flipped bit at rest. Entries are CRC-framed and self-describing — `[length][CRC32C][payload]`
//! from byte 0, an entry's length is never 0 — so the frames alone say where every entry is.
//!
//! The rule, for an index of `n` entries and the `f` CRC-valid frames that follow each other from
//! byte 0:
//! - entries `0..min(n, f)` are taken from the frames (an entry that said something else is
//!   rewritten, and the repair is logged with what it said);
//! - entries past the valid frames that are all zero are a torn, never-synced index write: cut;
//! - a non-zero entry past the valid frames names an entry whose frame is damaged: kept as an
//!   isolated corrupt entry (a CRC mismatch isolates one entry) when it follows its predecessor
//!   and fits in the data, and otherwise the boot stops with an error naming the index file;
//! - after the last entry kept, every further complete, CRC-valid frame is re-indexed (entries the
//!   index had not caught up with), and the data is cut at the first byte that is not one (zeros
//!   of the preallocated tail, or the torn write of a batch whose fsync never returned).

use super::frame::{self, HEADER_LEN, Header};

/// How a tail index was reconciled with its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repair {
    /// The entry positions recovery keeps.
    pub positions: Vec<u64>,
    /// Where the last kept entry ends.
    pub committed_end: u64,
    /// Entries rewritten: (entry, what the index said, what the frames say).
    pub rewritten: Vec<(usize, u64, u64)>,
    /// Zero entries cut from the end of the index (a torn, never-synced write).
    pub cut: usize,
    /// Entries of the index file that recovery keeps (`positions[..indexed]`); the rest were found
    /// in the data past the last index entry and are appended to the index.
    pub indexed: usize,
    /// Whether non-zero bytes follow the last entry kept (a torn write of a batch that was never
    /// acknowledged, as opposed to the zeros of preallocation).
    pub torn_data: bool,
}

impl Repair {
    /// Entries found in the data past the last index entry.
    pub fn reindexed(&self) -> usize {
        self.positions.len() - self.indexed
    }

    /// Whether the index file needs writing (anything but an index that agreed and was complete).
    pub fn changes_index(&self) -> bool {
        !self.rewritten.is_empty() || self.cut > 0 || self.reindexed() > 0
    }
}

/// The CRC-valid frames that follow each other from byte `from` of `data`, stopping at the first
/// that is not one (a zero length, a frame past the end, a CRC mismatch), and at `limit` frames.
fn valid_frames(data: &[u8], from: usize, limit: usize) -> Vec<u64> {
    let mut out = Vec::new();
    let mut pos = from;
    while out.len() < limit && pos < data.len() {
        // An empty payload with a zero CRC is what a zero-filled tail decodes to: not an entry.
        match frame::decode(&data[pos..]) {
            Ok(payload) if !payload.is_empty() => {
                out.push(pos as u64);
                pos += HEADER_LEN + payload.len();
            }
            _ => break,
        }
    }
    out
}

/// Reconciles `index` (the tail segment's entries) with `data` (its whole data file), by the rule
/// in the module documentation. `Err` says why the index cannot be trusted.
pub fn reconcile(index: &[u64], data: &[u8]) -> Result<Repair, String> {
    let frames = valid_frames(data, 0, index.len());
    let mut positions = Vec::with_capacity(index.len());
    let mut rewritten = Vec::new();
    for (k, (&said, &is)) in index.iter().zip(&frames).enumerate() {
        if said != is {
            rewritten.push((k, said, is));
        }
        positions.push(is);
    }
    let beyond = &index[frames.len()..];
    // Zeros are a lost sector, except entry 0, whose position is 0: it stays and must be there.
    let kept = beyond
        .iter()
        .rposition(|&p| p != 0)
        .map_or(0, |i| i + 1)
        .max(usize::from(frames.is_empty() && !index.is_empty()));
    let cut = beyond.len() - kept;
    for (i, &p) in beyond[..kept].iter().enumerate() {
        let k = frames.len() + i;
        let follows = positions
            .last()
            .is_none_or(|&prev| p >= prev + HEADER_LEN as u64);
        let fits = p.saturating_add(HEADER_LEN as u64) <= data.len() as u64;
        if !follows || !fits {
            let why = if fits {
                "does not follow the entry before it"
            } else {
                "is past the end of the data file"
            };
            return Err(format!(
                "index entry {k} points to byte {p}, which {why} ({} bytes, {} CRC-valid frames \
                 from the start); entries there may have been acknowledged, so nothing is cut",
                data.len(),
                frames.len()
            ));
        }
        positions.push(p);
    }
    let indexed_end = match positions.last() {
        None => 0,
        Some(&last) => {
            let h = Header::parse(&data[last as usize..]).expect("fits, checked above");
            let end = last.saturating_add(h.frame_len());
            if end > data.len() as u64 {
                return Err(format!(
                    "index entry {} (position {last}) ends at byte {end}, past the end of the data \
                     file ({} bytes)",
                    positions.len() - 1,
                    data.len()
                ));
            }
            end
        }
    };
    let indexed = positions.len();
    let more = valid_frames(data, indexed_end as usize, usize::MAX);
    let committed_end = match more.last() {
        Some(&last) => {
            last + Header::parse(&data[last as usize..])
                .expect("a valid frame")
                .frame_len()
        }
        None => indexed_end,
    };
    positions.extend(more);
    let torn_data = data[committed_end as usize..].iter().any(|&b| b != 0);
    Ok(Repair {
        positions,
        committed_end,
        rewritten,
        cut,
        indexed,
        torn_data,
    })
}

#[cfg(test)]
mod tests {
    use super::super::frame::encode_into;
    use super::*;

    /// A data file of `n` frames with payloads of varied lengths, and their positions.
    fn data(n: usize) -> (Vec<u8>, Vec<u64>) {
        let mut out = Vec::new();
        let mut positions = Vec::new();
        for i in 0..n {
            positions.push(out.len() as u64);
            encode_into(
                format!("entry {i} {}", "x".repeat(i % 7)).as_bytes(),
                &mut out,
            );
        }
        (out, positions)
    }

    #[test]
    fn an_index_that_agrees_is_kept_as_it_is() {
        let (d, p) = data(10);
        let r = reconcile(&p, &d).unwrap();
        assert_eq!(r.positions, p);
        assert_eq!((r.rewritten.len(), r.cut), (0, 0));
        assert_eq!(r.committed_end, d.len() as u64);
    }

    #[test]
    fn a_flipped_bit_in_an_early_entry_is_rewritten_and_nothing_after_it_is_lost() {
        let (d, p) = data(100);
        for bit in [0, 3, 17, 40, 63] {
            let mut idx = p.clone();
            idx[5] ^= 1 << bit;
            let r = reconcile(&idx, &d).unwrap();
            assert_eq!(r.positions, p, "bit {bit}");
            assert_eq!(r.rewritten, vec![(5, idx[5], p[5])]);
            assert_eq!(r.cut, 0);
        }
    }

    #[test]
    fn a_flipped_bit_in_the_last_entry_is_rewritten() {
        let (d, p) = data(20);
        let mut idx = p.clone();
        idx[19] ^= 1 << 2;
        let r = reconcile(&idx, &d).unwrap();
        assert_eq!(r.positions, p);
        assert_eq!(r.committed_end, d.len() as u64);
    }

    #[test]
    fn zeros_after_the_valid_frames_are_a_torn_tail_and_are_cut() {
        let (mut d, p) = data(70);
        // The last 7 entries' data never became valid (an unsynced write), their index slots are
        // zeros (lost sectors).
        d.truncate(p[63] as usize + 3);
        let mut idx = p.clone();
        for e in &mut idx[63..] {
            *e = 0;
        }
        let r = reconcile(&idx, &d).unwrap();
        assert_eq!(r.positions, p[..63]);
        assert_eq!(r.cut, 7);
        assert_eq!(r.committed_end, p[63]);
    }

    #[test]
    fn a_hole_of_zeros_before_valid_entries_is_filled_from_the_frames() {
        let (d, p) = data(72);
        let mut idx = p.clone();
        for e in &mut idx[63..66] {
            *e = 0;
        }
        let r = reconcile(&idx, &d).unwrap();
        assert_eq!(r.positions, p);
        assert_eq!(r.rewritten.len(), 3);
    }

    #[test]
    fn entry_zero_is_never_taken_for_a_lost_sector() {
        let (mut d, p) = data(1);
        d.truncate(d.len() - 3);
        let e = reconcile(&p, &d).unwrap_err();
        assert!(e.contains("past the end of the data file"), "{e}");
    }

    #[test]
    fn a_damaged_frame_under_a_plausible_entry_is_kept_as_an_isolated_corrupt_entry() {
        let (mut d, p) = data(10);
        // Flip a payload byte of entry 9: its CRC fails, the index entry is right.
        let at = p[9] as usize + HEADER_LEN + 1;
        d[at] ^= 0x40;
        let r = reconcile(&p, &d).unwrap();
        assert_eq!(r.positions, p);
        assert_eq!(r.committed_end, d.len() as u64);
    }

    #[test]
    fn an_entry_past_the_valid_frames_that_contradicts_the_data_stops_the_boot() {
        let (mut d, p) = data(10);
        let at = p[8] as usize + HEADER_LEN;
        d[at] ^= 0x40;
        let mut idx = p.clone();
        idx[9] = d.len() as u64 + 100;
        let e = reconcile(&idx, &d).unwrap_err();
        assert!(
            e.contains("index entry 9") && e.contains("nothing is cut"),
            "{e}"
        );
    }
}
