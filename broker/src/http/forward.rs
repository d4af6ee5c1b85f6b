//! Requests that need a partition's leader, forwarded to it by the broker that got them
//! (contract §13; docs/cluster.md, "Topics and produce in a cluster"): one hop, the leader's
//! answer passed on as it came.

use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

use super::ApiError;
use crate::broker::Broker;
use crate::cluster::partitions::FORWARDED;

/// `Some(answer)` when another broker leads partition `p` of `topic` and answered for it;
/// `None` when this broker answers (single broker, leader, a forwarded request, no leader known
/// while holding a replica).
pub(super) async fn to_leader(
    broker: &Broker,
    headers: &HeaderMap,
    uri: &Uri,
    (topic, p): (&str, u32),
    timeout: std::time::Duration,
) -> Result<Option<Response>, ApiError> {
    to_leader_with(
        broker,
        headers,
        (reqwest::Method::GET, uri),
        None,
        (topic, p),
        timeout,
    )
    .await
}

/// [`to_leader`] for a request of any method, with its body.
pub(super) async fn to_leader_with(
    broker: &Broker,
    headers: &HeaderMap,
    (method, uri): (reqwest::Method, &Uri),
    body: Option<bytes::Bytes>,
    (topic, p): (&str, u32),
    timeout: std::time::Duration,
) -> Result<Option<Response>, ApiError> {
    let Some(cluster) = forwarding(broker, headers)? else {
        return Ok(None);
    };
    let Some(leader) = cluster.forward_target(topic, p) else {
        return Ok(None);
    };
    let path = uri.path_and_query().map_or(uri.path(), |pq| pq.as_str());
    let answer = cluster
        .forward_http(leader, method, path, body, timeout)
        .await
        .map_err(crate::broker::BrokerError::from)?;
    Ok(Some(passed_on(answer)))
}

/// `Some(answer)` when this broker is a cluster member but not the pull groups' coordinator
/// (the metadata group's leader: docs/cluster.md, "Pull groups in a cluster"), which answered
/// the request, forwarded with its method and body; `None` when this broker answers.
pub(super) async fn to_coordinator(
    broker: &Broker,
    headers: &HeaderMap,
    (method, uri): (reqwest::Method, &Uri),
    body: Option<bytes::Bytes>,
    timeout: std::time::Duration,
) -> Result<Option<Response>, ApiError> {
    let Some(cluster) = forwarding(broker, headers)? else {
        return Ok(None);
    };
    // Answered here when this broker coordinates; the groups refuse (`503`) when no broker
    // can be named that does.
    if cluster.coordinates() {
        return Ok(None);
    }
    let coordinator = match cluster.coordinator().0 {
        Some(c) if c != cluster.id() => c,
        _ => return Ok(None),
    };
    let path = uri.path_and_query().map_or(uri.path(), |pq| pq.as_str());
    let answer = cluster
        .forward_http(coordinator, method, path, body, timeout)
        .await
        .map_err(crate::broker::BrokerError::from)?;
    Ok(Some(passed_on(answer)))
}

/// The cluster, when this broker is a member and the request was not forwarded to it already
/// (a request is forwarded at most once). A request forwarded by a broker of another cluster
/// is refused (`409`), as its Raft messages are (docs/cluster.md, "Raft traffic").
fn forwarding<'a>(
    broker: &'a Broker,
    headers: &HeaderMap,
) -> Result<Option<&'a crate::cluster::node::Cluster>, ApiError> {
    let Some(cluster) = broker.cluster() else {
        return Ok(None);
    };
    if headers.contains_key(FORWARDED) {
        cluster.accepts_forwarded(headers).map_err(ApiError::from)?;
        return Ok(None);
    }
    Ok(Some(cluster))
}

/// Another broker's answer, as it came.
fn passed_on(answer: crate::cluster::partitions::Forwarded) -> Response {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut response = (status, answer.body).into_response();
    if let Some(t) = answer
        .content_type
        .and_then(|t| HeaderValue::from_str(&t).ok())
    {
        response.headers_mut().insert(header::CONTENT_TYPE, t);
    }
    if let Some(link) = answer.link.and_then(|l| HeaderValue::from_str(&l).ok()) {
        response.headers_mut().insert(header::LINK, link);
    }
    response
}
