//! What the three clients share: the broker's base URL, a pooled HTTP client and the optional
//! bearer token, and one way to send a request and read the answer.

use std::time::Duration;

use axum::body::Bytes;
use mmmq_core::error_chain;

use crate::error::ClientError;

#[derive(Debug, Clone)]
pub(crate) struct Conn {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Conn {
    pub fn new(broker: &str, timeout: Duration) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .build()
            .map_err(|e| ClientError::Setup(e.to_string()))?;
        Ok(Self {
            http,
            base: broker.trim_end_matches('/').to_owned(),
            token: None,
        })
    }

    /// The same broker and token, each request given up to `timeout`.
    pub fn with_timeout(&self, timeout: Duration) -> Result<Self, ClientError> {
        let mut conn = Self::new(&self.base, timeout)?;
        conn.token = self.token.clone();
        Ok(conn)
    }

    pub fn set_token(&mut self, token: Option<String>) {
        self.token = token.filter(|t| !t.is_empty());
    }

    /// Sends one request; the status and the body, or `Unavailable` when nothing answered.
    pub async fn send(
        &self,
        method: reqwest::Method,
        path_and_query: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Bytes), ClientError> {
        self.send_as(method, path_and_query, body, "application/json")
            .await
    }

    /// As [`Self::send`], with a body of another content type (a component:
    /// `application/wasm`).
    pub async fn send_as(
        &self,
        method: reqwest::Method,
        path_and_query: &str,
        body: Option<Vec<u8>>,
        content_type: &str,
    ) -> Result<(u16, Bytes), ClientError> {
        let mut request = self
            .http
            .request(method, format!("{}{path_and_query}", self.base));
        if let Some(body) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(body);
        }
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let unavailable = |e: reqwest::Error| ClientError::Unavailable {
            attempts: 1,
            message: error_chain(&e),
        };
        let response = request.send().await.map_err(unavailable)?;
        let status = response.status().as_u16();
        let bytes = response.bytes().await.map_err(unavailable)?;
        Ok((status, bytes))
    }
}

/// The broker's `{"error": …}`, or the body as text.
pub(crate) fn error_text(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct ErrorBody {
        error: String,
    }
    serde_json::from_slice::<ErrorBody>(body)
        .map(|b| b.error)
        .unwrap_or_else(|_| String::from_utf8_lossy(body).into_owned())
}

/// The error for an answer other than 200: 401 and the rest (callers handle 404 and 503 first
/// where those mean something of their own).
pub(crate) fn status_error(status: u16, body: &[u8]) -> ClientError {
    match status {
        401 => ClientError::Unauthorized(error_text(body)),
        _ => ClientError::Rejected {
            status,
            message: error_text(body),
        },
    }
}

/// Decodes a 200 answer.
pub(crate) fn decode<T: for<'de> serde::Deserialize<'de>>(body: &[u8]) -> Result<T, ClientError> {
    serde_json::from_slice(body).map_err(|e| ClientError::Protocol(e.to_string()))
}
