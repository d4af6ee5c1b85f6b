//! `GET /mmmq/topics` and the pull API `GET /mmmq/topics/{topic}/messages`: thin skins over
//! [`crate::broker::Broker::topics`] and [`crate::broker::Broker::pull`].

use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::IntoResponse;
use mmmq_core::{PullPage, TopicInfo};
use serde::Deserialize;

use super::openapi::Errors;
use super::{ApiError, AppState};

/// Messages a pull answers when `max` is not given.
const DEFAULT_MAX: usize = 100;

/// Every topic.
#[utoipa::path(get, path = "/mmmq/topics", tag = "topics",
    responses((status = 200, body = Vec<TopicInfo>), Errors))]
pub(super) async fn topics(
    State(state): State<AppState>,
) -> Result<Json<Vec<TopicInfo>>, ApiError> {
    Ok(Json(state.broker()?.topics()))
}

/// Where and how much to pull.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub(super) struct PullQuery {
    /// The partition (default 0).
    partition: Option<u32>,
    /// The first offset (default 0).
    from: Option<u64>,
    /// At most this many messages, 1–1000 (default 100).
    max: Option<usize>,
    /// When nothing is at `from`, wait up to this long (≤ 30000) for it.
    wait_ms: Option<u64>,
}

/// Messages of a partition from an offset, long-polling when there are none yet.
#[utoipa::path(get, path = "/mmmq/topics/{topic}/messages", tag = "topics",
    params(("topic" = String, Path, description = "The topic"), PullQuery),
    responses((status = 200, body = PullPage), Errors))]
#[tracing::instrument(skip_all, fields(topic))]
pub(super) async fn pull(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    uri: axum::http::Uri,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<PullQuery>, QueryRejection>,
) -> Result<axum::response::Response, ApiError> {
    let broker = state.broker()?;
    let Path(topic) = path.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let Query(q) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    tracing::Span::current().record("topic", topic.as_str());
    let partition = q.partition.unwrap_or(0);
    if let Some(answer) = super::forward::to_leader(
        broker,
        &headers,
        &uri,
        (&topic, partition),
        state.request_timeout,
    )
    .await?
    {
        return Ok(answer);
    }
    let page = broker
        .pull(
            &topic,
            q.partition.unwrap_or(0),
            q.from.unwrap_or(0),
            q.max.unwrap_or(DEFAULT_MAX),
            Duration::from_millis(q.wait_ms.unwrap_or(0)),
            &state.stopping,
        )
        .await?;
    Ok(Json(page).into_response())
}
