//! Pull consumer groups over HTTP (README, "Consumer groups"): thin skins over
//! [`crate::groups::Groups`].

use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use mmmq_core::{GroupPoll, GroupStatus};
use serde::Deserialize;

use super::{ApiError, AppState, parse_json, read_json_body};
use crate::broker::MAX_PULL_WAIT;
use crate::groups::DEFAULT_SESSION_TIMEOUT;

fn path<T>(p: Result<Path<T>, PathRejection>) -> Result<T, ApiError> {
    p.map(|Path(t)| t)
        .map_err(|e| ApiError::BadRequest(e.body_text()))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct PollQuery {
    member: String,
    pattern: String,
    max: Option<usize>,
    wait_ms: Option<u64>,
    session_timeout_ms: Option<u64>,
}

pub(super) async fn poll(
    State(state): State<AppState>,
    group: Result<Path<String>, PathRejection>,
    query: Result<Query<PollQuery>, QueryRejection>,
) -> Result<Json<GroupPoll>, ApiError> {
    let broker = state.broker()?;
    let group = path(group)?;
    let Query(q) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let session = q
        .session_timeout_ms
        .map_or(DEFAULT_SESSION_TIMEOUT, Duration::from_millis);
    if !(Duration::from_millis(100)..=Duration::from_secs(3600)).contains(&session) {
        return Err(ApiError::BadRequest(
            "sessionTimeoutMs must be 100 to 3600000".into(),
        ));
    }
    let wait = Duration::from_millis(q.wait_ms.unwrap_or(0)).min(MAX_PULL_WAIT);
    let limits = (q.max.unwrap_or(100), wait, session);
    let answer = broker
        .groups()
        .poll(&group, &q.member, &q.pattern, limits, &state.stopping)
        .await?;
    Ok(Json(answer))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CommitRequest {
    member: String,
    offsets: Vec<CommitOffset>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CommitOffset {
    topic: String,
    partition: u32,
    offset: u64,
}

pub(super) async fn commit(
    State(state): State<AppState>,
    group: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Json<serde_json::Value>, ApiError> {
    let broker = state.broker()?;
    let group = path(group)?;
    let bytes = read_json_body(&headers, body, 1 << 20).await?;
    let req: CommitRequest = parse_json(&bytes)?;
    let offsets = req
        .offsets
        .into_iter()
        .map(|o| (o.topic, o.partition, o.offset))
        .collect();
    broker.groups().commit(&group, &req.member, offsets).await?;
    Ok(Json(serde_json::json!({"committed": true})))
}

pub(super) async fn leave(
    State(state): State<AppState>,
    p: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let (group, member) = path(p)?;
    state.broker()?.groups().leave(&group, &member)?;
    Ok(Json(serde_json::json!({"left": member})))
}

pub(super) async fn list(
    State(state): State<AppState>,
) -> Result<Json<Vec<GroupStatus>>, ApiError> {
    Ok(Json(state.broker()?.groups().list()))
}

pub(super) async fn show(
    State(state): State<AppState>,
    group: Result<Path<String>, PathRejection>,
) -> Result<Json<GroupStatus>, ApiError> {
    let group = path(group)?;
    Ok(Json(state.broker()?.groups().status(&group)?))
}
