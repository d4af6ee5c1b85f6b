//! Real HTTP consumers (docs/dispatchers.md, "Dispatchers") that record what they receive.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::Value;

use crate::eventually;

/// How a test consumer answers one envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// `200 {"ack":"ACK"}`.
    Ack,
    /// `200 {"ack":"NACK"}`.
    Nack,
    /// `500`.
    Error,
}

type Policy = dyn Fn(&Value) -> Answer + Send + Sync;

/// A real HTTP consumer (docs/dispatchers.md, "Dispatchers") that records every envelope it receives, in order.
pub struct Consumer {
    /// Its port.
    pub port: u16,
    received: Arc<Mutex<Vec<(Instant, Value)>>>,
    /// The `Authorization` header of every request, in order.
    pub authorization: Arc<Mutex<Vec<Option<String>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Consumer {
    /// ACKs everything, on a free port.
    pub async fn start() -> Self {
        Self::start_on(0, Arc::new(|_| Answer::Ack)).await
    }

    /// Answers by `policy`, on `port` (0 for a free one).
    pub async fn start_on(port: u16, policy: Arc<Policy>) -> Self {
        Self::start_slow(port, policy, Duration::ZERO).await
    }

    /// As [`Consumer::start_on`], taking `delay` per request before it answers (a slow consumer;
    /// requests are served concurrently).
    pub async fn start_slow(port: u16, policy: Arc<Policy>, delay: Duration) -> Self {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let authorization: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
        let rec = received.clone();
        let auth = authorization.clone();
        let app = axum::Router::new().route(
            "/mmmq/messages",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let rec = rec.clone();
                    let auth = auth.clone();
                    let policy = policy.clone();
                    async move {
                        auth.lock().push(
                            headers
                                .get("authorization")
                                .and_then(|v| v.to_str().ok())
                                .map(str::to_owned),
                        );
                        let v: Value = serde_json::from_slice(&body).expect("broker sent JSON");
                        let items = match &v {
                            Value::Array(a) => a.clone(),
                            one => vec![one.clone()],
                        };
                        let mut answer = Answer::Ack;
                        for item in &items {
                            let a = policy(item);
                            if a != Answer::Ack {
                                answer = a;
                            }
                        }
                        rec.lock().push((Instant::now(), v));
                        if !delay.is_zero() {
                            tokio::time::sleep(delay).await;
                        }
                        match answer {
                            Answer::Ack => (axum::http::StatusCode::OK, r#"{"ack":"ACK"}"#),
                            Answer::Nack => (axum::http::StatusCode::OK, r#"{"ack":"NACK"}"#),
                            Answer::Error => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "{}"),
                        }
                    }
                },
            ),
        );
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            port,
            received,
            authorization,
            task,
        }
    }

    /// Every request body received, in order (an envelope, or an array for batches).
    pub fn requests(&self) -> Vec<Value> {
        self.received
            .lock()
            .iter()
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Every envelope received, batches flattened, in order.
    pub fn envelopes(&self) -> Vec<Value> {
        self.timed_envelopes().into_iter().map(|(_, v)| v).collect()
    }

    /// Every envelope received with the moment its request arrived, batches flattened, in order.
    pub fn timed_envelopes(&self) -> Vec<(Instant, Value)> {
        self.received
            .lock()
            .iter()
            .flat_map(|(at, v)| match v {
                Value::Array(a) => a.iter().map(|e| (*at, e.clone())).collect(),
                one => vec![(*at, one.clone())],
            })
            .collect()
    }

    /// The offset of every envelope received, in order.
    pub fn offsets(&self) -> Vec<u64> {
        self.envelopes()
            .iter()
            .map(|e| e["offset"].as_u64().expect("an envelope has an offset"))
            .collect()
    }

    /// Envelopes of one topic, in the order received.
    pub fn of_topic(&self, topic: &str) -> Vec<Value> {
        self.envelopes()
            .into_iter()
            .filter(|e| e["topic"] == topic)
            .collect()
    }

    /// Waits until at least `n` envelopes arrived.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Value> {
        eventually(timeout, &format!("{n} envelopes"), || {
            let e = self.envelopes();
            (e.len() >= n).then_some(e)
        })
        .await
    }

    /// Stops listening (the port is free again).
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}
