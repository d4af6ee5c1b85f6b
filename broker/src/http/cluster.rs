//! `GET /mmmq/cluster` (contract §13; docs/cluster.md, "Status") and the membership commands
//! (docs/cluster.md, "Membership"): add or remove a broker, move a partition's replicas. Any
//! broker takes them; each step goes to the group's leader.

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Query, State};
use mmmq_core::cluster::{NewBroker, Reassignment};
use serde::Deserialize;

use super::openapi::{BodyErrors, Errors};
use super::{ApiError, AppState, parse_json};
use crate::broker::BrokerError;
use crate::cluster::node::Cluster;
use crate::cluster::status::ClusterView;

/// `?local=true`: this broker's own view only (what brokers ask each other).
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct ViewQuery {
    /// Only this broker's view, without asking the others.
    #[serde(default)]
    local: bool,
}

/// A membership command's body is a few numbers.
const MAX_BODY_BYTES: usize = 16 * 1024;

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

fn member(state: &AppState) -> Result<Cluster, ApiError> {
    state.broker()?.cluster().cloned().ok_or_else(|| {
        ApiError::BadRequest("this broker is not a cluster member (serve --node-id --peers)".into())
    })
}

fn failed(e: crate::cluster::node::ClusterError) -> ApiError {
    BrokerError::from(e).into()
}

/// Adds a broker started with `--node-id ID --peers <the cluster's brokers and itself>`: it
/// joins the metadata group (caught up first) and new topics place replicas on it. Answers
/// the cluster as it is then.
#[utoipa::path(post, path = "/mmmq/cluster/brokers", tag = "cluster",
    request_body = NewBroker,
    responses((status = 200, body = ClusterView), Errors, BodyErrors))]
pub(super) async fn add_broker(
    State(state): State<AppState>,
    body: axum::body::Body,
) -> Result<Json<ClusterView>, ApiError> {
    let cluster = member(&state)?;
    let bytes = state.read_body(body, MAX_BODY_BYTES).await?;
    let new: NewBroker = parse_json(&bytes)?;
    if new.id == 0 || new.address.trim().is_empty() {
        return Err(ApiError::BadRequest(
            "a broker needs an id of 1 or more and an address (host:port)".into(),
        ));
    }
    cluster
        .add_broker(new.id, new.address)
        .await
        .map_err(failed)?;
    Ok(Json(cluster.view().await))
}

/// Removes a broker: each of its replicas moves to another broker first (see the partition
/// `PUT`), then it leaves the cluster and its id is never used again. Refused when fewer
/// brokers than a topic's `replicationFactor` would remain.
#[utoipa::path(delete, path = "/mmmq/cluster/brokers/{id}", tag = "cluster",
    params(("id" = u64, Path, description = "The broker's id")),
    responses((status = 200, body = ClusterView), Errors))]
pub(super) async fn remove_broker(
    State(state): State<AppState>,
    path: Result<Path<u64>, PathRejection>,
) -> Result<Json<ClusterView>, ApiError> {
    let Path(id) = path.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let cluster = member(&state)?;
    cluster.remove_broker(id).await.map_err(failed)?;
    Ok(Json(cluster.view().await))
}

/// Moves a partition's replicas while it takes produces: each new replica is caught up as a
/// learner, then the voters change in one step; the brokers left out delete its files.
#[utoipa::path(put, path = "/mmmq/cluster/partitions/{topic}/{partition}", tag = "cluster",
    params(("topic" = String, Path, description = "The topic"),
        ("partition" = u32, Path, description = "The partition")),
    request_body = Reassignment,
    responses((status = 200, body = ClusterView), Errors, BodyErrors))]
pub(super) async fn reassign(
    State(state): State<AppState>,
    path: Result<Path<(String, u32)>, PathRejection>,
    body: axum::body::Body,
) -> Result<Json<ClusterView>, ApiError> {
    let Path((topic, p)) = path.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let cluster = member(&state)?;
    let bytes = state.read_body(body, MAX_BODY_BYTES).await?;
    let wanted: Reassignment = parse_json(&bytes)?;
    cluster
        .reassign(&topic, p, wanted.replicas)
        .await
        .map_err(failed)?;
    Ok(Json(cluster.view().await))
}
