//! [`crate::Message::pointer`]'s step: one member of an object or item of an array, found with
//! one pass that skips everything else without allocating.

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::fmt;

/// The text of member (or item) `token` of the object (or array) `json`, if it has one.
pub fn child<'a>(json: &'a str, token: &str) -> Result<Option<&'a str>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(json);
    let found = Child { token }.deserialize(&mut de)?;
    de.end()?;
    Ok(found.map(RawValue::get))
}

struct Child<'t> {
    token: &'t str,
}

/// Whether a key is the token, compared where it lies (no copy).
struct Is<'t>(&'t str);

impl<'de> DeserializeSeed<'de> for Is<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for Is<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E>(self, key: &str) -> Result<bool, E> {
        Ok(key == self.0)
    }
}

impl<'de> DeserializeSeed<'de> for Child<'_> {
    type Value = Option<&'de RawValue>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Child<'_> {
    type Value = Option<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("JSON")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(is_token) = map.next_key_seed(Is(self.token))? {
            if found.is_none() && is_token {
                found = Some(map.next_value::<&'de RawValue>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let index = self.token.parse::<usize>().ok();
        let (mut found, mut i) = (None, 0);
        loop {
            if Some(i) == index {
                match seq.next_element::<&'de RawValue>()? {
                    Some(v) => found = Some(v),
                    None => break,
                }
            } else if seq.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
            i += 1;
        }
        Ok(found)
    }

    // A scalar has no members.
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}
