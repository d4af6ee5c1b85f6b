//! A topic's configuration (docs/topics-and-groups.md, "Topics"): the body of `PUT /mmmq/topics/{topic}`, validated
//! field by field so that a bad value is answered with a `400` that names the field, and
//! `topics/{topic}/topic.json`, where it is kept (absent: the broker's defaults).

use std::path::Path;

use mmmq_core::TopicConfig;
use serde_json::{Map, Value};

use crate::storage::StorageError;
use crate::storage::vfs::{Vfs, read_whole, replace_durably};

/// The file a topic's configuration is kept in, inside its directory.
pub const TOPIC_FILE: &str = "topic.json";

pub use mmmq_core::MAX_PARTITIONS;
/// Longest produce-id memory a topic may ask for (the window is held in memory).
pub const MAX_DEDUP_WINDOW_MS: u64 = 24 * 60 * 60 * 1000;

const FIELDS: &str =
    "partitions, retentionMs, retentionBytes, keepUndelivered, dedupWindowMs, replicationFactor";

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// Not a JSON object.
    #[error("the body must be a JSON object with any of: {FIELDS} ({0})")]
    NotAnObject(String),
    /// A field this version does not know.
    #[error("unknown field {0:?}; known fields: {FIELDS}")]
    UnknownField(String),
    /// A field with a bad value.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field, as the API spells it.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// The fields a `PUT` names; the others keep their values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicUpdate {
    partitions: Option<u32>,
    retention_ms: Option<Option<u64>>,
    retention_bytes: Option<Option<u64>>,
    keep_undelivered: Option<bool>,
    dedup_window_ms: Option<u64>,
    replication_factor: Option<u8>,
}

fn invalid(field: &'static str, reason: impl Into<String>) -> SettingsError {
    SettingsError::Invalid {
        field,
        reason: reason.into(),
    }
}

fn positive(field: &'static str, v: &Value) -> Result<u64, SettingsError> {
    match v.as_u64() {
        Some(n) if n > 0 => Ok(n),
        _ => Err(invalid(
            field,
            format!("must be a positive integer, got {v}"),
        )),
    }
}

fn positive_or_null(field: &'static str, v: &Value) -> Result<Option<u64>, SettingsError> {
    if v.is_null() {
        return Ok(None);
    }
    positive(field, v).map(Some).map_err(|_| {
        invalid(
            field,
            format!("must be a positive integer or null, got {v}"),
        )
    })
}

impl TopicUpdate {
    /// Parses and checks the body of a `PUT` (an empty body changes nothing).
    pub fn parse(body: &[u8]) -> Result<Self, SettingsError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::default());
        }
        let map: Map<String, Value> =
            serde_json::from_slice(body).map_err(|e| SettingsError::NotAnObject(e.to_string()))?;
        let mut update = Self::default();
        for (key, v) in &map {
            match key.as_str() {
                "partitions" => {
                    let n = positive("partitions", v)?;
                    if n > u64::from(MAX_PARTITIONS) {
                        return Err(invalid(
                            "partitions",
                            format!("at most {MAX_PARTITIONS}, got {n}"),
                        ));
                    }
                    update.partitions = Some(n as u32);
                }
                "retentionMs" => update.retention_ms = Some(positive_or_null("retentionMs", v)?),
                "retentionBytes" => {
                    update.retention_bytes = Some(positive_or_null("retentionBytes", v)?)
                }
                "keepUndelivered" => {
                    update.keep_undelivered = Some(v.as_bool().ok_or_else(|| {
                        invalid("keepUndelivered", format!("must be true or false, got {v}"))
                    })?)
                }
                "dedupWindowMs" => {
                    let n = v.as_u64().ok_or_else(|| {
                        invalid(
                            "dedupWindowMs",
                            format!("must be an integer of milliseconds, got {v}"),
                        )
                    })?;
                    if n > MAX_DEDUP_WINDOW_MS {
                        return Err(invalid(
                            "dedupWindowMs",
                            format!("at most {MAX_DEDUP_WINDOW_MS} (a day), got {n}"),
                        ));
                    }
                    update.dedup_window_ms = Some(n);
                }
                "replicationFactor" => {
                    let n = v.as_u64().filter(|n| (1..=5).contains(n)).ok_or_else(|| {
                        invalid("replicationFactor", format!("must be 1–5, got {v}"))
                    })?;
                    update.replication_factor = Some(n as u8);
                }
                other => return Err(SettingsError::UnknownField(other.to_owned())),
            }
        }
        Ok(update)
    }

    /// The replicas per partition it asks for (contract §13), if any.
    pub fn replication_factor(&self) -> Option<u8> {
        self.replication_factor
    }

    /// The configuration of a new topic: `defaults` with this update's fields, its partitions
    /// any number (fewer than the default too: there is nothing to shrink).
    pub fn create(&self, defaults: &TopicConfig) -> Result<TopicConfig, SettingsError> {
        let mut base = defaults.clone();
        if let Some(p) = self.partitions {
            base.partitions = p;
        }
        self.apply(&base)
    }

    /// The configuration after this update of `current`.
    pub fn apply(&self, current: &TopicConfig) -> Result<TopicConfig, SettingsError> {
        let mut next = current.clone();
        if let Some(p) = self.partitions {
            if p < current.partitions {
                return Err(invalid(
                    "partitions",
                    format!(
                        "a topic's partitions may grow but never shrink ({} now, {p} asked)",
                        current.partitions
                    ),
                ));
            }
            next.partitions = p;
        }
        if let Some(v) = self.retention_ms {
            next.retention_ms = v;
        }
        if let Some(v) = self.retention_bytes {
            next.retention_bytes = v;
        }
        if let Some(v) = self.keep_undelivered {
            next.keep_undelivered = v;
        }
        if let Some(v) = self.dedup_window_ms {
            next.dedup_window_ms = v;
        }
        Ok(next)
    }
}

/// Reads `topic.json` in a topic's directory: `None` when there is none (the defaults apply).
/// Blocking.
pub fn load(vfs: &dyn Vfs, topic_dir: &Path) -> Result<Option<TopicConfig>, StorageError> {
    let path = topic_dir.join(TOPIC_FILE);
    let Some(raw) = read_whole(vfs, &path)? else {
        return Ok(None);
    };
    serde_json::from_slice(&raw)
        .map(Some)
        .map_err(|e| StorageError::Inconsistent {
            path,
            reason: format!("not a topic configuration: {e}"),
        })
}

/// Durably replaces `topic.json`. Blocking.
pub fn store(vfs: &dyn Vfs, topic_dir: &Path, config: &TopicConfig) -> Result<(), StorageError> {
    let json = serde_json::to_vec_pretty(config).expect("a config serializes");
    replace_durably(vfs, &topic_dir.join(TOPIC_FILE), &json)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> String {
        TopicUpdate::parse(body.as_bytes())
            .and_then(|u| u.apply(&TopicConfig::default()))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn fields_are_changed_only_when_named_and_null_means_forever() {
        let u = TopicUpdate::parse(br#"{"retentionMs": null, "retentionBytes": 1000}"#).unwrap();
        let c = u.apply(&TopicConfig::default()).unwrap();
        assert_eq!(c.retention_ms, None);
        assert_eq!(c.retention_bytes, Some(1000));
        assert_eq!(c.dedup_window_ms, 120_000);
        let c = TopicUpdate::parse(b"{}").unwrap().apply(&c).unwrap();
        assert_eq!((c.retention_ms, c.retention_bytes), (None, Some(1000)));
        let c = TopicUpdate::parse(br#"{"keepUndelivered": true, "partitions": 1}"#)
            .unwrap()
            .apply(&c)
            .unwrap();
        assert!(c.keep_undelivered);
    }

    #[test]
    fn every_bad_value_names_its_field() {
        for (body, field) in [
            (r#"{"partitions": 0}"#, "partitions:"),
            (r#"{"partitions": 1025}"#, "partitions:"),
            (r#"{"partitions": "1"}"#, "partitions:"),
            (r#"{"retentionMs": -1}"#, "retentionMs:"),
            (r#"{"retentionMs": 0}"#, "retentionMs:"),
            (r#"{"retentionBytes": 1.5}"#, "retentionBytes:"),
            (r#"{"keepUndelivered": "yes"}"#, "keepUndelivered:"),
            (r#"{"dedupWindowMs": 86400001}"#, "dedupWindowMs:"),
            (r#"{"retention": 5}"#, "unknown field \"retention\""),
            ("[1]", "JSON object"),
            ("{", "JSON object"),
        ] {
            let e = err(body);
            assert!(e.contains(field), "{body}: {e}");
        }
    }

    #[test]
    fn partitions_never_shrink() {
        let two = TopicConfig {
            partitions: 2,
            ..TopicConfig::default()
        };
        let e = TopicUpdate::parse(br#"{"partitions": 1}"#)
            .unwrap()
            .apply(&two)
            .unwrap_err();
        assert!(e.to_string().contains("never shrink"), "{e}");
    }
}
