//! Deploying plugins over HTTP (README, "Deploying plugins").

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};

use super::{ApiError, AppState};
use crate::plugin::store::{Deployed, MAX_PLUGIN_BYTES, StoreError};
use mmmq_core::PluginListing;

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NoSuchPlugin(_) | StoreError::NoSuchVersion { .. } => {
                Self::NotFound(e.to_string())
            }
            StoreError::Io(_) => Self::Internal(e.to_string()),
            _ => Self::BadRequest(e.to_string()),
        }
    }
}

/// `PUT /mmmq/plugins/{name}` with the component's bytes.
pub(super) async fn deploy(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    body: axum::body::Body,
) -> Result<Json<Deployed>, ApiError> {
    let broker = state.broker()?;
    let Path(name) = name.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let bytes = axum::body::to_bytes(body, MAX_PLUGIN_BYTES)
        .await
        .map_err(|_| {
            ApiError::BadRequest(format!(
                "the component is over the limit of {MAX_PLUGIN_BYTES} bytes"
            ))
        })?;
    if bytes.is_empty() {
        return Err(ApiError::BadRequest(
            "the body must be the component's bytes (Content-Type: application/wasm)".into(),
        ));
    }
    Ok(Json(broker.deploy_plugin(&name, bytes.to_vec()).await?))
}

/// `GET /mmmq/plugins`.
pub(super) async fn list(
    State(state): State<AppState>,
) -> Result<Json<Vec<PluginListing>>, ApiError> {
    Ok(Json(state.broker()?.plugins().await?))
}

/// `POST /mmmq/plugins/{name}/rollback`.
pub(super) async fn rollback(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<Deployed>, ApiError> {
    let broker = state.broker()?;
    let Path(name) = name.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    Ok(Json(broker.rollback_plugin(&name).await?))
}

/// `POST /mmmq/plugins/{name}/versions/{version}/activate`.
pub(super) async fn activate(
    State(state): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<Deployed>, ApiError> {
    let broker = state.broker()?;
    let Path((name, version)) = path.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    Ok(Json(broker.activate_plugin(&name, &version).await?))
}
