//! `GET /` (docs/operations.md, "Dashboard"): the dashboard, one page embedded in the binary
//! (`dashboard.html`, no build step, nothing fetched from elsewhere). It is a client of the HTTP
//! API like any other: the page itself needs no token and holds no data; its calls carry the
//! token the user gives when the broker asks for one (`--auth-token`).
//!
//! The page may not be framed by another (`X-Frame-Options: DENY`, `frame-ancestors 'none'`:
//! no clickjacking of its buttons), and its Content-Security-Policy lets it run only the inline
//! script and style it ships, identified by their SHA-256 (computed from the page itself, so an
//! edit cannot leave a stale hash), and talk to nothing but the broker (`connect-src 'self'`).

use std::sync::LazyLock;

use axum::http::header;
use axum::response::IntoResponse;
use base64::Engine;
use sha2::{Digest, Sha256};

const PAGE: &str = include_str!("dashboard.html");

/// The page's Content-Security-Policy.
static POLICY: LazyLock<String> = LazyLock::new(|| {
    format!(
        "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; base-uri 'none'; \
         form-action 'none'; frame-ancestors 'none'",
        hashes_of(PAGE, "script"),
        hashes_of(PAGE, "style"),
    )
});

/// `'sha256-…'` for the content of each `<tag>` element of `page`.
fn hashes_of(page: &str, tag: &str) -> String {
    let (open, close) = (format!("<{tag}"), format!("</{tag}>"));
    let mut sources = Vec::new();
    let mut rest = page;
    while let Some(at) = rest.find(&open) {
        let after = &rest[at + open.len()..];
        let (Some(start), Some(end)) = (after.find('>'), after.find(&close)) else {
            break;
        };
        let content = &after[start + 1..end];
        let digest = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(content));
        sources.push(format!("'sha256-{digest}'"));
        rest = &after[end + close.len()..];
    }
    if sources.is_empty() {
        "'none'".to_owned()
    } else {
        sources.join(" ")
    }
}

/// The dashboard.
#[utoipa::path(get, path = "/", tag = "meta",
    responses((status = 200, description = "The dashboard (HTML)", content_type = "text/html", body = String)))]
pub(super) async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::CONTENT_SECURITY_POLICY, POLICY.as_str()),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        PAGE,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_hashes_each_inline_script_and_style() {
        let page = "<style>a{}</style><p><script>x()</script><script type=module>y()</script>";
        let hash = |s: &str| {
            format!(
                "'sha256-{}'",
                base64::engine::general_purpose::STANDARD.encode(Sha256::digest(s))
            )
        };
        assert_eq!(hashes_of(page, "style"), hash("a{}"));
        assert_eq!(
            hashes_of(page, "script"),
            format!("{} {}", hash("x()"), hash("y()"))
        );
        assert_eq!(hashes_of("<p>", "script"), "'none'");
        // The real page has one of each.
        assert_eq!(POLICY.matches("'sha256-").count(), 2, "{}", *POLICY);
    }
}
