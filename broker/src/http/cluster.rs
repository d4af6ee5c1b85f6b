//! `GET /mmmq/cluster` (contract §13; docs/cluster.md, "Status").

use axum::Json;
use axum::extract::{Query, State};
use serde::Deserialize;

use super::openapi::Errors;
use super::{ApiError, AppState};
use crate::cluster::status::ClusterView;

/// `?local=true`: this broker's own view only (what brokers ask each other).
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct ViewQuery {
    /// Only this broker's view, without asking the others.
    #[serde(default)]
    local: bool,
}

/// The brokers and every partition's leader, replicas, lag and term; a single-node broker
/// answers `"clustered": false`.
#[utoipa::path(get, path = "/mmmq/cluster", tag = "cluster", params(ViewQuery),
    responses((status = 200, body = ClusterView), Errors))]
pub(super) async fn view(
    State(state): State<AppState>,
    query: Result<Query<ViewQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<ClusterView>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let Some(cluster) = state.broker()?.cluster() else {
        return Ok(Json(ClusterView::default()));
    };
    Ok(Json(if q.local {
        cluster.local_view()
    } else {
        cluster.view().await
    }))
}
