//! Topic patterns, the way a dispatcher says which topics it wants.
//!
//! A pattern is a sequence of words separated by `.`, like a topic. A word is either a literal,
//! `*` (exactly one word) or `**` (any number of words, zero included). The matching itself is done
//! by `globset`, after the words are turned into path components, so that `*` can never run across a
//! `.`.
//!
//! Choices worth knowing:
//! - `order.**` matches `order` itself as well as `order.a` and `order.a.b`: `**` is "any number of
//!   words", and zero is a number (RabbitMQ's `order.#` behaves the same way).
//! - Internal topics (`__dlq.…`) are matched only by patterns that start with `__`, so `**` never
//!   feeds a consumer its own dead letters.

use std::fmt;
use std::str::FromStr;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::topic::{INTERNAL_PREFIX, MAX_TOPIC_LEN, Topic};

/// Why a pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// The pattern is empty or too long.
    #[error("pattern must be 1 to {MAX_TOPIC_LEN} characters long")]
    Length,
    /// A word between two dots (or at either end) is empty.
    #[error("pattern {0:?} has an empty word (two dots in a row, or a dot at either end)")]
    EmptyWord(String),
    /// A word mixes `*` with other characters or uses a character topics cannot contain.
    #[error(
        "pattern {pattern:?} has the word {word:?}; a word is `*`, `**` or letters, digits, '_' and '-'"
    )]
    BadWord {
        /// The whole pattern.
        pattern: String,
        /// The offending word.
        word: String,
    },
}

/// A validated topic pattern (see the module documentation for the grammar).
#[derive(Clone)]
pub struct TopicPattern {
    source: String,
    internal: bool,
    globs: GlobSet,
}

impl TopicPattern {
    /// Parses and compiles `pattern`.
    pub fn new(pattern: impl Into<String>) -> Result<Self, PatternError> {
        let source = pattern.into();
        if source.is_empty() || source.len() > MAX_TOPIC_LEN {
            return Err(PatternError::Length);
        }
        let words: Vec<&str> = source.split('.').collect();
        for word in &words {
            if word.is_empty() {
                return Err(PatternError::EmptyWord(source.clone()));
            }
            let literal = word
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !(literal || *word == "*" || *word == "**") {
                return Err(PatternError::BadWord {
                    pattern: source.clone(),
                    word: (*word).to_owned(),
                });
            }
        }
        let mut alternatives = vec![words.join("/")];
        // globset's `a/**` needs at least one more component; `**` here also means zero words.
        if words.len() > 1 && words.last() == Some(&"**") {
            alternatives.push(words[..words.len() - 1].join("/"));
        }
        let mut set = GlobSetBuilder::new();
        for alt in alternatives {
            let glob = GlobBuilder::new(&alt)
                .literal_separator(true)
                .build()
                .map_err(|_| PatternError::BadWord {
                    pattern: source.clone(),
                    word: alt.clone(),
                })?;
            set.add(glob);
        }
        let globs = set.build().map_err(|_| PatternError::Length)?;
        Ok(Self {
            internal: source.starts_with(INTERNAL_PREFIX),
            source,
            globs,
        })
    }

    /// Whether messages of `topic` are for this pattern.
    pub fn matches(&self, topic: &Topic) -> bool {
        if topic.is_internal() && !self.internal {
            return false;
        }
        self.globs.is_match(topic.as_str().replace('.', "/"))
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }
}

impl PartialEq for TopicPattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}
impl Eq for TopicPattern {}

impl fmt::Debug for TopicPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TopicPattern({:?})", self.source)
    }
}

impl fmt::Display for TopicPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl FromStr for TopicPattern {
    type Err = PatternError;
    fn from_str(s: &str) -> Result<Self, PatternError> {
        Self::new(s)
    }
}

impl Serialize for TopicPattern {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.source)
    }
}

impl<'de> Deserialize<'de> for TopicPattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::new(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, topic: &str) -> bool {
        TopicPattern::new(pattern)
            .unwrap()
            .matches(&Topic::new(topic).unwrap())
    }

    #[test]
    fn star_is_exactly_one_word() {
        assert!(m("order.*", "order.new"));
        assert!(m("order.*", "order.cancel"));
        assert!(!m("order.*", "order"));
        assert!(!m("order.*", "order.new.x"));
        assert!(!m("order.*", "orders.new"));
        assert!(m("payment.kakao.*", "payment.kakao.success"));
        assert!(!m("payment.kakao.*", "payment.naver.success"));
        assert!(m("*.created", "order.created"));
        assert!(!m("*.created", "a.order.created"));
    }

    #[test]
    fn double_star_is_any_number_of_words() {
        for t in ["a", "order", "order.new", "x.y.z.w", "a-b_c.9"] {
            assert!(m("**", t), "{t}");
        }
        assert!(m("order.**", "order.a"));
        assert!(m("order.**", "order.a.b"));
        assert!(m("order.**", "order"), "zero words is a number of words");
        assert!(!m("order.**", "orders"));
        assert!(!m("order.**", "x.order.a"));
        assert!(m("**.created", "order.created"));
        assert!(m("**.created", "created"));
        assert!(m("a.**.z", "a.z"));
        assert!(m("a.**.z", "a.b.c.z"));
        assert!(!m("a.**.z", "a.b.c"));
    }

    #[test]
    fn literal_matches_only_itself() {
        assert!(m("order.created", "order.created"));
        assert!(!m("order.created", "order.created.x"));
        assert!(!m("order.created", "order"));
    }

    #[test]
    fn internal_topics_need_an_internal_pattern() {
        assert!(!m("**", "__dlq.audit"));
        assert!(!m("*.*", "__dlq.audit"));
        assert!(m("__dlq.*", "__dlq.audit"));
        assert!(m("__dlq.**", "__dlq.audit"));
        assert!(
            TopicPattern::new("__**").is_err(),
            "a word is a literal or a wildcard, not both"
        );
    }

    #[test]
    fn refuses_malformed_patterns() {
        for bad in [
            "", ".", "a..b", "a.", ".a", "a.b*", "a.*b", "***", "a/b", "a b", "a.[b]", "a.{b,c}",
            "a.?",
        ] {
            assert!(TopicPattern::new(bad).is_err(), "{bad:?}");
        }
    }
}
