//! The HTTP API (docs/http-api.md, "HTTP API"), on axum. Every answer is JSON, errors included: `{"error": "…"}`
//! with 4xx for the client's fault and 5xx for the broker's.
//!
//! # Layout
//! - this module: the router, the shared state and [`ApiError`].
//! - `produce`: `POST /mmmq/messages` and `/mmmq/messages/batch`.
//! - `consume`: topic list and pull with long poll.
//! - `admin`: dispatcher status, reload, health, metrics.
//! - `cluster`: `GET /mmmq/cluster`, and adding, removing and moving replicas.
//! - `dashboard`: `GET /`, the page for people.
//! - `openapi`: `GET /mmmq/openapi.json`, and the schemas of answers the handlers build by hand.
//! - `guard`: what every request passes first: `Host`, the site it comes from, the token, the
//!   body's `Content-Type` (docs/http-api.md, "What a web page can do").
//! - `body`: reading bodies within their limit and the broker's in-flight body budget; plugin
//!   uploads staged on disk.
//! - `serve`: the accept loop and its connection limits.
//!
//! Bodies are read by hand (not with `Json<T>`), so that every rejection — too large, wrong
//! content type, malformed — is a JSON error the client can read, never axum's plain text.

mod admin;
mod body;
mod cluster;
mod consume;
mod dashboard;
mod forward;
mod groups;
mod guard;
mod openapi;
mod plugins;
pub mod produce;
pub mod serve;
mod topics;

use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::de::DeserializeOwned;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::broker::{Broker, BrokerError};
use crate::config::ServeConfig;
use crate::metrics::HttpMetrics;
use crate::storage::StorageError;
use body::BodyBudget;
pub use guard::Guarded;
use guard::{Guard, GuardLayer};

/// What the handlers share. One pointer: axum clones the state for every request and every
/// extractor, and a clone of the fields themselves (six reference counts and a cancellation
/// token, whose clone takes a lock) showed in the produce path's profile.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The fields of [`AppState`].
#[derive(Clone)]
pub struct Shared {
    broker: Arc<OnceCell<Arc<Broker>>>,
    max_body_bytes: usize,
    /// Cancelled at shutdown, so long polls answer at once instead of holding the exit.
    stopping: CancellationToken,
    /// What every request passes before any route.
    guard: Arc<Guard>,
    /// The bytes of request bodies held at once (`--max-inflight-body-bytes`).
    bodies: Arc<BodyBudget>,
    /// The HTTP server's own metrics, served with the broker's.
    http_metrics: Arc<HttpMetrics>,
    /// Time a request has to send its body and be answered (`--request-timeout-ms`).
    request_timeout: std::time::Duration,
    /// The API's description (`GET /mmmq/openapi.json`).
    openapi: Arc<serde_json::Value>,
}

impl AppState {
    /// State for a broker that is still recovering; [`AppState::ready`] completes it. `loopback`:
    /// whether the broker listens on a loopback address (then the `Host` is checked).
    pub fn new(
        config: &ServeConfig,
        loopback: bool,
        http_metrics: Arc<HttpMetrics>,
        stopping: CancellationToken,
    ) -> Self {
        Self(Arc::new(Shared {
            broker: Arc::new(OnceCell::new()),
            max_body_bytes: config.max_body_bytes,
            stopping,
            guard: Arc::new(Guard::new(
                loopback,
                &config.allowed_hosts,
                config.auth_token.as_deref(),
                http_metrics.clone(),
            )),
            bodies: BodyBudget::new(
                config.http.max_inflight_body_bytes,
                config.http.header_read_timeout,
                http_metrics.clone(),
            ),
            http_metrics,
            request_timeout: config.http.request_timeout,
            openapi: Arc::new(serde_json::Value::Null),
        }))
    }

    fn with_openapi(self, doc: &utoipa::openapi::OpenApi) -> Self {
        let mut shared = (*self.0).clone();
        shared.openapi = Arc::new(serde_json::to_value(doc).expect("the description serializes"));
        Self(Arc::new(shared))
    }

    /// Boot recovery is done: start answering.
    pub fn ready(&self, broker: Arc<Broker>) {
        let _ = self.broker.set(broker);
    }

    fn broker(&self) -> Result<&Arc<Broker>, ApiError> {
        self.broker.get().ok_or(ApiError::Starting)
    }

    /// Reads a request's body of at most `limit` bytes, within the body budget.
    async fn read_body(
        &self,
        body: axum::body::Body,
        limit: usize,
    ) -> Result<body::Body, ApiError> {
        body::read(&self.bodies, body, limit).await
    }
}

/// Every route of docs/http-api.md, "HTTP API", and its description (`GET /mmmq/openapi.json`): each route
/// comes from its handler's `#[utoipa::path]`, so what is served and what is described are one
/// list.
///
/// The checks of `guard` come first, in front of the router as a whole: without the token an
/// unknown path or method is `401` like the rest. Each request has a deadline (`408` past it),
/// which covers a body that trickles in.
pub fn router(state: AppState) -> App {
    router_with(state, None)
}

/// As [`router`], with routes of its own state beside the API's, behind the same guard (a
/// cluster member's Raft traffic: docs/cluster.md, "Raft traffic").
pub fn router_with(state: AppState, extra: Option<Router>) -> App {
    let (api, doc) = described_routes().split_for_parts();
    let state = state.with_openapi(&doc);
    let guard = GuardLayer(state.guard.clone());
    let deadline = state.request_timeout;
    let routes = Router::new()
        .merge(api)
        .route("/healthz", get(admin::healthz))
        .route("/", get(dashboard::page))
        .route(
            "/mmmq/internal/plugins/{name}/{version}",
            get(plugins::internal_version),
        )
        .fallback(|| async { ApiError::NotFound("no such endpoint".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state)
        .merge(extra.unwrap_or_default())
        .layer(axum::middleware::from_fn_with_state(
            deadline,
            request_deadline,
        ));
    tower::Layer::layer(&guard, routes)
}

/// The HTTP API as one service: the router behind its `guard`.
pub type App = Guarded<Router>;

async fn request_deadline(
    axum::extract::State(deadline): axum::extract::State<std::time::Duration>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match tokio::time::timeout(deadline, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::Timeout(deadline).into_response(),
    }
}

/// The routes behind the token, with their descriptions; `/healthz` and `/` (open) are described
/// here too and routed by [`router`].
fn described_routes() -> OpenApiRouter<AppState> {
    let mut doc = openapi::ApiDoc::openapi();
    // Served outside the token check ([`router`]), but described with the rest.
    doc.merge(
        OpenApiRouter::<AppState>::new()
            .routes(routes!(admin::healthz))
            .routes(routes!(dashboard::page))
            .split_for_parts()
            .1,
    );
    OpenApiRouter::with_openapi(doc)
        .routes(routes!(produce::produce))
        .routes(routes!(produce::produce_batch))
        .routes(routes!(consume::topics))
        .routes(routes!(topics::show, topics::put, topics::delete))
        .routes(routes!(consume::pull))
        .routes(routes!(groups::list))
        .routes(routes!(groups::show))
        .routes(routes!(groups::poll))
        .routes(routes!(groups::commit))
        .routes(routes!(groups::leave))
        .routes(routes!(admin::dispatchers))
        .routes(routes!(cluster::view))
        .routes(routes!(cluster::add_broker))
        .routes(routes!(cluster::remove_broker))
        .routes(routes!(cluster::reassign))
        .routes(routes!(admin::redrive))
        .routes(routes!(admin::reload))
        .routes(routes!(plugins::list))
        .routes(routes!(plugins::deploy))
        .routes(routes!(plugins::rollback))
        .routes(routes!(plugins::activate))
        .routes(routes!(admin::metrics))
        .routes(routes!(openapi::document))
}

/// An error answer.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is wrong.
    #[error("{0}")]
    BadRequest(String),
    /// The body, or a part of it, is larger than allowed.
    #[error("{0}")]
    TooLarge(String),
    /// A body without the `Content-Type` the route takes.
    #[error("Content-Type must be {want} for a request with a body, not {given}")]
    UnsupportedMediaType {
        /// The type the route takes.
        want: &'static str,
        /// The request's, quoted, or `none`.
        given: String,
    },
    /// Refused before any route: a `Host` not served, a request from another site.
    #[error("{0}")]
    Forbidden(String),
    /// A budget of the broker is spent for now (request bodies in flight, `--max-groups`):
    /// `503` with `Retry-After`, counted in the metrics rather than logged per request.
    #[error("{0}")]
    Busy(String),
    /// The body budget cannot take the request's body (before it is read, or while it arrives):
    /// `503` with `Retry-After` like [`ApiError::Busy`], and `Connection: close`, since the rest
    /// of the body is not read.
    #[error("{0}")]
    BusyMidBody(String),
    /// Any refusal given before the request's body was read: answered as the error it wraps,
    /// with `Connection: close` (hyper closes such a connection after the answer).
    #[error(transparent)]
    Unread(Box<ApiError>),
    /// No such thing.
    #[error("{0}")]
    NotFound(String),
    /// A token is required and was missing or wrong.
    #[error("missing or wrong bearer token (Authorization: Bearer <token>)")]
    Unauthorized,
    /// Wrong method on a known path.
    #[error("method not allowed on this path")]
    MethodNotAllowed,
    /// The request took longer than the per-request deadline (a body that trickles in).
    #[error("request not completed within {} s", .0.as_secs())]
    Timeout(std::time::Duration),
    /// The body stopped arriving for the header timeout (docs/http-api.md, "HTTP API").
    #[error("no byte of the request body for {} ms (--header-timeout-ms)", .0.as_millis())]
    BodyStalled(std::time::Duration),
    /// The request contradicts the state it acts on (a commit for a partition the member does
    /// not own).
    #[error("{0}")]
    Conflict(String),
    /// Creating the topic would pass the broker's topic cap.
    #[error("{0}")]
    TopicLimit(String),
    /// Still recovering at boot.
    #[error("starting: recovering topics")]
    Starting,
    /// What needs a leader has none now (contract §13): `503` with the last leader's address.
    #[error("{error}")]
    NoLeader {
        /// Why.
        error: String,
        /// The last leader's HTTP address, if known.
        leader: Option<String>,
    },
    /// The message could not be made durable.
    #[error("{0}")]
    NotDurable(String),
    /// Part of a batch could not be made durable: `results` says, per element, which were.
    #[error("{error}")]
    PartialBatch {
        /// Why.
        error: String,
        /// Per element in request order: `{"topic","offset","ack":"ACK"}` or
        /// `{"topic","ack":"NACK"}`.
        results: Vec<serde_json::Value>,
    },
    /// Anything else on the broker's side.
    #[error("{0}")]
    Internal(String),
}

impl From<BrokerError> for ApiError {
    fn from(e: BrokerError) -> Self {
        match e {
            BrokerError::Invalid(_)
            | BrokerError::InvalidName(_)
            | BrokerError::InvalidOptions(_)
            | BrokerError::InvalidSettings(_)
            | BrokerError::NoSuchPartition(_) => Self::BadRequest(e.to_string()),
            BrokerError::Storage(e @ StorageError::PayloadTooLarge { .. }) => {
                Self::TooLarge(e.to_string())
            }
            BrokerError::Storage(e @ StorageError::TopicLimit { .. }) => {
                Self::TopicLimit(e.to_string())
            }
            BrokerError::Storage(s) => Self::NotDurable(s.to_string()),
            BrokerError::UnknownTopic(_) => Self::NotFound(e.to_string()),
            BrokerError::Cluster(c) => {
                use crate::cluster::node::ClusterError as C;
                match c {
                    C::NoLeader { ref leader, .. } => Self::NoLeader {
                        error: c.to_string(),
                        leader: leader.clone(),
                    },
                    C::Refused(why) => Self::BadRequest(why),
                    C::NotFound(why) => Self::NotFound(why),
                    C::Unreachable(..) | C::Unknown(..) => Self::NoLeader {
                        error: c.to_string(),
                        leader: None,
                    },
                    C::Failed(why) => Self::Internal(why),
                }
            }
            other => Self::Internal(other.to_string()),
        }
    }
}

impl ApiError {
    /// A body over its `limit` of bytes.
    fn body_too_large(limit: usize) -> Self {
        Self::TooLarge(format!(
            "request body is larger than the {limit}-byte limit"
        ))
    }
}

/// A request that says it comes from another broker but is not a member's (`403`), or is of
/// another cluster (`409`).
impl From<crate::cluster::identity::Refusal> for ApiError {
    fn from(refusal: crate::cluster::identity::Refusal) -> Self {
        use crate::cluster::identity::Refusal;
        match refusal {
            Refusal::NotMember(_) => ApiError::Forbidden(refusal.to_string()),
            Refusal::OtherCluster { .. } => ApiError::Conflict(refusal.to_string()),
        }
    }
}

impl From<crate::groups::GroupError> for ApiError {
    fn from(e: crate::groups::GroupError) -> Self {
        use crate::groups::GroupError as G;
        match e {
            G::Invalid(_) => Self::BadRequest(e.to_string()),
            G::Unknown(_) => Self::NotFound(e.to_string()),
            G::NotOwner { .. } => Self::Conflict(e.to_string()),
            G::Limit { .. } | G::Members { .. } => Self::Busy(e.to_string()),
            G::Storage(_) => Self::Internal(e.to_string()),
            G::Cluster(c) => crate::broker::BrokerError::Cluster(c).into(),
        }
    }
}

/// Says `Connection: close` on an answer given before the request's body was read: hyper closes
/// such a connection after the answer, and a client that was not told may send its next request
/// on it and lose it (hyper's "incomplete message").
pub(crate) fn closes(response: &mut Response) {
    response.headers_mut().insert(
        header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
}

impl ApiError {
    /// This refusal, given before the request's body was read.
    pub(crate) fn unread(self) -> Self {
        Self::Unread(Box::new(self))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let Self::Unread(inner) = self {
            let mut response = inner.into_response();
            closes(&mut response);
            return response;
        }
        let status = match &self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Timeout(_) | Self::BodyStalled(_) => StatusCode::REQUEST_TIMEOUT,
            Self::TopicLimit(_) => StatusCode::FORBIDDEN,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::Starting
            | Self::NoLeader { .. }
            | Self::Busy(_)
            | Self::BusyMidBody(_)
            | Self::NotDurable(_)
            | Self::PartialBatch { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Unread(_) => unreachable!("answered as the error it wraps"),
        };
        let body = match &self {
            Self::NotDurable(_) => serde_json::json!({"ack": "NACK", "error": self.to_string()}),
            Self::PartialBatch { error, results } => {
                serde_json::json!({"ack": "NACK", "error": error, "results": results})
            }
            Self::NoLeader { error, leader } => {
                serde_json::json!({"error": error, "leader": leader})
            }
            _ => serde_json::json!({"error": self.to_string()}),
        };
        // A spent budget is counted in the metrics, not logged per request.
        if status.is_server_error()
            && !matches!(self, Self::Starting | Self::Busy(_) | Self::BusyMidBody(_))
        {
            tracing::warn!(%status, error = %self, "request failed");
        }
        // Answers given with the body not (wholly) read: hyper closes the connection after them.
        let close = matches!(
            self,
            Self::BusyMidBody(_) | Self::TooLarge(_) | Self::BodyStalled(_)
        );
        let mut response = (status, axum::Json(body)).into_response();
        if close {
            closes(&mut response);
        }
        if status == StatusCode::SERVICE_UNAVAILABLE {
            // A failed disk is retried by the log after about a second; recovery takes as long;
            // the body budget frees as the requests in flight finish.
            response.headers_mut().insert(
                header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))
}
