//! `GET /mmmq/topics` and the pull API `GET /mmmq/topics/{topic}/messages`: thin skins over
//! [`crate::broker::Broker::topics`] and [`crate::broker::Broker::pull`].

use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use mmmq_core::{PullPage, TopicInfo};
use serde::Deserialize;

use super::{ApiError, AppState};

/// Messages a pull answers when `max` is not given.
const DEFAULT_MAX: usize = 100;

pub(super) async fn topics(
    State(state): State<AppState>,
) -> Result<Json<Vec<TopicInfo>>, ApiError> {
    Ok(Json(state.broker()?.topics()))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct PullQuery {
    partition: Option<u32>,
    from: Option<u64>,
    max: Option<usize>,
    wait_ms: Option<u64>,
}

#[tracing::instrument(skip_all, fields(topic))]
pub(super) async fn pull(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<PullQuery>, QueryRejection>,
) -> Result<Json<PullPage>, ApiError> {
    let broker = state.broker()?;
    let Path(topic) = path.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let Query(q) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    tracing::Span::current().record("topic", topic.as_str());
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
    Ok(Json(page))
}
