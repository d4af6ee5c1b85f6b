//! Pull consumer groups over HTTP (docs/topics-and-groups.md, "Consumer groups"): thin skins over
//! [`crate::groups::Groups`].

use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Uri};
use axum::response::{IntoResponse, Response};
use mmmq_core::{GroupPoll, GroupStatus};
use serde::Deserialize;

use super::forward::to_coordinator;
use super::openapi::{BodyErrors, Committed, ErrorBody, Errors, Left};
use super::{ApiError, AppState, parse_json};
use crate::broker::MAX_PULL_WAIT;
use crate::groups::DEFAULT_SESSION_TIMEOUT;

/// How long a group call forwarded to the coordinator may take beyond its own wait (contract
/// §13: any broker answers; docs/cluster.md, "Pull groups in a cluster").
const FORWARD_SLACK: Duration = Duration::from_secs(10);

fn path<T>(p: Result<Path<T>, PathRejection>) -> Result<T, ApiError> {
    p.map(|Path(t)| t)
        .map_err(|e| ApiError::BadRequest(e.body_text()))
}

/// Who polls, for which topics, how much.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub(super) struct PollQuery {
    /// The member's id (joins the group on its first poll).
    member: String,
    /// The topics, as a pattern (`orders.*`, `**`).
    pattern: String,
    /// At most this many messages (default 100).
    max: Option<usize>,
    /// When nothing is there, wait up to this long (≤ 30000) for it.
    wait_ms: Option<u64>,
    /// A member not heard from for this long leaves (default 30000).
    session_timeout_ms: Option<u64>,
}

/// Messages of the partitions the group gives this member.
#[utoipa::path(get, path = "/mmmq/groups/{group}/messages", tag = "groups",
    params(("group" = String, Path, description = "The group"), PollQuery),
    responses((status = 200, body = GroupPoll), Errors))]
pub(super) async fn poll(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    group: Result<Path<String>, PathRejection>,
    query: Result<Query<PollQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
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
    let hop = (reqwest::Method::GET, &uri);
    if let Some(answer) = to_coordinator(broker, &headers, hop, None, wait + FORWARD_SLACK).await? {
        return Ok(answer);
    }
    let limits = (q.max.unwrap_or(100), wait, session);
    let answer = broker
        .groups()
        .poll(&group, &q.member, &q.pattern, limits, &state.stopping)
        .await?;
    Ok(Json(answer).into_response())
}

/// A member's positions.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CommitRequest {
    /// The member.
    member: String,
    /// The next offset to read, per partition it owns.
    offsets: Vec<CommitOffset>,
}

/// The next offset to read of one partition.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CommitOffset {
    /// The topic.
    topic: String,
    /// The partition.
    partition: u32,
    /// The next offset to read.
    offset: u64,
    /// The topic's incarnation the offset is of (from the poll's assignment or envelopes):
    /// refused with `409` once the topic was deleted and created again.
    #[serde(rename = "topicId", default)]
    #[schema(value_type = Option<String>)]
    topic_id: Option<mmmq_core::TopicId>,
}

/// Commits a member's positions (`409` for a partition it does not own).
#[utoipa::path(post, path = "/mmmq/groups/{group}/commit", tag = "groups",
    params(("group" = String, Path, description = "The group")),
    request_body = CommitRequest,
    responses((status = 200, body = Committed), (status = 409, description = "Not the partition's owner", body = ErrorBody), Errors, BodyErrors))]
pub(super) async fn commit(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    group: Result<Path<String>, PathRejection>,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let broker = state.broker()?;
    let group = path(group)?;
    let bytes = state.read_body(body, 1 << 20).await?;
    let hop = (reqwest::Method::POST, &uri);
    if let Some(answer) = to_coordinator(
        broker,
        &headers,
        hop,
        Some(bytes.to_vec().into()),
        FORWARD_SLACK,
    )
    .await?
    {
        return Ok(answer);
    }
    let req: CommitRequest = parse_json(&bytes)?;
    let offsets = req
        .offsets
        .into_iter()
        .map(|o| (o.topic, o.topic_id, o.partition, o.offset))
        .collect();
    broker.groups().commit(&group, &req.member, offsets).await?;
    Ok(Json(serde_json::json!({"committed": true})).into_response())
}

/// A member leaves its group at once.
#[utoipa::path(delete, path = "/mmmq/groups/{group}/members/{member}", tag = "groups",
    params(("group" = String, Path, description = "The group"), ("member" = String, Path, description = "The member")),
    responses((status = 200, body = Left), Errors))]
pub(super) async fn leave(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    p: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let (group, member) = path(p)?;
    let broker = state.broker()?;
    let hop = (reqwest::Method::DELETE, &uri);
    if let Some(answer) = to_coordinator(broker, &headers, hop, None, FORWARD_SLACK).await? {
        return Ok(answer);
    }
    broker.groups().leave(&group, &member)?;
    Ok(Json(serde_json::json!({"left": member})).into_response())
}

/// A page of the group list.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct ListQuery {
    /// Groups after this name (the last one of the previous page).
    after: Option<String>,
    /// At most this many groups (default 100, at most 1000); a page also ends once it holds
    /// 10,000 partitions.
    limit: Option<usize>,
}

/// The groups, by name, a page at a time: a `Link: <…?after=NAME&limit=N>; rel="next"` header
/// names the next page while there is one.
#[utoipa::path(get, path = "/mmmq/groups", tag = "groups", params(ListQuery),
    responses((status = 200, body = Vec<GroupStatus>,
        headers(("Link" = String, description = "`<…>; rel=\"next\"` while more groups follow"))), Errors))]
pub(super) async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<axum::response::Response, ApiError> {
    let hop = (reqwest::Method::GET, &uri);
    if let Some(answer) =
        to_coordinator(state.broker()?, &headers, hop, None, FORWARD_SLACK).await?
    {
        return Ok(answer);
    }
    let Query(q) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::BadRequest("limit must be 1 to 1000".into()));
    }
    let (page, more) = state
        .broker()?
        .groups()
        .list(q.after.as_deref(), limit)
        .await;
    let next = match page.last() {
        // Group names are `[A-Za-z0-9._-]`: nothing to escape in the query.
        Some(last) if more => Some(format!(
            "</mmmq/groups?after={}&limit={limit}>; rel=\"next\"",
            last.group
        )),
        _ => None,
    };
    let mut response = Json(page).into_response();
    if let Some(link) = next.and_then(|l| axum::http::HeaderValue::from_str(&l).ok()) {
        response
            .headers_mut()
            .insert(axum::http::header::LINK, link);
    }
    Ok(response)
}

/// A group: members, partitions, lag.
#[utoipa::path(get, path = "/mmmq/groups/{group}", tag = "groups",
    params(("group" = String, Path, description = "The group")),
    responses((status = 200, body = GroupStatus), Errors))]
pub(super) async fn show(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    group: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let group = path(group)?;
    let broker = state.broker()?;
    let hop = (reqwest::Method::GET, &uri);
    if let Some(answer) = to_coordinator(broker, &headers, hop, None, FORWARD_SLACK).await? {
        return Ok(answer);
    }
    match broker.groups().status(&group).await {
        Ok(status) => Ok(Json(status).into_response()),
        Err(e) => match broker.groups().kafka_status(&group).await {
            Some(status) => Ok(Json(status).into_response()),
            None => Err(e.into()),
        },
    }
}
