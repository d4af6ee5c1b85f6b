use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ClientError;
use crate::producer::describe;

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
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Admin {
    /// Sends `Authorization: Bearer <token>` (for a broker started with `--auth-token`).
    pub fn auth_token(mut self, token: Option<String>) -> Self {
        self.token = token.filter(|t| !t.is_empty());
        self
    }

    /// For the broker at `broker`.
    pub fn new(broker: &str) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| ClientError::Setup(e.to_string()))?;
        Ok(Self {
            http,
            base: broker.trim_end_matches('/').to_owned(),
            token: None,
        })
    }

    async fn get<T: for<'de> Deserialize<'de>>(&self, path: &str) -> Result<T, ClientError> {
        let mut request = self.http.get(format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let r = request.send().await.map_err(|e| ClientError::Unavailable {
            attempts: 1,
            message: describe(&e),
        })?;
        let status = r.status().as_u16();
        let bytes = r
            .bytes()
            .await
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        if status == 401 {
            return Err(ClientError::Unauthorized(
                String::from_utf8_lossy(&bytes).into_owned(),
            ));
        }
        if status != 200 {
            return Err(ClientError::Rejected {
                status,
                message: String::from_utf8_lossy(&bytes).into_owned(),
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Protocol(e.to_string()))
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
