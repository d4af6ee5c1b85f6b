//! Deploying plugins over HTTP (docs/plugins.md, "Deploying plugins by API").

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};

use super::openapi::{ErrorBody, Errors};
use super::{ApiError, AppState, body};
use crate::plugin::store::{Deployed, MAX_PLUGIN_BYTES, PluginStore, StoreError};
use mmmq_core::PluginListing;

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NoSuchPlugin(_) | StoreError::NoSuchVersion { .. } => {
                Self::NotFound(e.to_string())
            }
            StoreError::Io(_) => Self::Internal(e.to_string()),
            StoreError::TooLarge(_) => Self::TooLarge(e.to_string()),
            StoreError::Cluster(c) => crate::broker::BrokerError::Cluster(c).into(),
            _ => Self::BadRequest(e.to_string()),
        }
    }
}

/// `PUT /mmmq/plugins/{name}` with the component's bytes.
/// Deploys a component as the plugin's new current version; dispatchers naming it switch before
/// the answer. The upload is staged on disk while it arrives (docs/plugins.md, "Deploying plugins by API").
#[utoipa::path(put, path = "/mmmq/plugins/{name}", tag = "plugins",
    params(("name" = String, Path, description = "The plugin")),
    request_body(content = Vec<u8>, content_type = "application/wasm", description = "The component's bytes (at most 64 MiB)"),
    responses((status = 200, body = Deployed),
        (status = 413, description = "The component is over 64 MiB", body = ErrorBody),
        Errors))]
pub(super) async fn deploy(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    body: axum::body::Body,
) -> Result<Json<Deployed>, ApiError> {
    let broker = state.broker()?;
    let Path(name) = name.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    // Before 64 MiB arrive for nothing (the body stays unread: say the connection closes).
    if let Err(e) = PluginStore::check_name(&name) {
        return Err(ApiError::from(e).unread());
    }
    let staging = broker.config().root_dir.join("plugins").join(".uploads");
    let upload = body::stage(&state.bodies, body, MAX_PLUGIN_BYTES, staging).await?;
    if upload.is_empty() {
        return Err(ApiError::BadRequest(
            "the body must be the component's bytes (Content-Type: application/wasm)".into(),
        ));
    }
    // The budget stays held while the bytes are validated and stored.
    let (bytes, _held) = upload.into_parts();
    Ok(Json(broker.deploy_plugin(&name, bytes).await?))
}

/// `GET /mmmq/plugins`.
/// Deployed plugins, their kept versions and the dispatchers that use them.
#[utoipa::path(get, path = "/mmmq/plugins", tag = "plugins",
    responses((status = 200, body = Vec<PluginListing>), Errors))]
pub(super) async fn list(
    State(state): State<AppState>,
) -> Result<Json<Vec<PluginListing>>, ApiError> {
    Ok(Json(state.broker()?.plugins().await?))
}

/// `POST /mmmq/plugins/{name}/rollback`.
/// The version deployed before the current one becomes current.
#[utoipa::path(post, path = "/mmmq/plugins/{name}/rollback", tag = "plugins",
    params(("name" = String, Path, description = "The plugin")),
    responses((status = 200, body = Deployed), Errors))]
pub(super) async fn rollback(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<Deployed>, ApiError> {
    let broker = state.broker()?;
    let Path(name) = name.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    Ok(Json(broker.rollback_plugin(&name).await?))
}

/// `POST /mmmq/plugins/{name}/versions/{version}/activate`.
/// A kept version becomes current.
#[utoipa::path(post, path = "/mmmq/plugins/{name}/versions/{version}/activate", tag = "plugins",
    params(("name" = String, Path, description = "The plugin"), ("version" = String, Path, description = "The version (16 hex digits)")),
    responses((status = 200, body = Deployed), Errors))]
pub(super) async fn activate(
    State(state): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<Deployed>, ApiError> {
    let broker = state.broker()?;
    let Path((name, version)) = path.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    Ok(Json(broker.activate_plugin(&name, &version).await?))
}

/// `GET /mmmq/internal/plugins/{name}/{version}`: a kept version's bytes, for another broker of
/// the cluster that lacks them (docs/cluster.md, "Configuration in a cluster"). Peers only: the
/// token as for every route, and the cluster's id as on Raft's traffic (another cluster's
/// request is refused with `409`). Not part of the API: undescribed.
pub(super) async fn internal_version(
    State(state): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: axum::http::HeaderMap,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let broker = state.broker()?;
    let Some(cluster) = broker.cluster() else {
        return Err(ApiError::NotFound("no such endpoint".into()));
    };
    cluster
        .accepts_forwarded(&headers)
        .map_err(ApiError::from)?;
    let Path((name, version)) = path.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    match broker.plugin_version_bytes(&name, &version).await? {
        Some(bytes) => Ok((
            [(axum::http::header::CONTENT_TYPE, "application/wasm")],
            bytes,
        )
            .into_response()),
        None => Err(ApiError::NotFound(format!(
            "this broker keeps no version {version:?} of plugin {name:?}"
        ))),
    }
}
