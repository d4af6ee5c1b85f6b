use std::time::Duration;

use futures_util::Stream;
use mmmq_core::{Envelope, PullPage};

use crate::conn::{Conn, decode, error_text, status_error};
use crate::error::ClientError;

/// Reads a topic from an offset with long polling (`GET /mmmq/topics/{topic}/messages`).
///
/// The consumer keeps its own position; nothing is stored on the broker. Corrupt entries are left
/// out by the broker, so offsets may skip.
#[derive(Debug, Clone)]
pub struct PullConsumer {
    conn: Conn,
    topic: String,
    partition: u32,
    next: u64,
    max: usize,
    wait: Duration,
}

impl PullConsumer {
    /// Sends `Authorization: Bearer <token>` (for a broker started with `--auth-token`).
    pub fn auth_token(mut self, token: Option<String>) -> Self {
        self.conn.set_token(token);
        self
    }

    /// Reads `topic` from offset 0, 100 messages per request, waiting up to 30 s for new ones.
    pub fn new(broker: &str, topic: &str) -> Result<Self, ClientError> {
        Ok(Self {
            // Longer than the longest long poll.
            conn: Conn::new(broker, Duration::from_secs(60))?,
            topic: topic.to_owned(),
            partition: 0,
            next: 0,
            max: 100,
            wait: Duration::from_secs(30),
        })
    }

    /// Reads this partition of the topic (default 0).
    pub fn partition(mut self, partition: u32) -> Self {
        self.partition = partition;
        self
    }

    /// Starts at `offset` (default 0) of the partition.
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
        let path = format!(
            "/mmmq/topics/{}/messages?partition={}&from={}&max={}&waitMs={}",
            self.topic,
            self.partition,
            self.next,
            self.max,
            self.wait.as_millis()
        );
        match self.conn.send(reqwest::Method::GET, &path, None).await? {
            (200, bytes) => {
                let answer: PullPage = decode(&bytes)?;
                self.next = answer.next;
                Ok(answer.messages)
            }
            (404, _) => Err(ClientError::NoSuchTopic(self.topic.clone())),
            (503, bytes) => Err(ClientError::Unavailable {
                attempts: 1,
                message: error_text(&bytes),
            }),
            (status, bytes) => Err(status_error(status, &bytes)),
        }
    }

    /// Every message from the current position on, forever. Transient errors are yielded (and
    /// retried with backoff); others end the stream after being yielded.
    pub fn into_stream(self) -> impl Stream<Item = Result<Envelope, ClientError>> {
        crate::stream::envelopes(self)
    }
}

impl crate::stream::Polls for PullConsumer {
    async fn poll_messages(&mut self) -> Result<Vec<Envelope>, ClientError> {
        self.poll().await
    }
}
