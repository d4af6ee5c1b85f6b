//! `GET /mmmq/topics` and the pull API `GET /mmmq/topics/{topic}/messages`.

use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use mmmq_core::{Envelope, StoredMessage, Topic};
use serde::{Deserialize, Serialize};

use super::{ApiError, AppState};

const DEFAULT_MAX: usize = 100;
const MAX_MAX: usize = 1000;
const MAX_WAIT_MS: u64 = 30_000;
/// Payload bytes one pull answer carries at most (at least one message is always returned).
const MAX_PULL_BYTES: usize = 8 << 20;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct TopicInfo {
    name: String,
    next_offset: u64,
    segments: usize,
    bytes: u64,
}

pub(super) async fn topics(
    State(state): State<AppState>,
) -> Result<Json<Vec<TopicInfo>>, ApiError> {
    let broker = state.broker()?;
    Ok(Json(
        broker
            .registry()
            .all()
            .into_iter()
            .map(|t| {
                let s = t.log.stats();
                TopicInfo {
                    name: t.topic.to_string(),
                    next_offset: s.next_offset,
                    segments: s.segments,
                    bytes: s.bytes,
                }
            })
            .collect(),
    ))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct PullQuery {
    from: Option<u64>,
    max: Option<usize>,
    wait_ms: Option<u64>,
}

#[derive(Serialize)]
pub(super) struct PullAnswer {
    messages: Vec<Envelope>,
    next: u64,
}

#[tracing::instrument(skip_all, fields(topic))]
pub(super) async fn pull(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<PullQuery>, QueryRejection>,
) -> Result<Json<PullAnswer>, ApiError> {
    let broker = state.broker()?;
    let Path(name) = path.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let Query(q) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let topic = Topic::new(name).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    tracing::Span::current().record("topic", topic.as_str());
    let t = broker
        .registry()
        .get(&topic)
        .ok_or_else(|| ApiError::NotFound(format!("no topic {:?}", topic.as_str())))?;
    let max = q.max.unwrap_or(DEFAULT_MAX).clamp(1, MAX_MAX);
    let wait = Duration::from_millis(q.wait_ms.unwrap_or(0).min(MAX_WAIT_MS));
    let from = q.from.unwrap_or(0).max(t.log.first_offset());
    if from >= t.log.next_offset() && !wait.is_zero() {
        tokio::select! {
            _ = t.log.wait_for(from) => {}
            _ = tokio::time::sleep(wait) => {}
            _ = state.stopping.cancelled() => {}
        }
    }
    let log = t.log.clone();
    let entries = tokio::task::spawn_blocking(move || log.read_from(from, max, MAX_PULL_BYTES))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let next = entries.last().map_or(from, |e| e.offset + 1);
    let mut messages = Vec::with_capacity(entries.len());
    for e in entries {
        // A corrupt entry is left out; the gap in offsets shows it.
        let Ok(bytes) = e.payload else { continue };
        if let Ok(msg) = StoredMessage::from_payload(&bytes) {
            messages.push(msg.into_envelope(topic.clone(), e.offset));
        }
    }
    Ok(Json(PullAnswer { messages, next }))
}
