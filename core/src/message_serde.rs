//! The JSON of [`StoredMessage`] and [`Envelope`]: a message's content is `content`, or
//! `contentBase64` when its value is not JSON, and `keyBase64` and `headers` appear only when a
//! Kafka record has them (docs/kafka.md, "Bytes in, the same bytes out"), so a message produced over HTTP
//! reads exactly as it did before Kafka.
//!
//! Both serialize through a borrowed mirror (no copy of the content) and deserialize through an
//! owned one.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

use crate::message::{Envelope, Origin, StoredMessage};
use crate::record::{BinaryParts, Header};
use crate::topic::Topic;
use crate::topic_id::TopicId;

/// Content, as `content` or as `contentBase64`.
fn split(content: &RawValue, base64: bool) -> (Option<&RawValue>, Option<&RawValue>) {
    if base64 {
        (None, Some(content))
    } else {
        (Some(content), None)
    }
}

/// Always `Some`, also for JSON `null` (which `Option`'s own deserialization would take as absent).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

/// `content`/`contentBase64` read back: exactly one of them.
fn joined<E: serde::de::Error>(
    content: Option<Box<RawValue>>,
    content_base64: Option<Box<RawValue>>,
) -> Result<(Box<RawValue>, bool), E> {
    match (content, content_base64) {
        (Some(c), None) => Ok((c, false)),
        (None, Some(c)) => Ok((c, true)),
        (None, None) => Err(E::missing_field("content")),
        (Some(_), Some(_)) => Err(E::custom("both content and contentBase64")),
    }
}

#[derive(Serialize)]
struct StoredOut<'a> {
    timestamp: u64,
    key: Option<&'a str>,
    #[serde(rename = "keyBase64", skip_serializing_if = "Option::is_none")]
    key_base64: Option<&'a str>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    headers: &'a [Header],
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a RawValue>,
    #[serde(rename = "contentBase64", skip_serializing_if = "Option::is_none")]
    content_base64: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    origin: Option<&'a Origin>,
}

impl Serialize for StoredMessage {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (content, content_base64) = split(&self.content, self.binary.content_base64);
        StoredOut {
            timestamp: self.timestamp,
            key: self.key.as_deref(),
            key_base64: self.binary.key_base64.as_deref(),
            headers: &self.binary.headers,
            content,
            content_base64,
            id: self.id.as_deref(),
            origin: self.origin.as_ref(),
        }
        .serialize(s)
    }
}

#[derive(Deserialize)]
struct StoredIn {
    timestamp: u64,
    #[serde(default)]
    key: Option<String>,
    #[serde(rename = "keyBase64", default)]
    key_base64: Option<String>,
    #[serde(default)]
    headers: Vec<Header>,
    #[serde(default, deserialize_with = "present")]
    content: Option<Box<RawValue>>,
    #[serde(rename = "contentBase64", default, deserialize_with = "present")]
    content_base64: Option<Box<RawValue>>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    origin: Option<Origin>,
}

impl<'de> Deserialize<'de> for StoredMessage {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let m = StoredIn::deserialize(d)?;
        let (content, base64) = joined(m.content, m.content_base64)?;
        Ok(StoredMessage {
            timestamp: m.timestamp,
            key: m.key,
            content,
            id: m.id,
            origin: m.origin,
            binary: BinaryParts {
                content_base64: base64,
                key_base64: m.key_base64,
                headers: m.headers,
            },
        })
    }
}

#[derive(Serialize)]
struct EnvelopeOut<'a> {
    topic: &'a Topic,
    partition: u32,
    offset: u64,
    timestamp: u64,
    key: Option<&'a str>,
    #[serde(rename = "keyBase64", skip_serializing_if = "Option::is_none")]
    key_base64: Option<&'a str>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    headers: &'a [Header],
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    origin: Option<&'a Origin>,
    #[serde(rename = "topicId", skip_serializing_if = "Option::is_none")]
    topic_id: Option<&'a TopicId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a RawValue>,
    #[serde(rename = "contentBase64", skip_serializing_if = "Option::is_none")]
    content_base64: Option<&'a RawValue>,
}

impl Serialize for Envelope {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (content, content_base64) = split(&self.content, self.binary.content_base64);
        EnvelopeOut {
            topic: &self.topic,
            partition: self.partition,
            offset: self.offset,
            timestamp: self.timestamp,
            key: self.key.as_deref(),
            key_base64: self.binary.key_base64.as_deref(),
            headers: &self.binary.headers,
            id: self.id.as_deref(),
            origin: self.origin.as_ref(),
            topic_id: self.topic_id.as_ref(),
            content,
            content_base64,
        }
        .serialize(s)
    }
}

/// An envelope as JSON shows it (its OpenAPI schema, and how it is read back).
#[derive(Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = Envelope))]
pub struct EnvelopeSchema {
    /// The topic the message was produced to.
    topic: Topic,
    /// The partition it was stored in (0 for a topic of one partition, and from a broker that
    /// predates partitions).
    #[serde(default)]
    partition: u32,
    /// Its position in its partition's log, from 0 with no gaps.
    offset: u64,
    /// Milliseconds since the Unix epoch: set by the broker at append, or a Kafka producer's
    /// create time.
    timestamp: u64,
    /// The producer's key when it is UTF-8; `null` when none was given.
    #[serde(default)]
    key: Option<String>,
    /// A Kafka record's key that is not UTF-8, base64 (`key` is then `null`).
    #[serde(rename = "keyBase64", default)]
    key_base64: Option<String>,
    /// A Kafka record's headers, in order (absent when it has none).
    #[serde(default)]
    headers: Vec<Header>,
    /// The producer's idempotency id, when it gave one.
    #[serde(default)]
    id: Option<String>,
    /// Where a plugin's emitted message came from; absent from produced messages.
    #[serde(default)]
    origin: Option<Origin>,
    /// The id of the topic's incarnation: (topic, partition, offset) names one message only
    /// together with it. Absent from a broker that predates topic ids.
    #[serde(rename = "topicId", default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    topic_id: Option<TopicId>,
    /// The producer's content, verbatim, when it is JSON (else `contentBase64`).
    #[serde(default, deserialize_with = "present")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<serde_json::Value>))]
    content: Option<Box<RawValue>>,
    /// A Kafka record's value that is not JSON, base64; `null` for a record with no value.
    #[serde(rename = "contentBase64", default, deserialize_with = "present")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    content_base64: Option<Box<RawValue>>,
}

impl<'de> Deserialize<'de> for Envelope {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let m = EnvelopeSchema::deserialize(d)?;
        let (content, base64) = joined(m.content, m.content_base64)?;
        Ok(Envelope {
            topic: m.topic,
            partition: m.partition,
            offset: m.offset,
            timestamp: m.timestamp,
            key: m.key,
            id: m.id,
            origin: m.origin,
            topic_id: m.topic_id,
            content,
            binary: BinaryParts {
                content_base64: base64,
                key_base64: m.key_base64,
                headers: m.headers,
            },
        })
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for Envelope {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        <EnvelopeSchema as utoipa::PartialSchema>::schema()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for Envelope {
    fn name() -> std::borrow::Cow<'static, str> {
        "Envelope".into()
    }

    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        <EnvelopeSchema as utoipa::ToSchema>::schemas(schemas);
    }
}
