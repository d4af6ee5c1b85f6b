use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::conn::{Conn, decode, error_text, status_error};
use crate::error::{ClientError, backoff};

/// Where a message was stored.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Receipt {
    /// The topic.
    pub topic: String,
    /// The partition it went to (0 from a broker that predates partitions).
    #[serde(default)]
    pub partition: u32,
    /// Its offset in that partition.
    pub offset: u64,
    /// Its id had been produced before within the topic's dedupe window: nothing was stored,
    /// and this is where the first one went (a retry whose first attempt had succeeded).
    #[serde(default)]
    pub duplicate: bool,
}

/// One message of a batch.
#[derive(Debug, Clone, Serialize)]
pub struct Record<T> {
    /// The topic.
    pub topic: String,
    /// The content.
    pub content: T,
    /// An optional key: messages with the same key go to the same partition, the one a Kafka
    /// producer would choose.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// A partition to store it in, instead of routing by the key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
    /// An idempotency id (1–128 characters); the producer gives one when this is `None` (see
    /// [`Producer::ids`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

impl<T> Record<T> {
    /// A record without a key.
    pub fn new(topic: impl Into<String>, content: T) -> Self {
        Self {
            topic: topic.into(),
            content,
            key: None,
            partition: None,
            id: None,
        }
    }

    /// The same record with this idempotency id.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// The same record with a key.
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// The same record, for this partition.
    pub fn with_partition(mut self, partition: u32) -> Self {
        self.partition = Some(partition);
        self
    }
}

/// A batch's answer: every element's receipt (200), or, when part of it could not be stored
/// (503), the offsets of the elements that were.
#[derive(Deserialize)]
struct BatchAnswer {
    #[serde(default)]
    results: Vec<BatchResult>,
}

#[derive(Deserialize)]
struct BatchResult {
    topic: String,
    #[serde(default)]
    partition: u32,
    offset: Option<u64>,
    #[serde(default)]
    duplicate: bool,
}

/// Produces messages to a broker. Cheap to clone (clones share the connection pool).
///
/// A produce that is NACKed (the broker could not make it durable) or that cannot reach the broker
/// is retried up to [`Producer::retries`] more times with backoff (100 ms doubling). Every message
/// gets an idempotency id (unless [`Producer::ids`] turns that off), so a retry after a timeout
/// whose first attempt had succeeded stores nothing twice: the broker answers the first one's
/// position (`Receipt::duplicate`).
#[derive(Debug, Clone)]
pub struct Producer {
    conn: Conn,
    retries: u32,
    ids: Option<std::sync::Arc<IdSource>>,
}

/// Unique ids for one producer: a prefix no other producer shares, then a counter.
#[derive(Debug)]
struct IdSource {
    prefix: String,
    next: std::sync::atomic::AtomicU64,
}

impl IdSource {
    fn new() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        static PRODUCERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = PRODUCERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self {
            prefix: format!("{:x}-{nanos:x}-{n:x}", std::process::id()),
            next: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn next(&self) -> String {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{}-{n:x}", self.prefix)
    }
}

impl Producer {
    /// Sends `Authorization: Bearer <token>` (for a broker started with `--auth-token`).
    pub fn auth_token(mut self, token: Option<String>) -> Self {
        self.conn.set_token(token);
        self
    }

    /// A producer for the broker at `broker` (e.g. `http://127.0.0.1:8080`), with 3 retries and a
    /// 30 s request timeout.
    pub fn new(broker: &str) -> Result<Self, ClientError> {
        Self::with_timeout(broker, Duration::from_secs(30))
    }

    /// As [`Producer::new`] with a request timeout.
    pub fn with_timeout(broker: &str, timeout: Duration) -> Result<Self, ClientError> {
        Ok(Self {
            conn: Conn::new(broker, timeout)?,
            retries: 3,
            ids: Some(std::sync::Arc::new(IdSource::new())),
        })
    }

    /// Whether every message gets an idempotency id (default `true`).
    pub fn ids(mut self, on: bool) -> Self {
        self.ids = on.then(|| std::sync::Arc::new(IdSource::new()));
        self
    }

    fn next_id(&self) -> Option<String> {
        self.ids.as_ref().map(|s| s.next())
    }

    /// Sets how many times a NACKed or unreachable produce is retried (default 3).
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// Produces `content` to `topic`; resolves once it is durable.
    pub async fn send<T: Serialize + ?Sized>(
        &self,
        topic: &str,
        content: &T,
    ) -> Result<Receipt, ClientError> {
        self.send_keyed(topic, None, content).await
    }

    /// Produces `content` to `topic` with an optional key.
    pub async fn send_keyed<T: Serialize + ?Sized>(
        &self,
        topic: &str,
        key: Option<&str>,
        content: &T,
    ) -> Result<Receipt, ClientError> {
        let body = serde_json::to_vec(
            &serde_json::json!({"topic": topic, "key": key, "content": content, "id": self.next_id()}),
        )?;
        self.post("/mmmq/messages", body).await
    }

    /// Produces `content` to partition `partition` of `topic`.
    pub async fn send_to_partition<T: Serialize + ?Sized>(
        &self,
        topic: &str,
        partition: u32,
        key: Option<&str>,
        content: &T,
    ) -> Result<Receipt, ClientError> {
        let body = serde_json::to_vec(&serde_json::json!(
            {"topic": topic, "partition": partition, "key": key, "content": content, "id": self.next_id()}
        ))?;
        self.post("/mmmq/messages", body).await
    }

    /// Produces content that is already JSON text, byte for byte (what `mmmq produce` sends).
    pub async fn send_raw(
        &self,
        topic: &str,
        key: Option<&str>,
        json: &str,
    ) -> Result<Receipt, ClientError> {
        self.send_raw_as(topic, key, None, json).await
    }

    /// As [`Producer::send_raw`], with a chosen idempotency id (`None`: the producer's own).
    pub async fn send_raw_as(
        &self,
        topic: &str,
        key: Option<&str>,
        id: Option<&str>,
        json: &str,
    ) -> Result<Receipt, ClientError> {
        let content: &serde_json::value::RawValue = serde_json::from_str(json)?;
        let id = id.map(str::to_owned).or_else(|| self.next_id());
        let body = serde_json::to_vec(
            &serde_json::json!({"topic": topic, "key": key, "content": content, "id": id}),
        )?;
        self.post("/mmmq/messages", body).await
    }

    /// Produces a batch: validated all or nothing, each topic's share stored at consecutive
    /// offsets; receipts come back in request order.
    ///
    /// A batch over several topics can be stored in part when one topic's disk fails: the broker
    /// then says which elements were stored, and the retry sends only the others, so no element
    /// is stored twice by a NACK's retry.
    pub async fn send_batch<T: Serialize>(
        &self,
        records: &[Record<T>],
    ) -> Result<Vec<Receipt>, ClientError> {
        let mut receipts: Vec<Option<Receipt>> = vec![None; records.len()];
        // Ids are given once, before the first attempt, so every retry carries the same ones.
        // (The content is borrowed as it is: raw JSON keeps its bytes.)
        let bodies: Vec<Record<&T>> = records
            .iter()
            .map(|r| Record {
                topic: r.topic.clone(),
                content: &r.content,
                key: r.key.clone(),
                partition: r.partition,
                id: r.id.clone().or_else(|| self.next_id()),
            })
            .collect();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let pending: Vec<usize> = (0..records.len())
                .filter(|&i| receipts[i].is_none())
                .collect();
            let body =
                serde_json::to_vec(&pending.iter().map(|&i| &bodies[i]).collect::<Vec<_>>())?;
            let sent = self
                .conn
                .send(reqwest::Method::POST, "/mmmq/messages/batch", Some(body))
                .await;
            if let Ok((200 | 503, bytes)) = &sent
                && let Ok(answer) = serde_json::from_slice::<BatchAnswer>(bytes)
            {
                for (&i, r) in pending.iter().zip(answer.results) {
                    if let Some(offset) = r.offset {
                        receipts[i] = Some(Receipt {
                            topic: r.topic,
                            partition: r.partition,
                            offset,
                            duplicate: r.duplicate,
                        });
                    }
                }
            }
            let retry = match sent {
                Ok((200, _)) if receipts.iter().all(Option::is_some) => {
                    return Ok(receipts.into_iter().flatten().collect());
                }
                Ok((200, bytes)) => {
                    return Err(ClientError::Protocol(format!(
                        "a batch ACK without an offset for every message: {}",
                        String::from_utf8_lossy(&bytes)
                    )));
                }
                other => self.retryable(other, attempt)?,
            };
            if attempt > self.retries {
                return Err(retry);
            }
            tracing::debug!(attempt, error = %retry, "batch produce failed; retrying what was not stored");
            tokio::time::sleep(backoff(attempt)).await;
        }
    }

    /// The error of a failed attempt when a retry may succeed (503, unreachable), else `Err`.
    fn retryable(
        &self,
        sent: Result<(u16, axum::body::Bytes), ClientError>,
        attempt: u32,
    ) -> Result<ClientError, ClientError> {
        match sent {
            Ok((503, bytes)) => Ok(ClientError::Nacked {
                attempts: attempt,
                message: error_text(&bytes),
            }),
            Ok((status, bytes)) => Err(status_error(status, &bytes)),
            Err(ClientError::Unavailable { message, .. }) => Ok(ClientError::Unavailable {
                attempts: attempt,
                message,
            }),
            Err(other) => Err(other),
        }
    }

    async fn post<R: for<'de> Deserialize<'de>>(
        &self,
        path: &str,
        body: Vec<u8>,
    ) -> Result<R, ClientError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let retry = match self
                .conn
                .send(reqwest::Method::POST, path, Some(body.clone()))
                .await
            {
                Ok((200, bytes)) => return decode(&bytes),
                other => self.retryable(other, attempt)?,
            };
            if attempt > self.retries {
                return Err(retry);
            }
            tracing::debug!(attempt, error = %retry, "produce failed; retrying");
            tokio::time::sleep(backoff(attempt)).await;
        }
    }
}
