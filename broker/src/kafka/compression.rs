//! Compressed record batches (docs/kafka.md, "Bad input"): gzip, snappy, lz4 and zstd are
//! accepted, each decompressed into at most a limit (the frame limit), so that a small batch
//! that expands to gigabytes — a decompression bomb — is refused (`CORRUPT_MESSAGE`) instead of
//! filling the broker's memory. The codec's own decompressors have no such limit.
//!
//! The formats are Kafka's: gzip and zstd streams, lz4 frames, snappy raw or in the
//! Xerial framing the Java client writes.

use std::io::Read;

use bytes::{Buf, Bytes, BytesMut};
use kafka_protocol::records::Compression;

/// Why a batch could not be decompressed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DecompressError {
    #[error("a {0:?} batch expands past the {1} bytes left of its request's limit")]
    TooLarge(Compression, usize),
    #[error("a {0:?} batch does not decompress: {1}")]
    Corrupt(Compression, String),
}

/// The Xerial snappy framing's header.
const XERIAL: &[u8; 16] = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01";

/// Decompresses one batch's records, at most `limit` bytes of them.
pub(crate) fn decompress(
    data: &mut Bytes,
    compression: Compression,
    limit: usize,
) -> Result<Bytes, DecompressError> {
    let all = data.split_to(data.len());
    let corrupt = |e: std::io::Error| DecompressError::Corrupt(compression, e.to_string());
    match compression {
        Compression::None => Ok(all),
        Compression::Gzip => bounded(
            flate2::read::GzDecoder::new(all.reader()),
            compression,
            limit,
        ),
        Compression::Zstd => bounded(
            zstd::stream::read::Decoder::new(all.reader()).map_err(corrupt)?,
            compression,
            limit,
        ),
        Compression::Lz4 => bounded(
            lz4::Decoder::new(all.reader()).map_err(corrupt)?,
            compression,
            limit,
        ),
        Compression::Snappy => snappy(all, limit),
    }
}

/// Reads a decompressing reader to its end, refusing more than `limit` bytes.
fn bounded(
    reader: impl Read,
    compression: Compression,
    limit: usize,
) -> Result<Bytes, DecompressError> {
    let mut out = Vec::new();
    reader
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| DecompressError::Corrupt(compression, e.to_string()))?;
    if out.len() > limit {
        return Err(DecompressError::TooLarge(compression, limit));
    }
    Ok(out.into())
}

/// Snappy, raw or Xerial-framed; each block's stated length is checked against what is left of
/// the limit before anything is allocated for it.
fn snappy(mut data: Bytes, limit: usize) -> Result<Bytes, DecompressError> {
    let corrupt = |why: String| DecompressError::Corrupt(Compression::Snappy, why);
    let block = |compressed: &[u8], out: &mut BytesMut| -> Result<(), DecompressError> {
        let len = snap::raw::decompress_len(compressed).map_err(|e| corrupt(e.to_string()))?;
        if out.len().saturating_add(len) > limit {
            return Err(DecompressError::TooLarge(Compression::Snappy, limit));
        }
        let start = out.len();
        out.resize(start + len, 0);
        snap::raw::Decoder::new()
            .decompress(compressed, &mut out[start..])
            .map_err(|e| corrupt(e.to_string()))?;
        Ok(())
    };
    let mut out = BytesMut::new();
    if !data.starts_with(XERIAL) {
        block(&data, &mut out)?;
        return Ok(out.freeze());
    }
    data.advance(XERIAL.len());
    while data.has_remaining() {
        if data.remaining() < 4 {
            return Err(corrupt("a block length cut short".into()));
        }
        let n = data.get_u32() as usize;
        if data.remaining() < n {
            return Err(corrupt("a block cut short".into()));
        }
        let compressed = data.split_to(n);
        block(&compressed, &mut out)?;
    }
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn gzip(data: &[u8]) -> Bytes {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap().into()
    }

    #[test]
    fn every_codec_round_trips_within_the_limit() {
        let data: Vec<u8> = (0..100_000u32)
            .flat_map(|i| (i % 251).to_be_bytes())
            .collect();
        let lz4 = {
            let mut e = lz4::EncoderBuilder::new().build(Vec::new()).unwrap();
            e.write_all(&data).unwrap();
            e.finish().0
        };
        let xerial = {
            let mut v = XERIAL.to_vec();
            for chunk in data.chunks(32 << 10) {
                let c = snap::raw::Encoder::new().compress_vec(chunk).unwrap();
                v.extend_from_slice(&(c.len() as u32).to_be_bytes());
                v.extend_from_slice(&c);
            }
            v
        };
        for (c, compressed) in [
            (Compression::Gzip, gzip(&data)),
            (
                Compression::Zstd,
                zstd::encode_all(&data[..], 3).unwrap().into(),
            ),
            (Compression::Lz4, lz4.into()),
            (
                Compression::Snappy,
                snap::raw::Encoder::new()
                    .compress_vec(&data)
                    .unwrap()
                    .into(),
            ),
            (Compression::Snappy, xerial.into()),
        ] {
            let mut input = compressed;
            assert_eq!(decompress(&mut input, c, 1 << 20).unwrap(), data, "{c:?}");
        }
    }

    #[test]
    fn a_bomb_is_refused_before_it_is_held() {
        // 64 MiB of zeros is 64 KiB of gzip and a few KiB of zstd.
        let zeros = vec![0u8; 64 << 20];
        let mut gz = gzip(&zeros);
        assert!(matches!(
            decompress(&mut gz, Compression::Gzip, 1 << 20),
            Err(DecompressError::TooLarge(..))
        ));
        let mut zs: Bytes = zstd::encode_all(&zeros[..], 3).unwrap().into();
        assert!(matches!(
            decompress(&mut zs, Compression::Zstd, 1 << 20),
            Err(DecompressError::TooLarge(..))
        ));
        // A snappy block that claims 4 GiB: refused by its stated length.
        let mut claim = BytesMut::new();
        claim.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
        let mut claim = claim.freeze();
        assert!(decompress(&mut claim, Compression::Snappy, 1 << 20).is_err());
    }
}
