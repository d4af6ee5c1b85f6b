//! Enriches each message with what an HTTP API says about it, and emits the result.
//!
//! For a message `{"customerId": "c-7", …}` it sends `GET {url}c-7` (`plugin.config` `url`; the
//! value at the JSON pointer `field`, default `/customerId`, is appended) and emits the message
//! with the API's JSON answer under `as` (default `customer`) to `to` (default
//! `<topic>.enriched`), with the same key. The API's origin must be in the dispatcher's
//! `plugin.allowedHosts`.
//!
//! - The API answers 404: the message is dead-lettered with the reason (nothing to enrich with).
//! - The API is down, slow or answers 5xx: `retry-after` 1 s (`retryMs`), so the message waits
//!   for the API without using up NACK retries; nothing is emitted until it succeeds.

use mmmq_plugin_sdk::{Message, Verdict, config, emit_json, http};

/// See the crate documentation.
pub fn handle(msg: Message) -> Verdict {
    let Some(url) = config("url") else {
        return Verdict::DeadLetter("plugin.config has no url".into());
    };
    let field = config("field").unwrap_or_else(|| "/customerId".into());
    let into = config("as").unwrap_or_else(|| "customer".into());
    let to = config("to").unwrap_or_else(|| format!("{}.enriched", msg.topic));
    let retry_ms = config("retryMs")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let mut value = match msg.value() {
        Ok(v @ serde_json::Value::Object(_)) => v,
        _ => return Verdict::DeadLetter("content is not a JSON object".into()),
    };
    let id = match value.pointer(&field) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(v @ serde_json::Value::Number(_)) => v.to_string(),
        _ => return Verdict::DeadLetter(format!("no {field} to look up")),
    };
    let answer = match http::get(&format!("{url}{id}")) {
        Ok(a) => a,
        Err(e) => {
            mmmq_plugin_sdk::warn!("lookup of {id} failed, retrying in {retry_ms} ms: {e}");
            return Verdict::RetryAfter(retry_ms);
        }
    };
    match answer.status {
        200..=299 => {}
        404 => return Verdict::DeadLetter(format!("{url}{id}: not found")),
        status => {
            mmmq_plugin_sdk::warn!("lookup of {id} answered {status}, retrying in {retry_ms} ms");
            return Verdict::RetryAfter(retry_ms);
        }
    }
    let found: serde_json::Value = match answer.json() {
        Ok(v) => v,
        Err(e) => return Verdict::DeadLetter(format!("{url}{id}: {e}")),
    };
    value[into] = found;
    match emit_json(&to, msg.key.as_deref(), &value) {
        Ok(()) => Verdict::Ack,
        Err(e) => Verdict::DeadLetter(e.to_string()),
    }
}

mmmq_plugin_sdk::export!(handle);

#[cfg(test)]
mod tests {
    use super::*;
    use mmmq_plugin_sdk::http::{HttpError, Response};
    use mmmq_plugin_sdk::testing::{on_http, set_config, take_emits, take_requests};
    use serde_json::json;

    fn api() {
        set_config("url", "http://api.test/customers/");
        on_http(|req| match req.url.as_str() {
            "http://api.test/customers/c-7" => Ok(Response::json_body(&json!({"tier": "gold"}))),
            "http://api.test/customers/down" => Err(HttpError("connection refused".into())),
            _ => Ok(Response {
                status: 404,
                headers: vec![],
                body: vec![],
            }),
        });
    }

    #[test]
    fn a_found_customer_is_added_and_emitted_with_the_key() {
        api();
        let msg = Message::new("orders", r#"{"customerId":"c-7","n":1}"#).with_key("c-7");
        assert_eq!(handle(msg), Verdict::Ack);
        assert_eq!(take_requests()[0].url, "http://api.test/customers/c-7");
        let out = take_emits();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].topic, "orders.enriched");
        assert_eq!(out[0].key.as_deref(), Some("c-7"));
        let v: serde_json::Value = serde_json::from_str(&out[0].content).unwrap();
        assert_eq!(
            v,
            json!({"customerId": "c-7", "n": 1, "customer": {"tier": "gold"}})
        );
    }

    #[test]
    fn an_unknown_customer_dead_letters_and_a_down_api_retries() {
        api();
        assert!(matches!(
            handle(Message::new("orders", r#"{"customerId":"nobody"}"#)),
            Verdict::DeadLetter(r) if r.contains("not found")
        ));
        assert_eq!(
            handle(Message::new("orders", r#"{"customerId":"down"}"#)),
            Verdict::RetryAfter(1000)
        );
        assert!(take_emits().is_empty());
    }
}
