//! Routing a message to a partition the way Kafka's default partitioner does (docs/topics-and-groups.md, "Topics"):
//! an explicit partition wins; otherwise a keyed message goes to
//! `toPositive(murmur2(utf8(key))) % partitions`, so a key lands on the partition a Kafka producer
//! would choose; a message without a key goes to any partition (the caller's round robin).

/// Most partitions a topic may have (docs/topics-and-groups.md, "Topics").
pub const MAX_PARTITIONS: u32 = 1024;

/// Kafka's `Utils.murmur2`: 32-bit MurmurHash2 with Kafka's seed, over little-endian 4-byte words.
pub fn murmur2(data: &[u8]) -> u32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h = SEED ^ data.len() as u32;
    let words = data.chunks_exact(4);
    let tail = words.remainder();
    for w in words {
        let mut k = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^ (h >> 15)
}

/// The partition of a keyed message among `partitions` (at least 1): Kafka's
/// `toPositive(murmur2(key)) % partitions`.
pub fn partition_for_key(key: &str, partitions: u32) -> u32 {
    (murmur2(key.as_bytes()) & 0x7fff_ffff) % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectors of Kafka's own `UtilsTest.testMurmur2` (Java's signed ints).
    #[test]
    fn murmur2_matches_kafka() {
        for (input, java) in [
            (&b"21"[..], -973_932_308i32),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
            (&[12, 42, 56, 24, 109, 111], 274_204_207),
        ] {
            assert_eq!(murmur2(input) as i32, java, "{input:?}");
        }
    }

    #[test]
    fn keys_land_where_kafka_puts_them() {
        // toPositive("21") = 1173551340, toPositive("foobar") = 1357151166.
        assert_eq!(partition_for_key("21", 8), 1_173_551_340 % 8);
        assert_eq!(partition_for_key("foobar", 10), 1_357_151_166 % 10);
        assert_eq!(partition_for_key("abc", 1), 0);
        assert!((0..1000).all(|i| partition_for_key(&format!("k{i}"), 7) < 7));
    }
}
