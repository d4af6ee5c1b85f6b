//! The remote HTTP consumer target (docs/dispatchers.md, "Dispatchers"): POST the envelope (or, with
//! `batchMaxMessages` > 1, an array of them) and read `{"ack":"ACK"|"NACK"}`.

use std::time::Duration;

use bytes::Bytes;
use mmmq_core::{Ack, error_chain};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::config::HostSpec;
use crate::dispatch::target::{
    BoxFuture, Delivery, Outcome, RunAnswer, Target, TargetError, TargetStatus,
};

/// A remote HTTP consumer: POST to `{protocol}://{address}:{port}/mmmq/messages`, expect
/// `200 {"ack":"ACK"|"NACK"}`.
pub struct HttpTarget {
    client: reqwest::Client,
    url: String,
    auth_token: Option<String>,
    /// `batchMaxMessages` > 1: every body is a JSON array, even of one envelope (docs/dispatchers.md,
    /// "Remote consumers"), so a consumer that was told to expect batches never sees a bare envelope.
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
            Err(e) => return Outcome::Failed(TargetError::Unreachable(error_chain(&e))),
        };
        let status = response.status();
        if status != reqwest::StatusCode::OK {
            return Outcome::Failed(TargetError::BadAnswer(format!(
                "{} answered HTTP {status}",
                self.url
            )));
        }
        match response.bytes().await {
            Ok(body) => match serde_json::from_slice::<ConsumerAnswer>(&body) {
                Ok(ConsumerAnswer { ack: Ack::Ack }) => Outcome::Ack,
                Ok(ConsumerAnswer { ack: Ack::Nack }) => {
                    Outcome::Nack(format!("{} answered NACK", self.url))
                }
                Err(_) => Outcome::Failed(TargetError::BadAnswer(format!(
                    "{} answered 200 with a body that is not {{\"ack\":\"ACK\"|\"NACK\"}}: {:?}",
                    self.url,
                    String::from_utf8_lossy(&body[..body.len().min(200)])
                ))),
            },
            Err(e) => Outcome::Failed(TargetError::Unreachable(error_chain(&e))),
        }
    }
}

impl Target for HttpTarget {
    /// One request for the whole batch; a stop lets it finish (it is bounded by `timeoutMs`), so
    /// a consumer's ACK is never lost to a shutdown.
    fn deliver_run<'a>(
        &'a self,
        batch: &'a [Delivery],
        _stop: &'a CancellationToken,
    ) -> BoxFuture<'a, RunAnswer> {
        let body = match batch {
            [one] if !self.arrays => serde_json::to_vec(&one.envelope),
            many => serde_json::to_vec(&many.iter().map(|d| &d.envelope).collect::<Vec<_>>()),
        }
        .expect("envelopes always encode");
        Box::pin(async move {
            match self.post(Bytes::from(body)).await {
                Outcome::Ack => RunAnswer::all(batch.len()),
                other => RunAnswer::stopped(0, other),
            }
        })
    }

    fn status(&self) -> TargetStatus {
        TargetStatus::Host {
            url: self.url.clone(),
        }
    }
}
