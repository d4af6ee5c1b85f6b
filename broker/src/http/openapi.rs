//! `GET /mmmq/openapi.json` (docs/http-api.md, "HTTP API"): the OpenAPI 3.1 description of every endpoint,
//! generated from the handlers' own annotations and types. The router itself is built from the
//! same annotated handlers ([`super::router`] uses `utoipa_axum`), so a route cannot be served
//! without being described.

use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;
use mmmq_core::Ack;
use serde::Serialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoResponses, Modify, OpenApi, ToSchema};

use super::AppState;

/// The shape of every error: `{"error": "…"}`.
#[derive(Serialize, ToSchema)]
pub(super) struct ErrorBody {
    /// What went wrong, for people.
    pub error: String,
}

/// `503`: a message (or part of a batch) that could not be made durable, or the broker cannot
/// take the request now (booting, too much in flight).
#[derive(Serialize, ToSchema)]
pub(super) struct NackBody {
    /// `NACK` when a produce was not made durable; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ack: Option<Ack>,
    /// Why.
    pub error: String,
    /// For a batch: per element in request order, `{"topic","partition","offset","ack":"ACK"}`
    /// or `{"topic","ack":"NACK"}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub results: Option<Vec<serde_json::Value>>,
}

/// The errors every endpoint may answer.
#[derive(IntoResponses)]
#[allow(dead_code)] // described, not built: the answers come from `ApiError`
pub(super) enum Errors {
    /// The request is wrong (the reason says what).
    #[response(status = 400)]
    BadRequest(ErrorBody),
    /// `--auth-token` is set and the bearer token is missing or wrong.
    #[response(status = 401)]
    Unauthorized(ErrorBody),
    /// Refused before any route: a request from another site (`Origin`, `Sec-Fetch-Site`), or,
    /// while the broker listens on loopback, a `Host` that is neither loopback nor in
    /// `--allowed-hosts`; when producing, creating or growing a topic, also `--max-topics` or
    /// `--max-partitions` reached.
    #[response(status = 403)]
    Forbidden(ErrorBody),
    /// No such topic, group, dispatcher, plugin or version.
    #[response(status = 404)]
    NotFound(ErrorBody),
    /// A request with a body whose `Content-Type` is not `application/json` (or
    /// `application/wasm` for a plugin upload).
    #[response(status = 415)]
    UnsupportedMediaType(ErrorBody),
    /// Booting (recovering topics), the disk refused (`{"ack":"NACK","error"}`), the request body
    /// budget is used up (`--max-inflight-body-bytes`), the client's address holds
    /// `--max-connections-per-ip`, or a new group's first poll passes `--max-groups`;
    /// `Retry-After` says when to try again.
    #[response(status = 503)]
    Unavailable(NackBody),
}

/// The errors of a request with a JSON body, on top of [`Errors`].
#[derive(IntoResponses)]
#[allow(dead_code)] // described, not built: the answers come from `ApiError`
pub(super) enum BodyErrors {
    /// The body, or a message's content in it, is over its limit.
    #[response(status = 413)]
    TooLarge(ErrorBody),
}

/// `{"deleted": "<topic>"}`.
#[derive(Serialize, ToSchema)]
pub(super) struct Deleted {
    /// The topic.
    pub deleted: String,
}

/// `{"committed": true}`.
#[derive(Serialize, ToSchema)]
pub(super) struct Committed {
    /// Always true.
    pub committed: bool,
}

/// `{"left": "<member>"}`.
#[derive(Serialize, ToSchema)]
pub(super) struct Left {
    /// The member.
    pub left: String,
}

/// `{"status": "ok"}`.
#[derive(Serialize, ToSchema)]
pub(super) struct Health {
    /// Always `ok` (a booting broker answers `503`).
    pub status: String,
}

/// The document's fixed parts; the paths come from the router.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "mmmq",
        description = "A message broker with durable segment storage and WebAssembly consumer handlers. Every answer is JSON; errors are {\"error\": \"…\"}."
    ),
    modifiers(&BearerToken)
)]
pub(super) struct ApiDoc;

/// `--auth-token`: every endpoint but `/healthz` and the dashboard's page `/` then needs
/// `Authorization: Bearer <token>`.
struct BearerToken;

impl Modify for BearerToken {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The description of every endpoint (this one included).
#[utoipa::path(
    get,
    path = "/mmmq/openapi.json",
    tag = "meta",
    responses((status = 200, description = "OpenAPI 3.1", content_type = "application/json", body = serde_json::Value), Errors)
)]
pub(super) async fn document(State(state): State<AppState>) -> impl IntoResponse {
    Json(state.openapi.as_ref().clone())
}
