//! What is stored for a message and what a consumer receives.
//!
//! Content is carried as raw JSON text ([`RawValue`]) from the producer's request to the log and
//! out to consumers: the broker never reinterprets it, so numbers, key order and spacing inside
//! the content arrive exactly as produced, and no time is spent building a JSON tree per message.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::topic::Topic;

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
