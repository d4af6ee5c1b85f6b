//! The offset index of a segment (docs/storage.md, "Storage"): one big-endian u64 per entry, the entry's
//! start position in the segment's data file. Pure functions over bytes, tested at the byte level.

/// Bytes per index entry.
pub const ENTRY_LEN: u64 = 8;

/// The index bytes of `positions`, in order.
pub fn encode(positions: &[u64]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(positions.len() * ENTRY_LEN as usize);
    for p in positions {
        raw.extend_from_slice(&p.to_be_bytes());
    }
    raw
}

/// The positions in `raw`; a torn entry at the end (fewer than 8 bytes) is left out.
pub fn decode(raw: &[u8]) -> Vec<u64> {
    raw.chunks_exact(ENTRY_LEN as usize)
        .map(|c| u64::from_be_bytes(c.try_into().expect("8-byte chunk")))
        .collect()
}

/// The bytes of whole entries in an index file of `len` bytes.
pub fn whole_len(len: u64) -> u64 {
    len - len % ENTRY_LEN
}

/// Where entry `entry` starts in the index file.
pub fn entry_pos(entry: u64) -> u64 {
    entry * ENTRY_LEN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_big_endian_u64s_back_to_back() {
        let raw = encode(&[0, 1, 258, u64::MAX]);
        assert_eq!(
            raw,
            [
                [0, 0, 0, 0, 0, 0, 0, 0],
                [0, 0, 0, 0, 0, 0, 0, 1],
                [0, 0, 0, 0, 0, 0, 1, 2],
                [0xff; 8],
            ]
            .concat()
        );
        assert_eq!(decode(&raw), [0, 1, 258, u64::MAX]);
    }

    #[test]
    fn a_torn_last_entry_is_not_an_entry() {
        let mut raw = encode(&[7, 300]);
        raw.extend_from_slice(&[0, 0, 1]);
        assert_eq!(decode(&raw), [7, 300]);
        assert_eq!(whole_len(raw.len() as u64), 16);
        assert_eq!(entry_pos(2), 16);
        assert!(decode(&[]).is_empty());
    }
}
