use std::time::Duration;

use futures_util::Stream;
use mmmq_core::Envelope;
use serde::Deserialize;

use crate::error::{ClientError, backoff};
use crate::producer::describe;

#[derive(Deserialize)]
struct PullAnswer {
    messages: Vec<Envelope>,
    next: u64,
}

/// Reads a topic from an offset with long polling (`GET /mmmq/topics/{topic}/messages`).
///
/// The consumer keeps its own position; nothing is stored on the broker. Corrupt entries are left
/// out by the broker, so offsets may skip.
#[derive(Debug, Clone)]
pub struct PullConsumer {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    topic: String,
    next: u64,
    max: usize,
    wait: Duration,
}

impl PullConsumer {
    /// Sends `Authorization: Bearer <token>` (for a broker started with `--auth-token`).
    pub fn auth_token(mut self, token: Option<String>) -> Self {
        self.token = token.filter(|t| !t.is_empty());
        self
    }

    /// Reads `topic` from offset 0, 100 messages per request, waiting up to 30 s for new ones.
    pub fn new(broker: &str, topic: &str) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| ClientError::Setup(e.to_string()))?;
        Ok(Self {
            http,
            base: broker.trim_end_matches('/').to_owned(),
            token: None,
            topic: topic.to_owned(),
            next: 0,
            max: 100,
            wait: Duration::from_secs(30),
        })
    }

    /// Starts at `offset`.
    pub fn from_offset(mut self, offset: u64) -> Self {
        self.next = offset;
        self
    }

    /// At most `max` messages per request (1–1000).
    pub fn max(mut self, max: usize) -> Self {
        self.max = max.clamp(1, 1000);
        self
    }

    /// How long one request waits for a message when there is none (at most 30 s; zero returns at
    /// once).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait.min(Duration::from_secs(30));
        self
    }

    /// The next offset it will read.
    pub fn position(&self) -> u64 {
        self.next
    }

    /// One request: the messages from the current position (empty when the wait ran out), and the
    /// position moves past them.
    pub async fn poll(&mut self) -> Result<Vec<Envelope>, ClientError> {
        let url = format!(
            "{}/mmmq/topics/{}/messages?from={}&max={}&waitMs={}",
            self.base,
            self.topic,
            self.next,
            self.max,
            self.wait.as_millis()
        );
        let r = self
            .http
            .get(&url)
            .send()
            .await
            .map_err(|e| ClientError::Unavailable {
                attempts: 1,
                message: describe(&e),
            })?;
        let status = r.status().as_u16();
        let bytes = r
            .bytes()
            .await
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        match status {
            200 => {
                let answer: PullAnswer = serde_json::from_slice(&bytes)
                    .map_err(|e| ClientError::Protocol(e.to_string()))?;
                self.next = answer.next;
                Ok(answer.messages)
            }
            404 => Err(ClientError::NoSuchTopic(self.topic.clone())),
            401 => Err(ClientError::Unauthorized(
                String::from_utf8_lossy(&bytes).into_owned(),
            )),
            503 => Err(ClientError::Unavailable {
                attempts: 1,
                message: String::from_utf8_lossy(&bytes).into_owned(),
            }),
            _ => Err(ClientError::Rejected {
                status,
                message: String::from_utf8_lossy(&bytes).into_owned(),
            }),
        }
    }

    /// Every message from the current position on, forever. Transient errors are yielded (and
    /// retried with backoff); others end the stream after being yielded.
    pub fn into_stream(self) -> impl Stream<Item = Result<Envelope, ClientError>> {
        futures_util::stream::unfold(
            (self, std::collections::VecDeque::new(), 0u32, false),
            |(mut pull, mut buffered, mut failures, done)| async move {
                if done {
                    return None;
                }
                loop {
                    if let Some(e) = buffered.pop_front() {
                        return Some((Ok(e), (pull, buffered, 0, false)));
                    }
                    if failures > 0 {
                        tokio::time::sleep(backoff(failures)).await;
                    }
                    match pull.poll().await {
                        Ok(messages) => {
                            failures = 0;
                            buffered.extend(messages);
                        }
                        Err(e) => {
                            let transient = e.is_transient();
                            failures += 1;
                            return Some((Err(e), (pull, buffered, failures, !transient)));
                        }
                    }
                }
            },
        )
    }
}
