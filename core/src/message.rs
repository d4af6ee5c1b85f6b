//! What is stored for a message and what a consumer receives.
//!
//! Content is carried as raw JSON text ([`RawValue`]) from the producer's request to the log and
//! out to consumers: the broker never reinterprets it, so numbers, key order and spacing inside
//! the content arrive exactly as produced, and no time is spent building a JSON tree per message.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::topic::Topic;

/// Content nested deeper than this is refused: consumers parsing it into a tree would fail on it
/// forever, and the raw pass-through never checks depth itself. serde_json parses at most 127
/// levels, and the envelope a consumer receives wraps the content in one more (found by fuzzing:
/// the limit used to be 128).
pub const MAX_CONTENT_DEPTH: usize = 126;

/// The bytes of `json` outside its string literals, with their positions: structure and numbers.
fn outside_strings(json: &str) -> impl Iterator<Item = (usize, u8)> + '_ {
    let (mut in_string, mut escaped) = (false, false);
    json.bytes().enumerate().filter(move |&(_, b)| {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            false
        } else if b == b'"' {
            in_string = true;
            false
        } else {
            true
        }
    })
}

/// How deeply arrays and objects nest in `json`, which must be valid JSON. One pass over the bytes,
/// no allocation: the broker never builds a tree of a message's content.
pub fn nesting_depth(json: &str) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    for (_, b) in outside_strings(json) {
        match b {
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// The first number in `json` (valid JSON) that no 64-bit float can hold, like `1e999`: valid
/// syntax, but JSON parsers either refuse it (serde_json: "number out of range") or turn it into
/// infinity, so consumers would choke on the message. One pass, no allocation.
pub fn number_out_of_range(json: &str) -> Option<&str> {
    let is_number_byte = |b: u8| matches!(b, b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-');
    let mut bytes = outside_strings(json).peekable();
    while let Some((start, b)) = bytes.next() {
        if b != b'-' && !b.is_ascii_digit() {
            continue;
        }
        let mut end = start + 1;
        while let Some(&(i, c)) = bytes.peek() {
            if i != end || !is_number_byte(c) {
                break;
            }
            end += 1;
            bytes.next();
        }
        let token = &json[start..end];
        // Only an exponent or a very long mantissa can overflow; everything else is cheap.
        let risky = token.len() > 300 || token.bytes().any(|c| c == b'e' || c == b'E');
        if risky && !token.parse::<f64>().is_ok_and(f64::is_finite) {
            return Some(token);
        }
    }
    None
}

/// The payload of one log entry: the UTF-8 JSON of this struct (contract §6).
///
/// The topic and the offset are not stored: the directory and the position in the log say them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredMessage {
    /// Milliseconds since the Unix epoch, set by the broker at append.
    pub timestamp: u64,
    /// The producer's optional key (kept for partitioning later).
    #[serde(default)]
    pub key: Option<String>,
    /// The producer's content, verbatim.
    pub content: Box<RawValue>,
}

impl StoredMessage {
    /// Encodes the payload as stored on disk.
    pub fn to_payload(&self) -> Vec<u8> {
        serde_json::to_vec(self)
            .expect("a struct of a number, a string and raw JSON always encodes")
    }

    /// Decodes a payload read from disk.
    pub fn from_payload(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// The envelope consumers see for this message at `offset` of `topic`.
    pub fn into_envelope(self, topic: Topic, offset: u64) -> Envelope {
        Envelope {
            topic,
            offset,
            timestamp: self.timestamp,
            key: self.key,
            content: self.content,
        }
    }
}

/// A stored message as pull answers and consumers receive it:
/// `{"topic":…,"offset":…,"timestamp":…,"key":…,"content":…}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope {
    /// The topic the message was produced to.
    pub topic: Topic,
    /// Its position in the topic's log, from 0 with no gaps.
    pub offset: u64,
    /// Milliseconds since the Unix epoch, set by the broker at append.
    pub timestamp: u64,
    /// The producer's optional key; `null` when none was given.
    pub key: Option<String>,
    /// The producer's content, verbatim.
    pub content: Box<RawValue>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_beyond_a_float_are_found_and_others_left_alone() {
        assert_eq!(number_out_of_range(r#"{"a":1e999}"#), Some("1e999"));
        assert_eq!(number_out_of_range(r#"[-1E+400]"#), Some("-1E+400"));
        let huge = format!("[{}]", "9".repeat(400));
        assert!(number_out_of_range(&huge).is_some());
        for fine in [
            r#"{"a":1.50,"b":18446744073709551616,"c":-2.5e-300,"d":1e308}"#,
            r#""1e999""#,
            r#"{"1e999":0}"#,
        ] {
            assert_eq!(number_out_of_range(fine), None, "{fine}");
        }
    }

    #[test]
    fn nesting_depth_ignores_brackets_in_strings() {
        assert_eq!(nesting_depth("1"), 0);
        assert_eq!(nesting_depth(r#"{"a":[1,{"b":[]}]}"#), 4);
        assert_eq!(nesting_depth(r#"["[[[[", "\"{{{"]"#), 1);
        assert_eq!(
            nesting_depth(&format!("{}{}", "[".repeat(300), "]".repeat(300))),
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
        };
        let back = StoredMessage::from_payload(&msg.to_payload()).unwrap();
        assert_eq!(back.content.get(), content);
        let env = back.into_envelope(Topic::new("order.created").unwrap(), 17);
        let json = serde_json::to_string(&env).unwrap();
        assert_eq!(
            json,
            format!(
                r#"{{"topic":"order.created","offset":17,"timestamp":1764400000000,"key":null,"content":{content}}}"#
            )
        );
    }
}
