//! Routes each message to a topic chosen by its content: the value of a field (`plugin.config`
//! `field`, a JSON pointer, default `/type`) appended to a prefix (`prefix`, default `routed.`).
//! The message is emitted unchanged, with its key, so a key's messages stay in order in the
//! topic they are routed to. A message without the field goes to `fallback` if it is configured,
//! and is dead-lettered (with the reason) if not.
//!
//! Emits are appended exactly once, and only because the handler ACKs: a crash between the append
//! and the dispatcher's checkpoint does not route a message twice.

use mmmq_plugin_sdk::{Message, Verdict, config, emit};

/// See the crate documentation.
pub fn handle(msg: Message) -> Verdict {
    let field = config("field").unwrap_or_else(|| "/type".into());
    let prefix = config("prefix").unwrap_or_else(|| "routed.".into());
    // Only the field is parsed out, not the whole content.
    let value = match msg.pointer(&field) {
        Ok(v) => v,
        Err(e) => return Verdict::DeadLetter(format!("content is not JSON: {e}")),
    };
    let route = match value {
        Some(serde_json::Value::String(s)) => s,
        Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => v.to_string(),
        _ => match config("fallback") {
            Some(topic) => return send(&topic, &msg),
            None => return Verdict::DeadLetter(format!("no {field} to route by")),
        },
    };
    send(&format!("{prefix}{route}"), &msg)
}

fn send(topic: &str, msg: &Message) -> Verdict {
    match emit(topic, msg.key.as_deref(), &msg.content) {
        Ok(()) => Verdict::Ack,
        // A topic name the broker refuses will be refused again: no point in retrying.
        Err(e) => Verdict::DeadLetter(format!("cannot route to {topic:?}: {}", e.0)),
    }
}

mmmq_plugin_sdk::export!(handle);

#[cfg(test)]
mod tests {
    use super::*;
    use mmmq_plugin_sdk::testing::{set_config, take_emits};

    #[test]
    fn routes_by_the_field_and_keeps_key_and_content() {
        let msg = Message::new("orders", r#"{"type":"eu","n":1}"#).with_key("c-7");
        assert_eq!(handle(msg), Verdict::Ack);
        let out = take_emits();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].topic, "routed.eu");
        assert_eq!(out[0].key.as_deref(), Some("c-7"));
        assert_eq!(out[0].content, r#"{"type":"eu","n":1}"#);
    }

    #[test]
    fn a_configured_field_prefix_and_fallback() {
        set_config("field", "/region/code");
        set_config("prefix", "by-region.");
        assert_eq!(
            handle(Message::new("o", r#"{"region":{"code":7}}"#)),
            Verdict::Ack
        );
        assert_eq!(take_emits()[0].topic, "by-region.7");
        assert!(matches!(
            handle(Message::new("o", r#"{"n":1}"#)),
            Verdict::DeadLetter(r) if r.contains("/region/code")
        ));
        assert!(take_emits().is_empty());
        set_config("fallback", "unrouted");
        assert_eq!(handle(Message::new("o", r#"{"n":1}"#)), Verdict::Ack);
        assert_eq!(take_emits()[0].topic, "unrouted");
    }

    #[test]
    fn a_value_that_makes_no_topic_name_is_dead_lettered() {
        set_config("prefix", "");
        assert!(matches!(
            handle(Message::new("o", r#"{"type":"__dlq"}"#)),
            Verdict::DeadLetter(r) if r.contains("internal")
        ));
    }
}
