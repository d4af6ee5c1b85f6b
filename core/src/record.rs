//! Messages as bytes (docs/kafka.md, "Bytes in, the same bytes out"): a Kafka record's key,
//! value and headers are bytes, kept exactly as they came.
//!
//! Two things live here:
//! - [`BinaryParts`], what a message carries beyond JSON, as envelopes show it: a value that is
//!   not JSON as `contentBase64`, a key that is not UTF-8 as `keyBase64`, headers as
//!   `[{"key","valueBase64"}]`. A message produced over HTTP has none of them.
//! - The **record payload**, the binary form of a log entry's payload that a Kafka produce
//!   stores: the bytes as they came, with no base64 on the way in or out. A JSON payload always
//!   starts with `{`; a record payload starts with [`RECORD_PAYLOAD`], so each entry says which
//!   it is and root dirs from before read as they are.
//!
//! Record payload, integers big-endian: `0x01`, `timestamp u64` (the broker's clock at append,
//! what retention and status read), `flags u8` (bit 0: a key, bit 1: a value, bit 2: an
//! idempotent producer's sequence, bit 3: the producer's create time), if bit 3 `create time i64`,
//! if bit 2 the producer's `id i64, epoch i16, sequence i32` (what rebuilds its dedupe state
//! after a restart), the key as
//! `u32` length + bytes if flagged, the value likewise, `u32` header count and per header `u32`
//! length + UTF-8 key, `i32` length (−1: null) + value bytes.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::message::{MAX_CONTENT_DEPTH, content_shape};

/// The first byte of a record payload (a JSON payload's is `{`).
pub const RECORD_PAYLOAD: u8 = 0x01;

/// One record header: a UTF-8 key and a value of bytes, possibly null.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Header {
    /// The header's name.
    pub key: String,
    /// Its value, base64; `null` for a null value.
    #[serde(rename = "valueBase64")]
    pub value_base64: Option<String>,
}

/// What a message carries beyond JSON content and a UTF-8 key. All empty for a message produced
/// over HTTP.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BinaryParts {
    /// The message's `content` is not its value but the JSON string of its value's base64
    /// (`contentBase64` in envelopes), or `null` when the record has no value at all (a Kafka
    /// tombstone). What a plugin of the JSON-only world is given as content.
    pub content_base64: bool,
    /// A key that is not UTF-8, base64 (the message's `key` is then `None`).
    pub key_base64: Option<String>,
    /// The record's headers, in order.
    pub headers: Vec<Header>,
}

impl BinaryParts {
    /// Whether there is nothing beyond JSON.
    pub fn is_empty(&self) -> bool {
        !self.content_base64 && self.key_base64.is_none() && self.headers.is_empty()
    }
}

/// A record as stored: borrowed from its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordRef<'a> {
    /// Milliseconds since the Unix epoch: the broker's clock at append.
    pub timestamp: u64,
    /// The producer's create time (milliseconds since the Unix epoch), given back to Kafka
    /// consumers as it came; never read by the broker (a producer's clock may be anything).
    pub create_time: Option<i64>,
    /// The key, if any.
    pub key: Option<&'a [u8]>,
    /// The value; `None` for a tombstone.
    pub value: Option<&'a [u8]>,
    /// Headers in order: name, value (`None`: null).
    pub headers: Vec<(&'a str, Option<&'a [u8]>)>,
    /// An idempotent producer's id, epoch and this record's sequence number.
    pub producer: Option<(i64, i16, i32)>,
}

/// A payload that is neither JSON nor a well-formed record payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("record payload is malformed at byte {at}")]
pub struct MalformedRecord {
    /// Where reading it failed.
    pub at: usize,
}

/// The size of [`RecordRef`]'s record payload, to reserve before [`write_record_payload`].
pub fn record_payload_len(
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[(&str, Option<&[u8]>)],
) -> usize {
    1 + 8
        + 1
        + 8
        + 14
        + key.map_or(0, |k| 4 + k.len())
        + value.map_or(0, |v| 4 + v.len())
        + 4
        + headers
            .iter()
            .map(|(k, v)| 8 + k.len() + v.map_or(0, <[u8]>::len))
            .sum::<usize>()
}

/// Appends a record payload to `out`.
pub fn write_record_payload(out: &mut Vec<u8>, record: &RecordRef<'_>) {
    out.push(RECORD_PAYLOAD);
    out.extend_from_slice(&record.timestamp.to_be_bytes());
    let flags = u8::from(record.key.is_some())
        | (u8::from(record.value.is_some()) << 1)
        | (u8::from(record.producer.is_some()) << 2)
        | (u8::from(record.create_time.is_some()) << 3);
    out.push(flags);
    if let Some(t) = record.create_time {
        out.extend_from_slice(&t.to_be_bytes());
    }
    if let Some((id, epoch, sequence)) = record.producer {
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&epoch.to_be_bytes());
        out.extend_from_slice(&sequence.to_be_bytes());
    }
    for part in [record.key, record.value].into_iter().flatten() {
        out.extend_from_slice(&(part.len() as u32).to_be_bytes());
        out.extend_from_slice(part);
    }
    out.extend_from_slice(&(record.headers.len() as u32).to_be_bytes());
    for (k, v) in &record.headers {
        out.extend_from_slice(&(k.len() as u32).to_be_bytes());
        out.extend_from_slice(k.as_bytes());
        match v {
            Some(v) => {
                out.extend_from_slice(&(v.len() as i32).to_be_bytes());
                out.extend_from_slice(v);
            }
            None => out.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
}

/// The timestamp of a stored payload, JSON or record (the broker's clock at append), reading
/// no more of it than needed.
pub fn payload_timestamp(payload: &[u8]) -> Option<u64> {
    if is_record_payload(payload) {
        return Some(u64::from_be_bytes(payload.get(1..9)?.try_into().ok()?));
    }
    #[derive(Deserialize)]
    struct Time {
        timestamp: u64,
    }
    serde_json::from_slice::<Time>(payload)
        .ok()
        .map(|t| t.timestamp)
}

/// Whether `payload` is a record payload (else it is JSON).
pub fn is_record_payload(payload: &[u8]) -> bool {
    payload.first() == Some(&RECORD_PAYLOAD)
}

/// Reads a record payload without copying it.
pub fn read_record_payload(payload: &[u8]) -> Result<RecordRef<'_>, MalformedRecord> {
    let mut r = Reader { b: payload, at: 0 };
    if r.take(1)? != [RECORD_PAYLOAD] {
        return Err(MalformedRecord { at: 0 });
    }
    let timestamp = u64::from_be_bytes(r.take(8)?.try_into().expect("8 bytes"));
    let flags = r.take(1)?[0];
    if flags & !0b1111 != 0 {
        return Err(MalformedRecord { at: r.at - 1 });
    }
    let create_time = if flags & 8 != 0 {
        Some(i64::from_be_bytes(r.take(8)?.try_into().expect("8 bytes")))
    } else {
        None
    };
    let producer = if flags & 4 != 0 {
        let id = i64::from_be_bytes(r.take(8)?.try_into().expect("8 bytes"));
        let epoch = i16::from_be_bytes(r.take(2)?.try_into().expect("2 bytes"));
        let sequence = i32::from_be_bytes(r.take(4)?.try_into().expect("4 bytes"));
        Some((id, epoch, sequence))
    } else {
        None
    };
    let key = if flags & 1 != 0 {
        Some(r.sized()?)
    } else {
        None
    };
    let value = if flags & 2 != 0 {
        Some(r.sized()?)
    } else {
        None
    };
    let count = r.u32()? as usize;
    let mut headers = Vec::with_capacity(count.min(payload.len() / 8));
    for _ in 0..count {
        let name = r.sized()?;
        let name = std::str::from_utf8(name).map_err(|_| MalformedRecord { at: r.at })?;
        let len = r.u32()? as i32;
        let value = match len {
            -1 => None,
            n if n < 0 => return Err(MalformedRecord { at: r.at }),
            n => Some(r.take(n as usize)?),
        };
        headers.push((name, value));
    }
    if r.at != payload.len() {
        return Err(MalformedRecord { at: r.at });
    }
    Ok(RecordRef {
        timestamp,
        create_time,
        key,
        value,
        headers,
        producer,
    })
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], MalformedRecord> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or(MalformedRecord { at: self.at })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u32(&mut self) -> Result<u32, MalformedRecord> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn sized(&mut self) -> Result<&'a [u8], MalformedRecord> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

/// A value as envelope content: the value itself when it is JSON a consumer can parse (within
/// [`MAX_CONTENT_DEPTH`]), else the JSON string of its base64 with `content_base64` set, or
/// `null` with it set for no value.
pub fn content_of_value(value: Option<&[u8]>) -> (Box<RawValue>, bool) {
    let Some(value) = value else {
        return (
            RawValue::from_string("null".into()).expect("null is JSON"),
            true,
        );
    };
    if let Some(json) = as_json(value) {
        return (json, false);
    }
    let text = serde_json::to_string(&STANDARD.encode(value)).expect("a string encodes");
    (
        RawValue::from_string(text).expect("a JSON string is JSON"),
        true,
    )
}

/// `value` as JSON content, if it is UTF-8 JSON that consumers can parse, exactly as it came
/// (surrounding whitespace aside).
fn as_json(value: &[u8]) -> Option<Box<RawValue>> {
    let text = std::str::from_utf8(value).ok()?;
    let trimmed = text.trim_matches([' ', '\t', '\n', '\r']);
    // Only text that starts like JSON is parsed: most binary values fail here at once.
    match trimmed.as_bytes().first()? {
        b'{' | b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {}
        _ => return None,
    }
    let raw: Box<RawValue> = serde_json::from_str(trimmed).ok()?;
    let shape = content_shape(raw.get());
    if shape.depth > MAX_CONTENT_DEPTH
        || (shape.suspect && serde_json::from_str::<serde_json::Value>(raw.get()).is_err())
    {
        return None;
    }
    Some(raw)
}

/// The bytes of a value shown as `content` with `content_base64` (see [`content_of_value`]):
/// `None` for a tombstone. `None` also when the content is not a base64 string, which a
/// well-formed message never has.
pub fn value_of_content(content: &RawValue, content_base64: bool) -> Option<Vec<u8>> {
    if !content_base64 {
        return Some(content.get().as_bytes().to_vec());
    }
    let text: String = serde_json::from_str(content.get()).ok()?;
    STANDARD.decode(text).ok()
}

/// A key as a message shows it: UTF-8 as `key`, else base64 as `keyBase64`.
pub fn key_of_bytes(key: Option<&[u8]>) -> (Option<String>, Option<String>) {
    match key {
        None => (None, None),
        Some(k) => match std::str::from_utf8(k) {
            Ok(s) => (Some(s.to_owned()), None),
            Err(_) => (None, Some(STANDARD.encode(k))),
        },
    }
}

/// Headers as a message shows them.
pub fn headers_of(headers: &[(&str, Option<&[u8]>)]) -> Vec<Header> {
    headers
        .iter()
        .map(|(k, v)| Header {
            key: (*k).to_owned(),
            value_base64: v.map(|v| STANDARD.encode(v)),
        })
        .collect()
}

/// Decodes base64 as the envelope fields carry it.
pub fn decode_base64(text: &str) -> Option<Vec<u8>> {
    STANDARD.decode(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_payload_reads_back_exactly() {
        let bin = [0u8, 255, 1, b'{'];
        for record in [
            RecordRef {
                timestamp: 1_700_000_000_000,
                create_time: Some(-5),
                key: Some(b"k"),
                value: Some(&bin),
                headers: vec![("h", Some(b"v")), ("h", None), ("", Some(b""))],
                producer: Some((7, 1, 41)),
            },
            RecordRef {
                timestamp: 0,
                create_time: None,
                key: None,
                value: None,
                headers: vec![],
                producer: None,
            },
        ] {
            let mut out = Vec::new();
            write_record_payload(&mut out, &record);
            assert!(out.len() <= record_payload_len(record.key, record.value, &record.headers));
            assert!(is_record_payload(&out));
            assert_eq!(payload_timestamp(&out), Some(record.timestamp));
            assert_eq!(read_record_payload(&out).unwrap(), record);
            // Cut anywhere, it is refused, never misread.
            for cut in 0..out.len() {
                assert!(read_record_payload(&out[..cut]).is_err(), "cut at {cut}");
            }
        }
    }

    #[test]
    fn a_json_value_is_content_and_anything_else_is_base64() {
        let (c, b) = content_of_value(Some(br#"{"a": 1}"#));
        assert_eq!((c.get(), b), (r#"{"a": 1}"#, false));
        let (c, b) = content_of_value(Some(b"hello"));
        assert_eq!((c.get(), b), ("\"aGVsbG8=\"", true));
        assert_eq!(value_of_content(&c, b).unwrap(), b"hello");
        let (c, b) = content_of_value(None);
        assert_eq!((c.get(), b), ("null", true));
        assert_eq!(value_of_content(&c, b), None);
        // JSON consumers could not parse is not content.
        let (_, b) = content_of_value(Some(b"[1e999]"));
        assert!(b);
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(content_of_value(Some(deep.as_bytes())).1);
        assert!(content_of_value(Some(b"{\"a\":")).1);
    }

    #[test]
    fn a_key_that_is_not_utf8_is_base64() {
        assert_eq!(key_of_bytes(Some(b"k1")), (Some("k1".into()), None));
        assert_eq!(key_of_bytes(Some(&[0xff])), (None, Some("/w==".into())));
        assert_eq!(key_of_bytes(None), (None, None));
    }
}
