use std::time::Duration;

use mmmq_core::{DispatcherStatus, TopicInfo};
use serde::Deserialize;

use crate::conn::{Conn, decode, status_error};
use crate::error::ClientError;

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
    pub async fn dispatchers(&self) -> Result<Vec<DispatcherStatus>, ClientError> {
        self.get("/mmmq/dispatchers").await
    }
}
