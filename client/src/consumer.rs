use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::http::StatusCode;
use mmmq_core::{Envelope, ErasedHandler, Message, PatternError, TopicPattern, erase};
use serde::de::DeserializeOwned;

use crate::DedupeStore;

type HandlerFn = ErasedHandler;

/// One envelope, or an array of consecutive envelopes of one topic (`batchMaxMessages` > 1).
fn parse_envelopes(body: &[u8]) -> Result<Vec<Envelope>, serde_json::Error> {
    match serde_json::from_slice::<serde_json::Value>(body)? {
        serde_json::Value::Array(_) => serde_json::from_slice(body),
        _ => serde_json::from_slice(body).map(|e| vec![e]),
    }
}

/// The consumer side of the docs/dispatchers.md, "Dispatchers": an HTTP server that the broker's
/// dispatchers POST to.
///
/// Each handler is registered with a topic pattern and a content type. For every message, every
/// handler whose pattern matches runs in registration order; the answer is ACK if all of them
/// returned `Ok`, NACK otherwise (content that does not deserialize into the handler's type is a
/// NACK with the reason logged). Requests are handled concurrently: without lanes the broker sends
/// one partition's messages one request at a time, so they are handled in order; with a
/// dispatcher's `maxInFlight` lanes several requests of one partition come at once, each key's
/// still one at a time.
///
/// ```no_run
/// # async fn demo() -> std::io::Result<()> {
/// use mmmq_client::{Consumer, Message};
///
/// #[derive(serde::Deserialize)]
/// struct Order { id: u64 }
///
/// let consumer = Consumer::new()
///     .handle("order.*", |m: Message<Order>| async move {
///         println!("order {} at {}", m.content.id, m.offset);
///         Ok::<_, String>(())
///     })
///     .expect("a valid pattern");
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:9000").await?;
/// consumer.serve(listener, async { let _ = tokio::signal::ctrl_c().await; }).await
/// # }
/// ```
#[derive(Clone, Default)]
pub struct Consumer {
    routes: Vec<(TopicPattern, HandlerFn)>,
    dedupe: Option<DedupeStore>,
}

impl Consumer {
    /// A consumer with no handlers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `handler` for topics matching `pattern`, with content of type `T`.
    pub fn handle<T, F, Fut, E>(mut self, pattern: &str, handler: F) -> Result<Self, PatternError>
    where
        T: DeserializeOwned + Send + 'static,
        F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Display + 'static,
    {
        let pattern = TopicPattern::new(pattern)?;
        let f = erase(handler);
        self.routes.push((pattern, f));
        Ok(self)
    }

    /// Exactly-once processing (docs/delivery.md, "Exactly-once consumers"): a message `store` has as
    /// finished is acknowledged without running the handlers again, and one the handlers finish
    /// (all `Ok`) is recorded durably before the ACK. A redelivery that arrives while the first
    /// delivery is still being handled waits for it. With several handlers on one topic, a NACK
    /// from one runs the others again on the retry: give such topics one handler.
    pub fn exactly_once(mut self, store: DedupeStore) -> Self {
        self.dedupe = Some(store);
        self
    }

    /// Handles one envelope once per message when a store is set, else every time.
    async fn dispatch(&self, env: Envelope) -> bool {
        let Some(store) = &self.dedupe else {
            return self.run_handlers(env).await;
        };
        let (topic, partition, offset) = (env.topic.to_string(), env.partition, env.offset);
        let topic_id = env.topic_id;
        let _running = store.begin(&topic, partition, offset).await;
        if store.is_done(&topic, topic_id, partition, offset) {
            store.count_duplicate();
            tracing::debug!(topic, partition, offset, "delivered again; already handled");
            return true;
        }
        if !self.run_handlers(env).await {
            return false;
        }
        match store.record(&[(&topic, topic_id, partition, offset)]).await {
            Ok(()) => true,
            Err(e) => {
                // Unrecorded, an ACK would let a redelivery run the handler again unseen: NACK
                // so the broker retries (the handler runs again, the failure is loud).
                tracing::error!(topic, partition, offset, error = %e, "cannot record the message as handled; answering NACK");
                false
            }
        }
    }

    /// Every matching handler in order.
    async fn run_handlers(&self, env: Envelope) -> bool {
        let matching: Vec<&HandlerFn> = self
            .routes
            .iter()
            .filter(|(p, _)| p.matches(&env.topic))
            .map(|(_, h)| h)
            .collect();
        if matching.is_empty() {
            tracing::warn!(topic = %env.topic, offset = env.offset, "no handler for this topic; acknowledging");
            return true;
        }
        for h in matching {
            if let Err(reason) = h(env.clone()).await {
                tracing::warn!(topic = %env.topic, offset = env.offset, reason, "handler failed; answering NACK");
                return false;
            }
        }
        true
    }

    /// The HTTP routes, to mount in an existing axum application.
    pub fn router(self) -> axum::Router {
        let this = Arc::new(self);
        axum::Router::new().route(
            "/mmmq/messages",
            axum::routing::post(move |body: Bytes| {
                let this = this.clone();
                async move {
                    let envelopes = match parse_envelopes(&body) {
                        Ok(v) => v,
                        Err(e) => {
                            // Serialized, never formatted: a reason may hold quotes.
                            let body = serde_json::json!({ "error": e.to_string() }).to_string();
                            return (StatusCode::BAD_REQUEST, body);
                        }
                    };
                    for env in envelopes {
                        if !this.dispatch(env).await {
                            return (StatusCode::OK, r#"{"ack":"NACK"}"#.to_owned());
                        }
                    }
                    (StatusCode::OK, r#"{"ack":"ACK"}"#.to_owned())
                }
            }),
        )
    }

    /// Serves on `listener` until `shutdown` resolves, then finishes the requests in progress.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(listener, self.router())
            .with_graceful_shutdown(shutdown)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers one request to the router without a socket.
    async fn answer(body: &'static str) -> (StatusCode, serde_json::Value) {
        use tower::ServiceExt;
        let request = axum::http::Request::post("/mmmq/messages")
            .body(axum::body::Body::from(body))
            .unwrap();
        let response = Consumer::new().router().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        let json = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
        (status, json)
    }

    #[tokio::test]
    async fn error_bodies_are_json_even_when_the_reason_has_quotes() {
        // serde_json's reason quotes the offending value: `invalid type: string "five"`.
        for body in [
            r#"{"topic":"t","offset":"five"}"#,
            r#"[{"topic":"t","offset":"five"}]"#,
            r#"{"unterminated"#,
        ] {
            let (status, json) = answer(body).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
            let reason = json["error"].as_str().expect("an error string");
            assert!(!reason.is_empty(), "{body}");
        }
        let (_, json) = answer(r#"{"topic":"t","offset":"five"}"#).await;
        assert!(json["error"].as_str().unwrap().contains('"'), "{json}");
    }
}
