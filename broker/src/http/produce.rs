//! `POST /mmmq/messages` and `POST /mmmq/messages/batch`.

use axum::Json;
use axum::extract::State;
use mmmq_core::{Ack, Topic};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::openapi::{BodyErrors, Errors};
use super::{ApiError, AppState, parse_json};
use crate::broker::BrokerError;
use crate::config::BATCH_BODY_FACTOR;
use crate::produce::{ProduceError, ProduceItem};

/// One message to produce.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ProduceRequest {
    /// The topic (created by its first message).
    topic: String,
    /// Any JSON value.
    #[schema(value_type = serde_json::Value)]
    content: Box<RawValue>,
    /// Routes it to a partition as Kafka's partitioner would, and orders it per key.
    #[serde(default)]
    key: Option<String>,
    /// A partition instead of routing by key.
    #[serde(default)]
    partition: Option<u32>,
    /// An idempotency id: a second produce of it within the topic's `dedupWindowMs` stores
    /// nothing and answers the first one's position with `duplicate: true`.
    #[serde(default)]
    id: Option<String>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A stored message.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct ProduceAck {
    ack: Ack,
    topic: Topic,
    partition: u32,
    offset: u64,
    #[serde(skip_serializing_if = "is_false")]
    duplicate: bool,
}

/// Where one message of a batch was stored.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct BatchResult {
    topic: Topic,
    partition: u32,
    offset: u64,
    #[serde(skip_serializing_if = "is_false")]
    duplicate: bool,
}

/// A stored batch.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct BatchAck {
    ack: Ack,
    results: Vec<BatchResult>,
}

/// Parses and checks the body of `POST /mmmq/messages`, as the handler does (public for the fuzz
/// targets): what it accepts is exactly what reaches storage.
pub fn parse_message(body: &[u8], max_content: usize) -> Result<ProduceItem, ApiError> {
    let req: ProduceRequest = parse_json(body)?;
    validate(req, max_content).map_err(|e| refused(e, ""))
}

/// Parses and checks the body of `POST /mmmq/messages/batch`: every element or none.
pub fn parse_batch(body: &[u8], max_content: usize) -> Result<Vec<ProduceItem>, ApiError> {
    let reqs: Vec<ProduceRequest> = parse_json(body)?;
    if reqs.is_empty() {
        return Err(ApiError::BadRequest("the batch is empty".into()));
    }
    reqs.into_iter()
        .enumerate()
        .map(|(i, r)| validate(r, max_content).map_err(|e| refused(e, &format!("element {i}: "))))
        .collect()
}

fn validate(req: ProduceRequest, max_content: usize) -> Result<ProduceItem, ProduceError> {
    ProduceItem::new(req.topic, req.key, req.content, max_content)
        .and_then(|item| item.with_partition(req.partition).with_id(req.id))
}

/// `413` for content over the limit (as for any body too large), `400` for the rest.
fn refused(e: ProduceError, context: &str) -> ApiError {
    let reason = format!("{context}{e}");
    match e {
        ProduceError::ContentTooLarge { .. } => ApiError::TooLarge(reason),
        _ => ApiError::BadRequest(reason),
    }
}

/// Stores one message durably (acknowledged once it survives a power cut).
#[utoipa::path(post, path = "/mmmq/messages", tag = "produce",
    request_body = ProduceRequest,
    responses((status = 200, body = ProduceAck), Errors, BodyErrors))]
#[tracing::instrument(level = "debug", skip_all)]
pub(super) async fn produce(
    State(state): State<AppState>,
    body: axum::body::Body,
) -> Result<Json<ProduceAck>, ApiError> {
    let broker = state.broker()?;
    let bytes = state.read_body(body, state.max_body_bytes).await?;
    let item = parse_message(&bytes, state.max_body_bytes)?;
    let topic = item.topic().clone();
    let at = broker.produce(item).await?;
    Ok(Json(ProduceAck {
        ack: Ack::Ack,
        topic,
        partition: at.partition,
        offset: at.offset,
        duplicate: at.duplicate,
    }))
}

/// Stores an array of messages, each partition's share in one commit.
#[utoipa::path(post, path = "/mmmq/messages/batch", tag = "produce",
    request_body = Vec<ProduceRequest>,
    responses((status = 200, body = BatchAck), Errors, BodyErrors))]
#[tracing::instrument(level = "debug", skip_all)]
pub(super) async fn produce_batch(
    State(state): State<AppState>,
    body: axum::body::Body,
) -> Result<Json<BatchAck>, ApiError> {
    let broker = state.broker()?;
    let limit = state.max_body_bytes.saturating_mul(BATCH_BODY_FACTOR);
    let bytes = state.read_body(body, limit).await?;
    // All or nothing: every element is checked before anything is appended.
    let items = parse_batch(&bytes, state.max_body_bytes)?;
    let topics: Vec<Topic> = items.iter().map(|i| i.topic().clone()).collect();
    let produced = match broker.produce_batch(items).await {
        Ok(produced) => produced,
        Err(BrokerError::PartialBatch { error, stored }) => {
            let n = stored.iter().flatten().count();
            let results = topics
                .iter()
                .zip(&stored)
                .map(|(topic, at)| match at {
                    Some(at) => serde_json::json!({"topic": topic, "partition": at.partition,
                        "offset": at.offset, "ack": Ack::Ack}),
                    None => serde_json::json!({"topic": topic, "ack": Ack::Nack}),
                })
                .collect();
            return Err(ApiError::PartialBatch {
                error: format!(
                    "{error}; {n} of {} messages were stored (see results: retry only the NACKed ones)",
                    stored.len()
                ),
                results,
            });
        }
        Err(e) => return Err(e.into()),
    };
    Ok(Json(BatchAck {
        ack: Ack::Ack,
        results: topics
            .into_iter()
            .zip(produced)
            .map(|(topic, at)| BatchResult {
                topic,
                partition: at.partition,
                offset: at.offset,
                duplicate: at.duplicate,
            })
            .collect(),
    }))
}
