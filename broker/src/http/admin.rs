//! Dispatcher status, reload, dead-letter redrive, health and metrics.

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::IntoResponse;
use mmmq_core::RedriveStatus;

use super::openapi::{BodyErrors, ErrorBody, Errors, Health};
use super::{ApiError, AppState, parse_json};
use crate::broker::BrokerError;
use crate::dispatch::redrive::RedriveError;
use crate::dispatch::{DispatcherStatus, ReloadReport};

/// `?local=true`: in a cluster, this broker's own status only (what brokers ask each other).
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct StatusQuery {
    /// Only what this broker delivers, without asking the others.
    #[serde(default)]
    local: bool,
}

/// Every dispatcher: target, counts, lag and errors, per topic and partition (in a cluster,
/// each partition as the broker that delivers it reports it).
#[utoipa::path(get, path = "/mmmq/dispatchers", tag = "dispatchers", params(StatusQuery),
    responses((status = 200, body = Vec<DispatcherStatus>), Errors))]
pub(super) async fn dispatchers(
    State(state): State<AppState>,
    query: Result<axum::extract::Query<StatusQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<DispatcherStatus>>, ApiError> {
    let axum::extract::Query(q) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let broker = state.broker()?;
    Ok(Json(if q.local {
        broker.local_dispatchers().await
    } else {
        broker.dispatchers().await
    }))
}

/// Re-reads `dispatchers.json` and the plugin files (a bad file: `400`, the running ones stay).
#[utoipa::path(post, path = "/mmmq/admin/reload", tag = "dispatchers",
    responses((status = 200, body = ReloadReport), Errors))]
pub(super) async fn reload(State(state): State<AppState>) -> Result<Json<ReloadReport>, ApiError> {
    match state.broker()?.reload().await {
        Ok(report) => Ok(Json(report)),
        // A bad file or a target that cannot be built: the caller's configuration is at fault.
        Err(e @ (BrokerError::Config(_) | BrokerError::Dispatch(_))) => {
            tracing::warn!(error = %e, "reload refused; the running configuration stays");
            Err(ApiError::BadRequest(e.to_string()))
        }
        Err(e) => Err(e.into()),
    }
}

/// Which dead letters to redrive (an empty body: from where the last redrive stopped to the end).
#[derive(serde::Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RedriveRequest {
    /// The first dead-letter offset.
    from: Option<u64>,
    /// The offset after the last.
    to: Option<u64>,
}

/// `POST /mmmq/dispatchers/{consumerId}/redrive` `{"from"?, "to"?}` (an empty body: all not
/// yet redriven).
/// Starts delivering a dispatcher's dead letters again (`409` while one runs).
#[utoipa::path(post, path = "/mmmq/dispatchers/{consumerId}/redrive", tag = "dispatchers",
    params(("consumerId" = String, Path, description = "The dispatcher's consumerId")),
    request_body(content = Option<RedriveRequest>),
    responses((status = 200, body = RedriveStatus), (status = 409, description = "A redrive is running", body = ErrorBody), Errors, BodyErrors))]
pub(super) async fn redrive(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    headers: axum::http::HeaderMap,
    uri: axum::http::Uri,
    body: axum::body::Body,
) -> Result<axum::response::Response, ApiError> {
    let broker = state.broker()?;
    let Path(id) = id.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let bytes = state.read_body(body, 64 << 10).await?;
    // In a cluster the dead letters are delivered again by their partition's leader
    // (docs/cluster.md, "Delivery in a cluster").
    if let Ok(consumer) = mmmq_core::ConsumerId::new(&id) {
        let dlq = mmmq_core::Topic::dead_letter(&consumer);
        if let Some(answer) = super::forward::to_leader_with(
            broker,
            &headers,
            (reqwest::Method::POST, &uri),
            Some(bytes::Bytes::copy_from_slice(&bytes)),
            (dlq.as_str(), 0),
            state.request_timeout,
        )
        .await?
        {
            return Ok(answer);
        }
    }
    let req: RedriveRequest = if bytes.iter().all(u8::is_ascii_whitespace) {
        RedriveRequest::default()
    } else {
        parse_json(&bytes)?
    };
    match broker.redrive(&id, req.from, req.to).await {
        Ok(status) => Ok(Json(status).into_response()),
        Err(e @ RedriveError::UnknownDispatcher(_)) => Err(ApiError::NotFound(e.to_string())),
        Err(e @ (RedriveError::BadRange { .. } | RedriveError::PastEnd { .. })) => {
            Err(ApiError::BadRequest(e.to_string()))
        }
        Err(e @ (RedriveError::AlreadyRunning(_) | RedriveError::Refused(_))) => {
            Err(ApiError::Conflict(e.to_string()))
        }
        Err(RedriveError::Unavailable(error)) => Err(ApiError::NoLeader {
            error,
            leader: None,
        }),
        Err(RedriveError::ShuttingDown) => Err(ApiError::Starting),
        Err(RedriveError::Storage(e)) => Err(BrokerError::from(e).into()),
    }
}

/// Ready (`503` while recovering at boot). Needs no token.
#[utoipa::path(get, path = "/healthz", tag = "meta",
    responses((status = 200, body = Health), Errors))]
pub(super) async fn healthz(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    state.broker()?;
    Ok(Json(serde_json::json!({"status": "ok"})))
}

/// Prometheus metrics.
#[utoipa::path(get, path = "/metrics", tag = "meta",
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain", body = String), Errors))]
pub(super) async fn metrics(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let text = state
        .broker()?
        .metrics_text(Some(&state.http_metrics))
        .await;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    ))
}
