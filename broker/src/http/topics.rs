//! `PUT`, `GET` and `DELETE /mmmq/topics/{topic}`: thin skins over the broker's topic API
//! ([`crate::broker::Broker::put_topic`] and its neighbours).

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use mmmq_core::TopicDetail;

use super::openapi::{BodyErrors, Deleted, Errors};
use super::{ApiError, AppState};

/// The fields of a topic's configuration a `PUT` may set (any subset).
#[derive(utoipa::ToSchema)]
#[schema(rename_all = "camelCase")]
#[allow(dead_code)] // described, not built: the body is parsed by the broker's settings
pub(super) struct TopicSettings {
    /// Partitions, 1–1024; may grow, never shrink.
    partitions: Option<u32>,
    /// Delete messages older than this (whole segments); `null` keeps them forever.
    retention_ms: Option<u64>,
    /// Per partition, delete the oldest segments while more than this is stored.
    retention_bytes: Option<u64>,
    /// Never delete what a dispatcher matching the topic has not passed.
    keep_undelivered: Option<bool>,
    /// How long a produce `id` is remembered.
    dedup_window_ms: Option<u64>,
}

/// A topic configuration is a handful of fields.
const MAX_CONFIG_BYTES: usize = 64 * 1024;

fn topic_of(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    path.map(|Path(t)| t)
        .map_err(|e| ApiError::BadRequest(e.body_text()))
}

/// A topic's configuration and partitions.
#[utoipa::path(get, path = "/mmmq/topics/{topic}", tag = "topics",
    params(("topic" = String, Path, description = "The topic")),
    responses((status = 200, body = TopicDetail), Errors))]
pub(super) async fn show(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<TopicDetail>, ApiError> {
    Ok(Json(state.broker()?.topic(&topic_of(path)?)?))
}

/// Creates a topic or changes its configuration (the fields given; partitions only grow).
#[utoipa::path(put, path = "/mmmq/topics/{topic}", tag = "topics",
    params(("topic" = String, Path, description = "The topic")),
    request_body = TopicSettings,
    responses((status = 200, body = TopicDetail), Errors, BodyErrors))]
#[tracing::instrument(skip_all, fields(topic))]
pub(super) async fn put(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    body: axum::body::Body,
) -> Result<Json<TopicDetail>, ApiError> {
    let broker = state.broker()?;
    let topic = topic_of(path)?;
    tracing::Span::current().record("topic", topic.as_str());
    let bytes = state.read_body(body, MAX_CONFIG_BYTES).await?;
    Ok(Json(broker.put_topic(&topic, &bytes).await?))
}

/// Deletes a topic: its dispatchers stop, its files and checkpoints go.
#[utoipa::path(delete, path = "/mmmq/topics/{topic}", tag = "topics",
    params(("topic" = String, Path, description = "The topic")),
    responses((status = 200, body = Deleted), Errors))]
#[tracing::instrument(skip_all, fields(topic))]
pub(super) async fn delete(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let broker = state.broker()?;
    let topic = topic_of(path)?;
    tracing::Span::current().record("topic", topic.as_str());
    broker.delete_topic(&topic).await?;
    Ok(Json(serde_json::json!({ "deleted": topic })))
}
