//! Repairing the tail segment's index from its data frames, so that recovery never cuts an entry
//! that may have been acknowledged (README, "On-disk layout").
//!
//! The index of the tail segment can disagree with its data for two reasons that look alike to a
//! simple check: a torn, never-synced index write (a lost sector reads as zeros) and a flipped bit
//! in the synced, acknowledged part. Cutting at the first entry that does not follow the one before
//! it handles the first and silently deletes up to a whole segment of acknowledged messages in the
//! second. Both are told apart, and both are handled without loss, by the frames themselves: every
//! entry of the data file is `[length][CRC32C][payload]`, and the data is synced before its index
//! entries are written, so every entry the index vouches for has a complete, CRC-valid frame at a
//! position the frames alone determine.
//!
//! The rule, for an index of `n` entries and the `f` CRC-valid frames that follow each other from
//! byte 0:
//! - entries `0..min(n, f)` are taken from the frames (an entry that said something else is
//!   rewritten, and the repair is logged with what it said);
//! - entries past the valid frames that are all zero are a torn, never-synced tail: cut;
//! - a non-zero entry past the valid frames names an entry whose frame is damaged: kept as an
//!   isolated corrupt entry (a CRC mismatch isolates one entry) when it follows its predecessor
//!   and fits in the data, and otherwise the boot stops with an error naming the index file.

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
    /// Zero entries cut from the end (a torn, never-synced write).
    pub cut: usize,
}

/// The positions of the CRC-valid frames that follow each other from byte 0 of `data`, stopping
/// at the first that is not one (a zero length, a frame past the end, a CRC mismatch), and at
/// `limit` frames.
fn valid_frames(data: &[u8], limit: usize) -> Vec<u64> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    while out.len() < limit {
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
    let frames = valid_frames(data, index.len());
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
    let committed_end = match positions.last() {
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
    Ok(Repair {
        positions,
        committed_end,
        rewritten,
        cut,
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
