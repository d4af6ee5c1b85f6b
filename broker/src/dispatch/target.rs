//! Where a dispatcher delivers: one trait, one implementation per kind of target. The drain
//! worker owns ordering, retries, dead letters and checkpoints; a target only answers "what did the
//! consumer say to these messages".

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use mmmq_core::{Ack, Envelope};
use serde::{Deserialize, Serialize};

use crate::config::HostSpec;

/// A boxed future, so that targets can be trait objects.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One message on its way out. Targets encode it as they need (only the HTTP target needs JSON,
/// so plugins and in-process handlers never pay for an encoding).
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The message.
    pub envelope: Envelope,
}

impl Delivery {
    /// Wraps an envelope.
    pub fn new(envelope: Envelope) -> Self {
        Self { envelope }
    }
}

/// What came back from one delivery attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The consumer is done with the message(s).
    Ack,
    /// The consumer refused; the reason is recorded with the dead letter.
    Nack(String),
    /// No usable answer (connection error, timeout, bad status, unreadable body): retried with
    /// backoff, forever.
    Failed(String),
}

/// What `GET /mmmq/dispatchers` shows of a target.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum TargetStatus {
    /// A remote consumer.
    Host {
        /// Where it POSTs.
        url: String,
    },
    /// A Rust handler inside the embedding application.
    InProcess,
    /// A WebAssembly component.
    Plugin {
        /// The component file.
        path: String,
        /// Hash of the version serving now.
        version: Option<String>,
        /// Why the newest file is not serving, if it is not.
        #[serde(rename = "loadError")]
        load_error: Option<String>,
    },
}

/// A way to deliver.
pub trait Target: Send + Sync {
    /// Delivers `batch` in order and reports how many messages were ACKed and, if not all were,
    /// the outcome of the next one. A target that takes the batch as one request (HTTP) answers all
    /// or nothing; one that answers per message stops at the first message not ACKed.
    fn deliver_prefix<'a>(
        &'a self,
        batch: &'a [Delivery],
    ) -> BoxFuture<'a, (usize, Option<Outcome>)>;
    /// For status.
    fn status(&self) -> TargetStatus;
    /// Whether a NACK from [`Target::deliver_prefix`] is the answer of that one message (true), or
    /// of the whole batch (false: the worker then delivers the batch one message at a time).
    /// Targets that answer per message also get long runs, whatever `batchMaxMessages` says.
    fn answers_per_message(&self) -> bool {
        false
    }
    /// Delivers `batch` and reports the first answer that is not an ACK (or ACK).
    fn deliver<'a>(&'a self, batch: &'a [Delivery]) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            match self.deliver_prefix(batch).await {
                (_, Some(outcome)) => outcome,
                (_, None) => Outcome::Ack,
            }
        })
    }
    /// Re-reads what the target is made of (a plugin's file); `Ok(true)` when that changed it.
    fn reload(&self) -> BoxFuture<'_, Result<bool, String>> {
        Box::pin(async { Ok(false) })
    }
}

/// A remote HTTP consumer (contract §3): POST the envelope (or an array of them) to
/// `{protocol}://{address}:{port}/mmmq/messages`, expect `200 {"ack":"ACK"|"NACK"}`.
pub struct HttpTarget {
    client: reqwest::Client,
    url: String,
    auth_token: Option<String>,
    /// `batchMaxMessages` > 1: every body is a JSON array, even of one envelope (README, "Remote
    /// HTTP consumers"), so a consumer that was told to expect batches never sees a bare envelope.
    arrays: bool,
}

#[derive(Deserialize)]
struct ConsumerAnswer {
    ack: Ack,
}

impl HttpTarget {
    /// A client with its own connection pool and the spec's timeout. `arrays`: the dispatcher
    /// batches (`batchMaxMessages` > 1), so every body is an array.
    pub fn new(spec: &HostSpec, arrays: bool) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(spec.timeout)
            .connect_timeout(spec.timeout.min(Duration::from_secs(10)))
            .pool_idle_timeout(Duration::from_secs(60))
            .build()?;
        Ok(Self {
            client,
            url: spec.url(),
            auth_token: spec.auth_token.clone(),
            arrays,
        })
    }

    async fn post(&self, body: Bytes) -> Outcome {
        let mut request = self
            .client
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(token) = &self.auth_token {
            request = request.bearer_auth(token);
        }
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => return Outcome::Failed(mmmq_client::error_chain(&e)),
        };
        let status = response.status();
        if status != reqwest::StatusCode::OK {
            return Outcome::Failed(format!("{} answered HTTP {status}", self.url));
        }
        match response.bytes().await {
            Ok(body) => match serde_json::from_slice::<ConsumerAnswer>(&body) {
                Ok(ConsumerAnswer { ack: Ack::Ack }) => Outcome::Ack,
                Ok(ConsumerAnswer { ack: Ack::Nack }) => {
                    Outcome::Nack(format!("{} answered NACK", self.url))
                }
                Err(_) => Outcome::Failed(format!(
                    "{} answered 200 with a body that is not {{\"ack\":\"ACK\"|\"NACK\"}}: {:?}",
                    self.url,
                    String::from_utf8_lossy(&body[..body.len().min(200)])
                )),
            },
            Err(e) => Outcome::Failed(mmmq_client::error_chain(&e)),
        }
    }
}

impl Target for HttpTarget {
    fn deliver_prefix<'a>(
        &'a self,
        batch: &'a [Delivery],
    ) -> BoxFuture<'a, (usize, Option<Outcome>)> {
        let body = match batch {
            [one] if !self.arrays => serde_json::to_vec(&one.envelope),
            many => serde_json::to_vec(&many.iter().map(|d| &d.envelope).collect::<Vec<_>>()),
        }
        .expect("envelopes always encode");
        Box::pin(async move {
            match self.post(Bytes::from(body)).await {
                Outcome::Ack => (batch.len(), None),
                other => (0, Some(other)),
            }
        })
    }

    fn status(&self) -> TargetStatus {
        TargetStatus::Host {
            url: self.url.clone(),
        }
    }
}
