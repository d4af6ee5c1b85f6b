//! What is stored for a message and what a consumer receives.
//!
//! Content is carried as raw JSON text ([`RawValue`]) from the producer's request to the log and
//! out to consumers: the broker never reinterprets it, so numbers, key order and spacing inside
//! the content arrive exactly as produced, and no time is spent building a JSON tree per message.

use serde::{Deserialize, Serialize};

use serde_json::value::RawValue;

use crate::record::BinaryParts;
use crate::topic::Topic;
use crate::topic_id::TopicId;

/// Content nested deeper than this is refused: consumers parsing it into a tree would fail on it
/// forever, and the raw pass-through never checks depth itself. serde_json parses at most 127
/// levels, and the deepest wrapper the broker puts content in takes five: a pull page
/// (`{"messages":[envelope]}`) of a dead letter (`{"envelope":{"content":…}}`) inside its own
/// envelope. Found by fuzzing (126 in an envelope) and by a test of every wrapper (122).
pub const MAX_CONTENT_DEPTH: usize = 122;

/// What the broker checks in a message's content before storing it, from one pass over the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentShape {
    /// How deeply arrays and objects nest.
    pub depth: usize,
    /// Whether the text may hold something JSON parsers refuse although the syntax is valid (found
    /// by fuzzing): a number no 64-bit float holds (`1e999`), or a `\u` escape, which may be a lone
    /// UTF-16 surrogate. Rare; when set, the caller parses the content fully to be sure.
    pub suspect: bool,
}

/// Measures `json`, which must be valid JSON. One pass, no allocation; string bodies are skipped
/// with `memchr`, so a message that is mostly a long string costs little.
pub fn content_shape(json: &str) -> ContentShape {
    let b = json.as_bytes();
    let (mut i, mut depth, mut max, mut suspect) = (0usize, 0usize, 0usize, false);
    while i < b.len() {
        match b[i] {
            b'"' => {
                i += 1;
                while let Some(k) = memchr::memchr2(b'"', b'\\', &b[i..]) {
                    i += k;
                    if b[i] == b'"' {
                        break;
                    }
                    suspect |= b.get(i + 1) == Some(&b'u');
                    i += 2;
                }
                i += 1;
            }
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
                i += 1;
            }
            b']' | b'}' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < b.len() && matches!(b[i], b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-')
                {
                    i += 1;
                }
                let token = &json[start..i];
                // Only an exponent or a very long mantissa can overflow.
                let risky = token.len() > 300 || token.bytes().any(|c| c == b'e' || c == b'E');
                suspect |= risky && !token.parse::<f64>().is_ok_and(f64::is_finite);
            }
            _ => i += 1,
        }
    }
    ContentShape {
        depth: max,
        suspect,
    }
}

/// Milliseconds since the Unix epoch: the clock of message timestamps, dead letters and
/// deploys (0 on a clock before 1970).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The payload of one log entry: the UTF-8 JSON of this struct (docs/storage.md, "Storage"), or a
/// record payload that a Kafka produce stored (docs/kafka.md; [`crate::record`]), read into the
/// same shape.
///
/// The topic and the offset are not stored: the directory and the position in the log say them.
#[derive(Debug, Clone)]
pub struct StoredMessage {
    /// Milliseconds since the Unix epoch, set by the broker at append (or a Kafka producer's
    /// create time).
    pub timestamp: u64,
    /// The producer's optional key (kept for partitioning later).
    pub key: Option<String>,
    /// The producer's content, verbatim.
    pub content: Box<RawValue>,
    /// The producer's idempotency id, when it gave one (absent from payloads without one, so
    /// older payloads read the same).
    pub id: Option<String>,
    /// Where a plugin's emitted message came from (docs/plugins.md, "WebAssembly handlers"); absent from
    /// produced messages.
    pub origin: Option<Origin>,
    /// What it carries beyond JSON (a Kafka record's bytes); empty for HTTP's messages.
    pub binary: BinaryParts,
}

/// The origin of a message a plugin emitted: which dispatcher's call on which message, and which
/// of that call's emits it was. Stored with the message, it is what makes emits exactly once: a
/// re-run of the same message after a crash finds its outputs by their origin and appends none of
/// them again, however long ago they were stored.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Origin {
    /// The dispatcher whose plugin emitted it.
    pub consumer_id: String,
    /// The topic of the message being handled.
    pub topic: String,
    /// Its partition.
    pub partition: u32,
    /// Its offset.
    pub offset: u64,
    /// Which of the call's emits, from 0.
    pub index: u32,
    /// The id of the source topic's incarnation (docs/topics-and-groups.md, "Topics"): a topic deleted and created
    /// again reuses (topic, partition, offset) for other messages. Absent from emits stored
    /// before topic ids, whose source is the incarnation with its name's legacy id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_id: Option<TopicId>,
}

/// A produced message's payload written from borrowed parts, without copying the content into a
/// [`StoredMessage`] first: the same bytes as [`StoredMessage::to_payload`] of a message with no
/// origin (the fields in the same order, `key` as `null` when absent, `id` left out).
#[derive(Serialize)]
struct ProducedPayload<'a> {
    timestamp: u64,
    key: Option<&'a str>,
    content: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
}

/// Appends the payload of a produced message to `out` (the produce path writes it straight into
/// the frame it stores).
pub fn write_produced_payload(
    out: &mut Vec<u8>,
    timestamp: u64,
    key: Option<&str>,
    content: &RawValue,
    id: Option<&str>,
) {
    serde_json::to_writer(
        out,
        &ProducedPayload {
            timestamp,
            key,
            content,
            id,
        },
    )
    .expect("a number, strings and raw JSON always encode");
}

impl StoredMessage {
    /// Encodes the payload as stored on disk (JSON).
    pub fn to_payload(&self) -> Vec<u8> {
        serde_json::to_vec(self)
            .expect("a struct of a number, a string and raw JSON always encodes")
    }

    /// Decodes a payload read from disk: JSON, or a record payload.
    pub fn from_payload(bytes: &[u8]) -> Result<Self, PayloadError> {
        if !crate::record::is_record_payload(bytes) {
            return Ok(serde_json::from_slice(bytes)?);
        }
        let r = crate::record::read_record_payload(bytes)?;
        let (content, content_base64) = crate::record::content_of_value(r.value);
        let (key, key_base64) = crate::record::key_of_bytes(r.key);
        Ok(StoredMessage {
            timestamp: r.timestamp,
            key,
            content,
            id: None,
            origin: None,
            binary: BinaryParts {
                content_base64,
                key_base64,
                headers: crate::record::headers_of(&r.headers),
            },
        })
    }

    /// A message with JSON content only, as HTTP produces.
    pub fn json(timestamp: u64, key: Option<String>, content: Box<RawValue>) -> Self {
        StoredMessage {
            timestamp,
            key,
            content,
            id: None,
            origin: None,
            binary: BinaryParts::default(),
        }
    }

    /// The envelope consumers see for this message at `offset` of `partition` of the
    /// incarnation `topic_id` of `topic`.
    pub fn into_envelope(
        self,
        topic: Topic,
        topic_id: TopicId,
        partition: u32,
        offset: u64,
    ) -> Envelope {
        Envelope {
            topic,
            partition,
            offset,
            timestamp: self.timestamp,
            key: self.key,
            content: self.content,
            id: self.id,
            origin: self.origin,
            topic_id: Some(topic_id),
            binary: self.binary,
        }
    }
}

/// A stored message as pull answers and consumers receive it:
/// `{"topic":…,"partition":…,"offset":…,"timestamp":…,"key":…,"content":…}`; for a Kafka record,
/// `keyBase64`, `headers` and `contentBase64` as [`BinaryParts`] says.
#[derive(Debug, Clone)]
pub struct Envelope {
    /// The topic the message was produced to.
    pub topic: Topic,
    /// The partition it was stored in (0 for a topic of one partition, and from a broker that
    /// predates partitions).
    pub partition: u32,
    /// Its position in its partition's log, from 0 with no gaps.
    pub offset: u64,
    /// Milliseconds since the Unix epoch, set by the broker at append.
    pub timestamp: u64,
    /// The producer's optional key; `null` when none was given.
    pub key: Option<String>,
    /// The producer's idempotency id, when it gave one.
    pub id: Option<String>,
    /// Where a plugin's emitted message came from; absent from produced messages.
    pub origin: Option<Origin>,
    /// The id of the topic's incarnation (docs/topics-and-groups.md, "Topics"): (topic, partition, offset) names one
    /// message only together with it, since a topic deleted and created again starts at offset 0.
    /// Absent from a broker that predates topic ids.
    pub topic_id: Option<TopicId>,
    /// The producer's content, verbatim (last, so that its bytes end the envelope).
    pub content: Box<RawValue>,
    /// What it carries beyond JSON (a Kafka record's bytes).
    pub binary: BinaryParts,
}

/// Why a stored payload could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PayloadError {
    /// A JSON payload that is not a message.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A record payload that is cut or malformed.
    #[error(transparent)]
    Record(#[from] crate::record::MalformedRecord),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_produced_payload_is_the_stored_message_byte_for_byte() {
        for (key, id) in [
            (None, None),
            (Some("k\"1"), None),
            (None, Some("id-\u{e9}")),
            (Some("k"), Some("i")),
        ] {
            let content = RawValue::from_string(r#"{"a": [1, "x"]}"#.into()).unwrap();
            let owned = StoredMessage {
                timestamp: 1_700_000_000_123,
                key: key.map(str::to_owned),
                content: content.clone(),
                id: id.map(str::to_owned),
                origin: None,
                binary: Default::default(),
            }
            .to_payload();
            let mut out = b"head".to_vec();
            write_produced_payload(&mut out, 1_700_000_000_123, key, &content, id);
            assert_eq!(&out[4..], &owned[..], "key {key:?} id {id:?}");
        }
    }

    fn depth_of(json: &str) -> usize {
        content_shape(json).depth
    }

    #[test]
    fn numbers_beyond_a_float_and_unicode_escapes_are_suspect_and_nothing_else() {
        let suspect = |s: &str| content_shape(s).suspect;
        assert!(suspect(r#"{"a":1e999}"#));
        assert!(suspect(r#"[-1E+400]"#));
        assert!(suspect(&format!("[{}]", "9".repeat(400))));
        assert!(suspect(r#""\ud800""#));
        for fine in [
            r#"{"a":1.50,"b":18446744073709551616,"c":-2.5e-300,"d":1e308}"#,
            r#""1e999""#,
            r#"{"1e999":0}"#,
            r#""a \" \\ \n b""#,
        ] {
            assert!(!suspect(fine), "{fine}");
        }
    }

    #[test]
    fn nesting_depth_ignores_brackets_in_strings() {
        assert_eq!(depth_of("1"), 0);
        assert_eq!(depth_of(r#"{"a":[1,{"b":[]}]}"#), 4);
        assert_eq!(depth_of(r#"["[[[[", "\"{{{"]"#), 1);
        assert_eq!(
            depth_of(&format!("{}{}", "[".repeat(300), "]".repeat(300))),
            300
        );
    }

    #[test]
    fn content_survives_byte_for_byte() {
        let content = r#"{"b":1.50,"a":[1e3, 18446744073709551616],"c":"é"}"#;
        let msg = StoredMessage {
            timestamp: 1_764_400_000_000,
            key: None,
            content: RawValue::from_string(content.to_owned()).unwrap(),
            id: None,
            origin: None,
            binary: Default::default(),
        };
        let back = StoredMessage::from_payload(&msg.to_payload()).unwrap();
        assert_eq!(back.content.get(), content);
        let id = TopicId::from_bytes([7; 16]);
        let env = back.into_envelope(Topic::new("order.created").unwrap(), id, 0, 17);
        let json = serde_json::to_string(&env).unwrap();
        assert_eq!(
            json,
            format!(
                r#"{{"topic":"order.created","partition":0,"offset":17,"timestamp":1764400000000,"key":null,"topicId":"{id}","content":{content}}}"#
            )
        );
    }
}
