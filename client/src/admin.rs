use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::conn::{Conn, decode, status_error};
use crate::error::ClientError;

/// A topic as `GET /mmmq/topics` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopicInfo {
    /// The name.
    pub name: String,
    /// The offset the next message will get.
    pub next_offset: u64,
    /// Segment files.
    pub segments: u64,
    /// Stored bytes.
    pub bytes: u64,
}

/// A dispatcher as `GET /mmmq/dispatchers` shows it (the fields tools need; `raw` has all).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DispatcherInfo {
    /// Its id.
    pub consumer_id: String,
    /// Its pattern.
    pub pattern: String,
    /// `{"type":"host","url":…}` or `{"type":"plugin","path":…,"version":…,"loadError":…}`.
    pub target: serde_json::Value,
    /// Messages ACKed.
    pub delivered: u64,
    /// NACK answers.
    pub nacked: u64,
    /// Messages dead-lettered.
    pub dead_lettered: u64,
    /// Messages not yet delivered.
    pub lag: u64,
    /// The most recent problem.
    pub last_error: Option<String>,
}

/// Read-only views of a broker.
#[derive(Debug, Clone)]
pub struct Admin {
    conn: Conn,
}

impl Admin {
    /// Sends `Authorization: Bearer <token>` (for a broker started with `--auth-token`).
    pub fn auth_token(mut self, token: Option<String>) -> Self {
        self.conn.set_token(token);
        self
    }

    /// For the broker at `broker`.
    pub fn new(broker: &str) -> Result<Self, ClientError> {
        Ok(Self {
            conn: Conn::new(broker, Duration::from_secs(30))?,
        })
    }

    async fn get<T: for<'de> Deserialize<'de>>(&self, path: &str) -> Result<T, ClientError> {
        match self.conn.send(reqwest::Method::GET, path, None).await? {
            (200, bytes) => decode(&bytes),
            (status, bytes) => Err(status_error(status, &bytes)),
        }
    }

    /// Every topic.
    pub async fn topics(&self) -> Result<Vec<TopicInfo>, ClientError> {
        self.get("/mmmq/topics").await
    }

    /// Every dispatcher.
    pub async fn dispatchers(&self) -> Result<Vec<DispatcherInfo>, ClientError> {
        self.get("/mmmq/dispatchers").await
    }
}
