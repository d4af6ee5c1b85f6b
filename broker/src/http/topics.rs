//! `PUT`, `GET` and `DELETE /mmmq/topics/{topic}`: thin skins over the broker's topic API
//! ([`crate::broker::Broker::put_topic`] and its neighbours).

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use mmmq_core::TopicDetail;

use super::{ApiError, AppState, read_json_body};

/// A topic configuration is a handful of fields.
const MAX_CONFIG_BYTES: usize = 64 * 1024;

fn topic_of(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    path.map(|Path(t)| t)
        .map_err(|e| ApiError::BadRequest(e.body_text()))
}

pub(super) async fn show(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<TopicDetail>, ApiError> {
    Ok(Json(state.broker()?.topic(&topic_of(path)?)?))
}

#[tracing::instrument(skip_all, fields(topic))]
pub(super) async fn put(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Json<TopicDetail>, ApiError> {
    let broker = state.broker()?;
    let topic = topic_of(path)?;
    tracing::Span::current().record("topic", topic.as_str());
    let bytes = read_json_body(&headers, body, MAX_CONFIG_BYTES).await?;
    Ok(Json(broker.put_topic(&topic, &bytes).await?))
}

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
