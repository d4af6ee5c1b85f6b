use std::time::Duration;

/// What went wrong talking to the broker.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The broker refused the request as malformed (4xx): retrying the same request cannot help.
    #[error("broker refused the request ({status}): {message}")]
    Rejected {
        /// HTTP status.
        status: u16,
        /// The broker's reason.
        message: String,
    },
    /// The broker could not make the message durable (503 NACK), even after the retries.
    #[error("broker could not store the message after {attempts} attempts: {message}")]
    Nacked {
        /// Attempts made.
        attempts: u32,
        /// The broker's reason.
        message: String,
    },
    /// The broker could not be reached, or did not answer in time, even after the retries. The
    /// message may or may not have been stored (a timeout can hide an ACK).
    #[error("broker unreachable after {attempts} attempts: {message}")]
    Unavailable {
        /// Attempts made.
        attempts: u32,
        /// The last connection error.
        message: String,
    },
    /// The broker requires a bearer token and this one is missing or wrong.
    #[error("broker refused the token (401): {0}")]
    Unauthorized(String),
    /// The topic does not exist (pull).
    #[error("no topic {0:?}")]
    NoSuchTopic(String),
    /// The broker's answer was not what the protocol says.
    #[error("unexpected answer from the broker: {0}")]
    Protocol(String),
    /// The content could not be encoded as JSON.
    #[error("content is not JSON-serialisable: {0}")]
    Encode(#[from] serde_json::Error),
    /// The client could not be set up (a bad URL, TLS initialisation).
    #[error("client setup: {0}")]
    Setup(String),
    /// The exactly-once store ([`crate::DedupeStore`]) could not be opened, read or written.
    #[error("exactly-once store: {0}")]
    Store(String),
}

impl ClientError {
    /// Whether trying again later could succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Nacked { .. } | Self::Unavailable { .. })
    }
}

/// Backoff before retry `attempt` (1-based): 100 ms doubling, at most 5 s.
pub(crate) fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(100u64.saturating_mul(1 << attempt.saturating_sub(1).min(6)))
        .min(Duration::from_secs(5))
}
