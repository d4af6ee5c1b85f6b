//! The HTTP API (README, "HTTP API"), on axum. Every answer is JSON, errors included: `{"error": "…"}`
//! with 4xx for the client's fault and 5xx for the broker's.
//!
//! # Layout
//! - this module: the router, the shared state and [`ApiError`].
//! - `produce`: `POST /mmmq/messages` and `/mmmq/messages/batch`.
//! - `consume`: topic list and pull with long poll.
//! - `admin`: dispatcher status, reload, health, metrics.
//! - `dashboard`: `GET /`, the page for people.
//! - `openapi`: `GET /mmmq/openapi.json`, and the schemas of answers the handlers build by hand.
//!
//! Bodies are read by hand (not with `Json<T>`), so that every rejection — too large, wrong
//! content type, malformed — is a JSON error the client can read, never axum's plain text.

mod admin;
mod consume;
mod dashboard;
mod groups;
mod openapi;
mod plugins;
pub mod produce;
pub mod serve;
mod topics;

use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::de::DeserializeOwned;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::broker::{Broker, BrokerError};
use crate::storage::StorageError;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    broker: Arc<OnceCell<Arc<Broker>>>,
    max_body_bytes: usize,
    /// Cancelled at shutdown, so long polls answer at once instead of holding the exit.
    stopping: CancellationToken,
    auth_token: Option<Arc<str>>,
    /// The API's description (`GET /mmmq/openapi.json`).
    openapi: Arc<serde_json::Value>,
}

impl AppState {
    /// State for a broker that is still recovering; [`AppState::ready`] completes it.
    pub fn new(max_body_bytes: usize, stopping: CancellationToken) -> Self {
        Self {
            broker: Arc::new(OnceCell::new()),
            max_body_bytes,
            stopping,
            auth_token: None,
            openapi: Arc::new(serde_json::Value::Null),
        }
    }

    fn with_openapi(mut self, doc: &utoipa::openapi::OpenApi) -> Self {
        self.openapi = Arc::new(serde_json::to_value(doc).expect("the description serializes"));
        self
    }

    /// Requires `Authorization: Bearer <token>` on every endpoint but `/healthz` and the
    /// dashboard's page `/` (which asks for the token).
    pub fn with_auth_token(mut self, token: Option<String>) -> Self {
        self.auth_token = token.map(Into::into);
        self
    }

    /// Boot recovery is done: start answering.
    pub fn ready(&self, broker: Arc<Broker>) {
        let _ = self.broker.set(broker);
    }

    fn broker(&self) -> Result<&Arc<Broker>, ApiError> {
        self.broker.get().ok_or(ApiError::Starting)
    }
}

/// Every route of README, "HTTP API", and its description (`GET /mmmq/openapi.json`): each route
/// comes from its handler's `#[utoipa::path]`, so what is served and what is described are one
/// list.
pub fn router(state: AppState) -> Router {
    let (api, doc) = described_routes().split_for_parts();
    let state = state.with_openapi(&doc);
    // Without a token the check is not layered at all: a middleware is a boxed future and a
    // state clone on every request of the produce path.
    let api = if state.auth_token.is_some() {
        api.route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_token,
        ))
    } else {
        api
    };
    Router::new()
        .merge(api)
        .route("/healthz", get(admin::healthz))
        .route("/", get(dashboard::page))
        .fallback(|| async { ApiError::NotFound("no such endpoint".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state)
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
        .routes(routes!(admin::redrive))
        .routes(routes!(admin::reload))
        .routes(routes!(plugins::list))
        .routes(routes!(plugins::deploy))
        .routes(routes!(plugins::rollback))
        .routes(routes!(plugins::activate))
        .routes(routes!(admin::metrics))
        .routes(routes!(openapi::document))
}

/// Checks the bearer token when one is configured, in constant time.
async fn require_token(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(token) = &state.auth_token {
        use subtle::ConstantTimeEq;
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !bool::from(given.as_bytes().ct_eq(token.as_bytes())) {
            return ApiError::Unauthorized.into_response();
        }
    }
    next.run(request).await
}

/// An error answer.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is wrong.
    #[error("{0}")]
    BadRequest(String),
    /// The body is larger than allowed.
    #[error("request body is larger than the {0}-byte limit")]
    TooLarge(usize),
    /// The body is not JSON.
    #[error("Content-Type must be application/json, not {0:?}")]
    UnsupportedMediaType(String),
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
    /// The request contradicts the state it acts on (a commit for a partition the member does
    /// not own).
    #[error("{0}")]
    Conflict(String),
    /// Creating the topic would pass the broker's topic cap.
    #[error("{0}")]
    TopicLimit(String),
    /// A budget of the broker is spent for now (`--max-groups`): `503` with `Retry-After`,
    /// not logged as the broker's failure.
    #[error("{0}")]
    Busy(String),
    /// Still recovering at boot.
    #[error("starting: recovering topics")]
    Starting,
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
            BrokerError::Storage(StorageError::PayloadTooLarge { max, .. }) => Self::TooLarge(max),
            BrokerError::Storage(e @ StorageError::TopicLimit { .. }) => {
                Self::TopicLimit(e.to_string())
            }
            BrokerError::Storage(s) => Self::NotDurable(s.to_string()),
            BrokerError::UnknownTopic(_) => Self::NotFound(e.to_string()),
            other => Self::Internal(other.to_string()),
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
            G::Limit { .. } => Self::Busy(e.to_string()),
            G::Storage(_) => Self::Internal(e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::TopicLimit(_) => StatusCode::FORBIDDEN,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::Starting | Self::Busy(_) | Self::NotDurable(_) | Self::PartialBatch { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let body = match &self {
            Self::NotDurable(_) => serde_json::json!({"ack": "NACK", "error": self.to_string()}),
            Self::PartialBatch { error, results } => {
                serde_json::json!({"ack": "NACK", "error": error, "results": results})
            }
            _ => serde_json::json!({"error": self.to_string()}),
        };
        if status.is_server_error() && !matches!(self, Self::Starting | Self::Busy(_)) {
            tracing::warn!(%status, error = %self, "request failed");
        }
        let mut response = (status, axum::Json(body)).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            // A failed disk is retried by the log after about a second; recovery takes as long.
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

/// How much of an oversized body is still read (and thrown away) before answering 413: a client
/// that is still sending when the answer comes and the connection closes sees a reset instead of
/// the 413, so modestly oversized bodies are drained; beyond this the connection is dropped.
const DRAIN_OVERSIZED: usize = 16 << 20;

async fn read_limited(body: axum::body::Body, limit: usize) -> Result<Vec<u8>, ApiError> {
    use futures_util::StreamExt;
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    let mut total = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::BadRequest(format!("cannot read the body: {e}")))?;
        total = total.saturating_add(chunk.len());
        if total <= limit {
            buf.extend_from_slice(&chunk);
        } else if total > limit.saturating_add(DRAIN_OVERSIZED) {
            break;
        }
    }
    if total > limit {
        return Err(ApiError::TooLarge(limit));
    }
    Ok(buf)
}

/// Reads the whole body, refusing more than `limit` bytes and anything not declared as JSON
/// (a missing Content-Type is accepted, as curl users expect).
async fn read_json_body(
    headers: &HeaderMap,
    body: axum::body::Body,
    limit: usize,
) -> Result<Vec<u8>, ApiError> {
    if let Some(ct) = headers.get(header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or("");
        let mime = ct
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if mime != "application/json" && !mime.ends_with("+json") {
            return Err(ApiError::UnsupportedMediaType(ct.to_owned()));
        }
    }
    read_limited(body, limit).await
}

fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))
}
