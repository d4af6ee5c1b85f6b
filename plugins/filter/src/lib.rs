//! Passes on the messages that match a condition from `plugin.config`, and drops the rest.
//!
//! - `field`: a JSON pointer into the content (default `/type`).
//! - `equals`: pass when the value there is this string (or this number or boolean, written as
//!   JSON: `"42"`, `"true"`); or
//! - `min` / `max`: pass when the value there is a number within these bounds (inclusive).
//! - `to`: where passing messages are emitted (default `<topic>.filtered`), with their key.
//!
//! A message that does not pass is ACKed and emits nothing. A configuration without `equals`,
//! `min` or `max` dead-letters every message with the reason, so a mistake is seen, not silent.

use mmmq_plugin_sdk::{Message, Verdict, config, emit};

/// See the crate documentation.
pub fn handle(msg: Message) -> Verdict {
    let field = config("field").unwrap_or_else(|| "/type".into());
    let to = config("to").unwrap_or_else(|| format!("{}.filtered", msg.topic));
    let Ok(value) = msg.value() else {
        return Verdict::DeadLetter("content is not JSON".into());
    };
    let found = value.pointer(&field);
    let pass = match (config("equals"), config("min"), config("max")) {
        (Some(want), _, _) => found.is_some_and(|v| match v {
            serde_json::Value::String(s) => *s == want,
            other => serde_json::to_string(other).is_ok_and(|text| text == want),
        }),
        (None, None, None) => {
            return Verdict::DeadLetter("plugin.config needs equals, min or max".into());
        }
        (None, min, max) => {
            let bound = |b: Option<String>| b.and_then(|b| b.parse::<f64>().ok());
            match found.and_then(serde_json::Value::as_f64) {
                Some(n) => bound(min).is_none_or(|m| n >= m) && bound(max).is_none_or(|m| n <= m),
                None => false,
            }
        }
    };
    if !pass {
        return Verdict::Ack;
    }
    match emit(&to, msg.key.as_deref(), &msg.content) {
        Ok(()) => Verdict::Ack,
        Err(e) => Verdict::DeadLetter(e.to_string()),
    }
}

mmmq_plugin_sdk::export!(handle);

#[cfg(test)]
mod tests {
    use super::*;
    use mmmq_plugin_sdk::testing::{set_config, take_emits};

    #[test]
    fn equals_passes_matching_messages_only() {
        set_config("equals", "refund");
        assert_eq!(
            handle(Message::new("pay", r#"{"type":"refund"}"#).with_key("k")),
            Verdict::Ack
        );
        assert_eq!(
            handle(Message::new("pay", r#"{"type":"sale"}"#)),
            Verdict::Ack
        );
        let out = take_emits();
        assert_eq!(out.len(), 1);
        assert_eq!(
            (out[0].topic.as_str(), out[0].key.as_deref()),
            ("pay.filtered", Some("k"))
        );
    }

    #[test]
    fn min_and_max_bound_a_number() {
        set_config("field", "/amount");
        set_config("min", "100");
        set_config("max", "1000");
        set_config("to", "big");
        for (amount, passes) in [
            ("99.5", false),
            ("100", true),
            ("1000", true),
            ("1001", false),
            ("\"500\"", false),
        ] {
            assert_eq!(
                handle(Message::new("pay", format!(r#"{{"amount":{amount}}}"#))),
                Verdict::Ack
            );
            assert_eq!(take_emits().len(), usize::from(passes), "{amount}");
        }
    }

    #[test]
    fn a_config_without_a_condition_dead_letters() {
        assert!(matches!(
            handle(Message::new("pay", "{}")),
            Verdict::DeadLetter(_)
        ));
    }
}
