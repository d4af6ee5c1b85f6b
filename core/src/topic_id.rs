//! The id of one incarnation of a topic (docs/topics-and-groups.md, "Topics": topic ids), as Kafka has topic ids.
//!
//! A topic deleted and produced to again starts anew at offset 0, so (topic, partition, offset)
//! names different messages before and after the delete. Whatever keeps state about a topic's
//! messages across time (a group's committed offsets, a plugin's emit origins, a consumer's
//! exactly-once record) keeps the topic id beside it and drops what belongs to another
//! incarnation.

use std::fmt;
use std::str::FromStr;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// 16 random bytes, written as Kafka writes its topic ids: URL-safe base64 without padding
/// (22 characters).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicId([u8; 16]);

/// A string that is not a topic id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a topic id (22 characters of URL-safe base64)")]
pub struct BadTopicId(String);

impl TopicId {
    /// The id of these bytes.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// Its bytes.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Display for TopicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // On the stack: every envelope carries one, so no allocation per message.
        let mut text = [0u8; 22];
        let n = URL_SAFE_NO_PAD
            .encode_slice(self.0, &mut text)
            .expect("16 bytes are 22 characters");
        f.write_str(std::str::from_utf8(&text[..n]).expect("base64 is ASCII"))
    }
}

impl fmt::Debug for TopicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TopicId({self})")
    }
}

impl FromStr for TopicId {
    type Err = BadTopicId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bytes = URL_SAFE_NO_PAD
            .decode(s.trim())
            .map_err(|_| BadTopicId(s.to_owned()))?;
        let bytes: [u8; 16] = bytes.try_into().map_err(|_| BadTopicId(s.to_owned()))?;
        Ok(Self(bytes))
    }
}

impl Serialize for TopicId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TopicId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for TopicId {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::schema::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .min_length(Some(22))
            .max_length(Some(22))
            .description(Some(
                "The id of this incarnation of the topic (Kafka's topic id form: 16 bytes in URL-safe base64)",
            ))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for TopicId {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_as_kafka_writes_topic_ids_and_read_back() {
        let id = TopicId::from_bytes([0xfb; 16]);
        let s = id.to_string();
        assert_eq!(s, "-_v7-_v7-_v7-_v7-_v7-w");
        assert_eq!(s.parse::<TopicId>().unwrap(), id);
        assert_eq!(
            serde_json::to_string(&id).unwrap(),
            "\"-_v7-_v7-_v7-_v7-_v7-w\""
        );
        assert!("short".parse::<TopicId>().is_err());
        assert!("-_v7-_v7-_v7-_v7-_v7-w==".parse::<TopicId>().is_err());
    }
}
