//! Dispatcher status, reload, dead-letter redrive, health and metrics.

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, header};
use axum::response::IntoResponse;
use mmmq_core::RedriveStatus;

use super::{ApiError, AppState, parse_json, read_json_body};
use crate::broker::BrokerError;
use crate::dispatch::redrive::RedriveError;
use crate::dispatch::{DispatcherStatus, ReloadReport};

pub(super) async fn dispatchers(
    State(state): State<AppState>,
) -> Result<Json<Vec<DispatcherStatus>>, ApiError> {
    Ok(Json(state.broker()?.dispatchers().await))
}

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

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RedriveRequest {
    from: Option<u64>,
    to: Option<u64>,
}

/// `POST /mmmq/dispatchers/{consumerId}/redrive` `{"from"?, "to"?}` (an empty body: all not
/// yet redriven).
pub(super) async fn redrive(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Json<RedriveStatus>, ApiError> {
    let broker = state.broker()?;
    let Path(id) = id.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let bytes = read_json_body(&headers, body, 64 << 10).await?;
    let req: RedriveRequest = if bytes.iter().all(u8::is_ascii_whitespace) {
        RedriveRequest::default()
    } else {
        parse_json(&bytes)?
    };
    match broker.redrive(&id, req.from, req.to).await {
        Ok(status) => Ok(Json(status)),
        Err(e @ RedriveError::UnknownDispatcher(_)) => Err(ApiError::NotFound(e.to_string())),
        Err(e @ RedriveError::BadRange { .. }) => Err(ApiError::BadRequest(e.to_string())),
        Err(e @ RedriveError::AlreadyRunning(_)) => Err(ApiError::Conflict(e.to_string())),
        Err(RedriveError::ShuttingDown) => Err(ApiError::Starting),
        Err(RedriveError::Storage(e)) => Err(BrokerError::from(e).into()),
    }
}

pub(super) async fn healthz(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    state.broker()?;
    Ok(Json(serde_json::json!({"status": "ok"})))
}

pub(super) async fn metrics(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let text = state.broker()?.metrics_text().await;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    ))
}
