//! What a produce may carry, checked in one place (docs/http-api.md, "HTTP API"): the HTTP endpoints, the
//! embedded API and the benchmarks all build a [`ProduceItem`] through [`ProduceItem::new`], so
//! none of them stores what another would refuse.

use mmmq_core::{MAX_CONTENT_DEPTH, NameError, Topic};
use serde_json::value::RawValue;

/// The longest produce `id` (docs/delivery.md, "Idempotent produce").
pub const MAX_ID_CHARS: usize = 128;

/// Keys are for partitioning; a key this long is a mistake.
pub const MAX_KEY_BYTES: usize = 1024;

/// Why a message cannot be produced. Always the producer's fault (`400`; `413` for content over
/// the limit).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProduceError {
    /// Not a valid topic name.
    #[error(transparent)]
    Topic(#[from] NameError),
    /// Producers may not write to `__` topics.
    #[error(
        "topic {0:?} is internal (names starting with \"__\" hold dead letters); producers cannot write to it"
    )]
    InternalTopic(String),
    /// More content than a message may hold.
    #[error("content is {len} bytes; the limit is {max}")]
    ContentTooLarge {
        /// Its length.
        len: usize,
        /// The limit (`--max-body-bytes`).
        max: usize,
    },
    /// Content nested deeper than consumers can parse.
    #[error("content nests {depth} levels deep; at most {MAX_CONTENT_DEPTH} are allowed")]
    TooDeep {
        /// How deep it nests.
        depth: usize,
    },
    /// JSON syntax that JSON parsers still refuse (found by fuzzing): numbers beyond a float
    /// (`1e999`) and lone UTF-16 surrogates (`"\ud800"`). Consumers would NACK it forever.
    #[error("content is JSON that consumers cannot parse: {0}")]
    Unparseable(String),
    /// An idempotency id that is empty or longer than [`MAX_ID_CHARS`].
    #[error("id must be 1 to {MAX_ID_CHARS} characters, not {len}")]
    BadId {
        /// Its length in characters.
        len: usize,
    },
    /// A key longer than [`MAX_KEY_BYTES`].
    #[error("key is {len} bytes; the limit is {MAX_KEY_BYTES}")]
    KeyTooLong {
        /// Its length.
        len: usize,
    },
}

/// One message to produce, checked.
#[derive(Debug, Clone)]
pub struct ProduceItem {
    topic: Topic,
    key: Option<String>,
    content: Box<RawValue>,
    partition: Option<u32>,
    id: Option<String>,
}

impl ProduceItem {
    /// Checks a message: a valid, non-internal topic, content within `max_content` bytes and
    /// [`MAX_CONTENT_DEPTH`] levels that consumers can parse, a key within [`MAX_KEY_BYTES`].
    pub fn new(
        topic: impl Into<String>,
        key: Option<String>,
        content: Box<RawValue>,
        max_content: usize,
    ) -> Result<Self, ProduceError> {
        let topic = Topic::new(topic)?;
        if topic.is_internal() {
            return Err(ProduceError::InternalTopic(topic.to_string()));
        }
        let raw = content.get();
        if raw.len() > max_content {
            return Err(ProduceError::ContentTooLarge {
                len: raw.len(),
                max: max_content,
            });
        }
        let shape = mmmq_core::content_shape(raw);
        if shape.depth > MAX_CONTENT_DEPTH {
            return Err(ProduceError::TooDeep { depth: shape.depth });
        }
        // Both are rare, so the full parse runs only when the scan saw one may be there.
        if shape.suspect
            && let Err(e) = serde_json::from_str::<serde_json::Value>(raw)
        {
            return Err(ProduceError::Unparseable(e.to_string()));
        }
        if let Some(k) = &key
            && k.len() > MAX_KEY_BYTES
        {
            return Err(ProduceError::KeyTooLong { len: k.len() });
        }
        Ok(Self {
            topic,
            key,
            content,
            partition: None,
            id: None,
        })
    }

    /// Gives it an idempotency id: a second produce of the same id to the same topic within the
    /// topic's `dedupWindowMs` appends nothing and answers the first one's position.
    pub fn with_id(mut self, id: Option<String>) -> Result<Self, ProduceError> {
        if let Some(id) = &id {
            let len = id.chars().count();
            if !(1..=MAX_ID_CHARS).contains(&len) {
                return Err(ProduceError::BadId { len });
            }
        }
        self.id = id;
        Ok(self)
    }

    /// Its idempotency id, if it has one.
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// Sends it to this partition instead of routing it by its key (a produce that names a
    /// partition the topic does not have is refused when it is produced).
    pub fn with_partition(mut self, partition: Option<u32>) -> Self {
        self.partition = partition;
        self
    }

    /// The partition the producer named, if any.
    pub fn partition(&self) -> Option<u32> {
        self.partition
    }

    /// Where it goes.
    pub fn topic(&self) -> &Topic {
        &self.topic
    }

    /// Its key.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// Its content, verbatim JSON.
    pub fn content(&self) -> &RawValue {
        &self.content
    }

    /// Its key and content, for a caller that stores it itself (a plugin's emits).
    pub fn into_parts(self) -> (Topic, Option<String>, Box<RawValue>) {
        (self.topic, self.key, self.content)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    #[test]
    fn every_rule_has_its_reason() {
        let ok = ProduceItem::new("t", Some("k".into()), json("{}"), 100).unwrap();
        assert_eq!((ok.topic().as_str(), ok.key()), ("t", Some("k")));
        let cases: Vec<(Result<ProduceItem, ProduceError>, &str)> = vec![
            (ProduceItem::new("a b", None, json("1"), 100), "topic"),
            (
                ProduceItem::new("__dlq.x", None, json("1"), 100),
                "internal",
            ),
            (
                ProduceItem::new("t", None, json("[1,2,3]"), 3),
                "limit is 3",
            ),
            (
                ProduceItem::new(
                    "t",
                    None,
                    json(&format!("{}{}", "[".repeat(123), "]".repeat(123))),
                    1000,
                ),
                "123 levels",
            ),
            (
                ProduceItem::new("t", None, json("1e999"), 100),
                "cannot parse",
            ),
            (
                ProduceItem::new("t", Some("k".repeat(1025)), json("1"), 100),
                "1025 bytes",
            ),
        ];
        for (r, want) in cases {
            let e = r.unwrap_err().to_string();
            assert!(e.contains(want), "{e} (want {want:?})");
        }
    }
}
