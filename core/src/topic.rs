//! Validated names. Both a topic and a consumer id become file or directory names on disk, so the
//! validation here is what keeps a request from writing outside `{root-dir}/topics/`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a name was refused; the message is meant for the user who typed it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The name is empty.
    #[error("{kind} must not be empty")]
    Empty {
        /// "topic name" or "consumerId".
        kind: &'static str,
    },
    /// The name is longer than allowed.
    #[error("{kind} is {len} characters long; at most {max} are allowed")]
    TooLong {
        /// "topic name" or "consumerId".
        kind: &'static str,
        /// The length that was given.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The name contains a character outside `[A-Za-z0-9._-]`.
    #[error("{kind} {name:?} contains {ch:?}; only A-Z, a-z, 0-9, '.', '_' and '-' are allowed")]
    BadChar {
        /// "topic name" or "consumerId".
        kind: &'static str,
        /// The offending name (it may contain anything, so it is printed with escapes).
        name: String,
        /// The first character that is not allowed.
        ch: char,
    },
    /// `.` and `..` would name the directory itself or its parent.
    #[error("{kind} must not be {name:?}")]
    Reserved {
        /// "topic name" or "consumerId".
        kind: &'static str,
        /// `.` or `..`.
        name: String,
    },
}

/// The longest topic name, as in Kafka: the name is a directory name and must leave room for suffixes.
pub const MAX_TOPIC_LEN: usize = 249;

/// The prefix of internal topics (dead-letter topics); producers may not write to them.
pub const INTERNAL_PREFIX: &str = "__";

fn validate(kind: &'static str, name: &str, max: usize) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty { kind });
    }
    if let Some(ch) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(NameError::BadChar {
            kind,
            name: name.to_owned(),
            ch,
        });
    }
    // All characters are ASCII now, so bytes == characters.
    if name.len() > max {
        return Err(NameError::TooLong {
            kind,
            len: name.len(),
            max,
        });
    }
    if name == "." || name == ".." {
        return Err(NameError::Reserved {
            kind,
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// A topic name: 1–249 characters of `[A-Za-z0-9._-]`, not `.` or `..`.
///
/// Holding a `Topic` is proof that the name is safe to join onto a directory path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Topic(String);

impl Topic {
    /// Validates `name` as a topic name.
    pub fn new(name: impl Into<String>) -> Result<Self, NameError> {
        let name = name.into();
        validate("topic name", &name, MAX_TOPIC_LEN)?;
        Ok(Self(name))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Internal topics (`__…`) hold dead letters; producers may not write to them and patterns
    /// only match them when the pattern itself starts with `__`.
    pub fn is_internal(&self) -> bool {
        self.0.starts_with(INTERNAL_PREFIX)
    }

    /// The dead-letter topic of a consumer: `__dlq.<consumerId>`.
    pub fn dead_letter(consumer: &ConsumerId) -> Self {
        // A consumer id is at most 240 characters, so this is always a valid name.
        Self(format!("{INTERNAL_PREFIX}dlq.{}", consumer.as_str()))
    }
}

/// A dispatcher's consumer id: `[A-Za-z0-9._-]+`, names its checkpoint file.
///
/// It is capped so that its dead-letter topic `__dlq.<id>` is still a valid topic name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ConsumerId(String);

/// The longest consumer id (a dispatcher's or a group's): its checkpoint's temporary file,
/// `{id}.checkpoint.tmp`, must fit the file system's 255-byte names, and its dead-letter and
/// log topics (`__dlq.<id>`, `__logs.<id>`) in a topic name. (243, the dead-letter topic's
/// bound alone, let ids of 241–243 characters in whose every checkpoint write failed.)
pub const MAX_CONSUMER_ID_LEN: usize = 255 - ".checkpoint.tmp".len();

impl ConsumerId {
    /// Validates `id` as a consumer id.
    pub fn new(id: impl Into<String>) -> Result<Self, NameError> {
        let id = id.into();
        validate("consumerId", &id, MAX_CONSUMER_ID_LEN)?;
        Ok(Self(id))
    }

    /// The id as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

macro_rules! name_impls {
    ($ty:ty) => {
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl FromStr for $ty {
            type Err = NameError;
            fn from_str(s: &str) -> Result<Self, NameError> {
                Self::new(s)
            }
        }
        impl AsRef<str> for $ty {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
        // Maps keyed by name can be looked up by `&str` (Eq, Ord and Hash are the string's).
        impl std::borrow::Borrow<str> for $ty {
            fn borrow(&self) -> &str {
                &self.0
            }
        }
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::new(s).map_err(serde::de::Error::custom)
            }
        }
    };
}
name_impls!(Topic);
name_impls!(ConsumerId);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_allowed_alphabet() {
        for ok in [
            "order.created",
            "a",
            "A-Z_0.9",
            "..a",
            "__dlq.x",
            &"x".repeat(249),
        ] {
            assert!(Topic::new(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn refuses_what_could_escape_or_confuse() {
        for bad in [
            "",
            ".",
            "..",
            "../etc",
            "a/b",
            "a\\b",
            "a b",
            "ordér",
            "a\0b",
            "topic\n",
            &"x".repeat(250),
        ] {
            assert!(Topic::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let e = Topic::new("a/b").unwrap_err().to_string();
        assert!(e.contains("'/'"), "{e}");
        let e = Topic::new("x".repeat(300)).unwrap_err().to_string();
        assert!(e.contains("300") && e.contains("249"), "{e}");
    }

    #[test]
    fn internal_topics_and_dead_letters() {
        let id = ConsumerId::new("audit").unwrap();
        let dlq = Topic::dead_letter(&id);
        assert_eq!(dlq.as_str(), "__dlq.audit");
        assert!(dlq.is_internal());
        assert!(!Topic::new("_single").unwrap().is_internal());
        let longest = ConsumerId::new("c".repeat(MAX_CONSUMER_ID_LEN)).unwrap();
        assert!(Topic::new(Topic::dead_letter(&longest).as_str()).is_ok());
        assert!(Topic::new(format!("__logs.{longest}")).is_ok());
        assert_eq!(MAX_CONSUMER_ID_LEN, 240);
        assert!(ConsumerId::new("c".repeat(MAX_CONSUMER_ID_LEN + 1)).is_err());
    }

    #[test]
    fn serde_validates() {
        assert!(serde_json::from_str::<Topic>(r#""../x""#).is_err());
        let t: Topic = serde_json::from_str(r#""a.b""#).unwrap();
        assert_eq!(serde_json::to_string(&t).unwrap(), r#""a.b""#);
    }
}
