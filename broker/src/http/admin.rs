//! Dispatcher status, reload, health and metrics.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use super::{ApiError, AppState};
use crate::broker::BrokerError;
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
