//! `GET /` (README, "Dashboard"): the dashboard, one page embedded in the binary
//! (`dashboard.html`, no build step, nothing fetched from elsewhere). It is a client of the HTTP
//! API like any other: the page itself needs no token and holds no data; its calls carry the
//! token the user gives when the broker asks for one (`--auth-token`).

use axum::http::header;
use axum::response::IntoResponse;

/// The dashboard.
#[utoipa::path(get, path = "/", tag = "meta",
    responses((status = 200, description = "The dashboard (HTML)", content_type = "text/html", body = String)))]
pub(super) async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        include_str!("dashboard.html"),
    )
}
