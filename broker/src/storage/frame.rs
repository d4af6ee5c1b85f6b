//! The framing of one entry in a segment's data file: `[u32 length][u32 CRC32C][payload]`, both
//! integers big-endian (docs/storage.md, "Storage"). Pure functions over bytes, so they are easy to test at the byte
//! level and to fuzz.

/// Bytes in front of every payload: the length and the checksum.
pub const HEADER_LEN: usize = 8;

/// Payloads are capped so that a corrupted length field cannot make a reader allocate gigabytes.
pub const MAX_PAYLOAD_LEN: usize = 64 * 1024 * 1024;

/// Bytes of the log id that starts every frame's payload in a clustered log: the Raft term and
/// index of the entry, big-endian u64s, covered by the frame's length and CRC like the message
/// after them (docs/cluster.md, "Clustered partitions on disk").
pub const LOG_ID_LEN: usize = 16;

/// Appends the frame of a clustered log's entry to `out`: `[u32 length][u32 CRC32C][u64 term][u64
/// index][payload]`, length and CRC covering the log id and the payload.
pub fn encode_with_log_id_into(term: u64, index: u64, payload: &[u8], out: &mut Vec<u8>) {
    debug_assert!(payload.len() + LOG_ID_LEN <= MAX_PAYLOAD_LEN);
    let mut log_id = [0u8; LOG_ID_LEN];
    log_id[..8].copy_from_slice(&term.to_be_bytes());
    log_id[8..].copy_from_slice(&index.to_be_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&log_id), payload);
    out.reserve(HEADER_LEN + LOG_ID_LEN + payload.len());
    out.extend_from_slice(&((LOG_ID_LEN + payload.len()) as u32).to_be_bytes());
    out.extend_from_slice(&crc.to_be_bytes());
    out.extend_from_slice(&log_id);
    out.extend_from_slice(payload);
}

/// The `(term, index)` a clustered frame's payload starts with, and the message after it; `None`
/// when the payload is shorter than a log id.
pub fn split_log_id(payload: &[u8]) -> Option<((u64, u64), &[u8])> {
    if payload.len() < LOG_ID_LEN {
        return None;
    }
    let (id, rest) = payload.split_at(LOG_ID_LEN);
    let term = u64::from_be_bytes(id[..8].try_into().expect("8 bytes"));
    let index = u64::from_be_bytes(id[8..].try_into().expect("8 bytes"));
    Some(((term, index), rest))
}

/// Appends the frame of `payload` to `out`.
pub fn encode_into(payload: &[u8], out: &mut Vec<u8>) {
    debug_assert!(payload.len() <= MAX_PAYLOAD_LEN);
    out.reserve(HEADER_LEN + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_be_bytes());
    out.extend_from_slice(payload);
}

/// Fills in the header of a frame whose payload was written after [`HEADER_LEN`] placeholder
/// bytes at the start of `frame`.
pub fn seal_header(frame: &mut [u8]) {
    let (header, payload) = frame.split_at_mut(HEADER_LEN);
    debug_assert!(payload.len() <= MAX_PAYLOAD_LEN);
    header[..4].copy_from_slice(&(payload.len() as u32).to_be_bytes());
    header[4..].copy_from_slice(&crc32c::crc32c(payload).to_be_bytes());
}

/// The frame of `payload` as a new buffer.
pub fn encode(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    encode_into(payload, &mut out);
    out
}

/// The two header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Payload length in bytes.
    pub len: u32,
    /// CRC32C of the payload as stored.
    pub crc: u32,
}

impl Header {
    /// Parses the first [`HEADER_LEN`] bytes of `bytes`.
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let h: &[u8; HEADER_LEN] = bytes.get(..HEADER_LEN)?.try_into().ok()?;
        Some(Self {
            len: u32::from_be_bytes([h[0], h[1], h[2], h[3]]),
            crc: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
        })
    }

    /// Bytes the whole frame occupies.
    pub fn frame_len(&self) -> u64 {
        HEADER_LEN as u64 + u64::from(self.len)
    }
}

/// What is wrong with a frame; each case isolates one entry and is skippable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameFault {
    /// Fewer bytes than a header.
    ShortHeader {
        /// Bytes available.
        available: usize,
    },
    /// The header announces more payload than there is.
    Truncated {
        /// Payload length in the header.
        declared: u32,
        /// Payload bytes available.
        available: usize,
    },
    /// The payload does not match its checksum.
    CrcMismatch {
        /// The CRC in the header.
        stored: u32,
        /// The CRC of the payload bytes.
        computed: u32,
    },
    /// A clustered log's frame whose CRC-valid payload is too short to hold its log id.
    MissingLogId {
        /// The payload's length.
        len: u32,
    },
}

impl std::fmt::Display for FrameFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ShortHeader { available } => {
                write!(f, "only {available} bytes where an 8-byte header belongs")
            }
            Self::Truncated {
                declared,
                available,
            } => write!(
                f,
                "header declares {declared} payload bytes but only {available} are there"
            ),
            Self::CrcMismatch { stored, computed } => write!(
                f,
                "CRC32C mismatch: stored {stored:#010x}, payload has {computed:#010x}"
            ),
            Self::MissingLogId { len } => write!(
                f,
                "a clustered entry of {len} bytes, shorter than its {LOG_ID_LEN}-byte log id"
            ),
        }
    }
}

/// Decodes the frame at the start of `bytes` and returns its payload. Bytes after the frame are
/// ignored.
pub fn decode(bytes: &[u8]) -> Result<&[u8], FrameFault> {
    let header = Header::parse(bytes).ok_or(FrameFault::ShortHeader {
        available: bytes.len(),
    })?;
    let body = &bytes[HEADER_LEN..];
    let payload = body
        .get(..header.len as usize)
        .ok_or(FrameFault::Truncated {
            declared: header.len,
            available: body.len(),
        })?;
    let computed = crc32c::crc32c(payload);
    if computed != header.crc {
        return Err(FrameFault::CrcMismatch {
            stored: header.crc,
            computed,
        });
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Whatever is encoded decodes to itself, also with bytes after it (a segment holds many).
        #[test]
        fn encode_then_decode_is_identity(payload: Vec<u8>, trailing: Vec<u8>) {
            let mut framed = encode(&payload);
            framed.extend_from_slice(&trailing);
            proptest::prop_assert_eq!(decode(&framed).unwrap(), &payload[..]);
        }

        /// Arbitrary bytes never panic the decoder, and a flipped bit in a frame is always caught.
        #[test]
        fn damage_is_detected(payload: Vec<u8>, flip in 0usize..1 << 16, junk: Vec<u8>) {
            let _ = decode(&junk);
            let mut framed = encode(&payload);
            let bit = flip % (framed.len() * 8);
            framed[bit / 8] ^= 1 << (bit % 8);
            if let Ok(decoded) = decode(&framed) {
                // Only a flip in the length field that still frames a valid prefix can pass, and
                // then the CRC of that prefix must match: never the original payload changed.
                proptest::prop_assert!(bit < 32 && decoded != &payload[..]);
            }
        }
    }

    #[test]
    fn layout_is_big_endian_length_crc_payload() {
        let frame = encode(b"hello");
        assert_eq!(&frame[..4], &[0, 0, 0, 5]);
        assert_eq!(&frame[4..8], &crc32c::crc32c(b"hello").to_be_bytes());
        assert_eq!(&frame[8..], b"hello");
        // The CRC32C check value from RFC 3720 pins the polynomial.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn roundtrip_and_trailing_bytes_are_ignored() {
        let mut frame = encode(br#"{"a":1}"#);
        frame.extend_from_slice(b"junk");
        assert_eq!(decode(&frame).unwrap(), br#"{"a":1}"#);
        assert_eq!(decode(&encode(b"")).unwrap(), b"");
    }

    #[test]
    fn every_truncation_is_detected() {
        let frame = encode(b"0123456789");
        for cut in 0..frame.len() {
            let err = decode(&frame[..cut]).unwrap_err();
            match err {
                FrameFault::ShortHeader { .. } => assert!(cut < HEADER_LEN),
                FrameFault::Truncated { .. } => assert!(cut >= HEADER_LEN),
                other => panic!("cut {cut} seen as {other:?}"),
            }
        }
    }

    #[test]
    fn a_clustered_frame_is_a_frame_whose_payload_starts_with_the_log_id() {
        let mut frame = Vec::new();
        encode_with_log_id_into(3, 258, b"{}", &mut frame);
        assert_eq!(&frame[..4], &[0, 0, 0, 18]);
        let mut covered = Vec::new();
        covered.extend_from_slice(&3u64.to_be_bytes());
        covered.extend_from_slice(&258u64.to_be_bytes());
        covered.extend_from_slice(b"{}");
        assert_eq!(&frame[4..8], &crc32c::crc32c(&covered).to_be_bytes());
        assert_eq!(&frame[8..], &covered[..]);
        assert_eq!(frame, encode(&covered));
        let payload = decode(&frame).unwrap();
        assert_eq!(split_log_id(payload), Some(((3, 258), &b"{}"[..])));
        assert_eq!(split_log_id(&payload[..15]), None);
    }

    #[test]
    fn every_flipped_payload_bit_is_detected() {
        let frame = encode(b"payload bits");
        for bit in HEADER_LEN * 8..frame.len() * 8 {
            let mut bad = frame.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(
                matches!(decode(&bad), Err(FrameFault::CrcMismatch { .. })),
                "bit {bit}"
            );
        }
    }
}
