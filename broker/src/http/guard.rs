//! What every request passes before any route (docs/http-api.md, "What a web page can do"), in this order:
//!
//! 1. **Host.** While the broker listens on a loopback address (or `--allowed-hosts` is given),
//!    the `Host` must be a loopback name or address (`localhost`, `*.localhost`, `127.x.x.x`,
//!    `[::1]`, any port) or an allowed name: a DNS-rebinding page, whose requests carry its own
//!    name, reads nothing (`403`).
//! 2. **Site.** A request whose `Origin` is not `http(s)://{Host}`, or whose `Sec-Fetch-Site` is
//!    anything but `same-origin` or `none`, comes from another page: `403`. That stops the
//!    cross-site requests a page can make without a CORS preflight, body-less POSTs
//!    (`/mmmq/admin/reload`) and `GET`s with side effects (a group poll joins the group)
//!    included. Another port of the same host is `same-site`, not `same-origin`, and is refused
//!    too. The one exception is following a link to the dashboard's page (`GET /`, a
//!    navigation), which holds no data.
//! 3. **Token.** With `--auth-token`, every path but `/` and `/healthz` needs it, compared as
//!    SHA-256 digests in constant time (neither its length nor a prefix leaks through timing);
//!    without it even an unknown path or a method a path does not serve answers `401`, so nothing
//!    about the routes is told.
//! 4. **Content-Type.** A request with a body (a `Content-Length` above 0 or a
//!    `Transfer-Encoding`) must say it is `application/json` (parameters allowed), or
//!    `application/wasm` for `PUT /mmmq/plugins/{name}`: `415`. The types a page may send without
//!    a preflight (`text/plain`, forms) are never accepted.
//!
//! Non-browser clients send neither `Origin` nor `Sec-Fetch-Site` and are unaffected by 2.
//!
//! It is a plain tower service rather than an axum middleware: a request that passes costs a few
//! header lookups and no allocation (a middleware boxes a future per request).

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::http::{HeaderMap, Method, Request, header};
use axum::response::{IntoResponse, Response};
use futures_util::future::{Either, Ready, ready};
use sha2::{Digest, Sha256};

use super::ApiError;
use crate::metrics::{HttpMetrics, Refusal};

const JSON: &str = "application/json";
const WASM: &str = "application/wasm";
/// Raft's traffic between brokers (docs/cluster.md, "Raft traffic") is binary.
const BINARY: &str = "application/octet-stream";

/// The checks, as configured.
pub(crate) struct Guard {
    /// `Some` when the `Host` is checked: the names allowed besides loopback ones, lowercased.
    hosts: Option<Vec<String>>,
    /// SHA-256 of `--auth-token`.
    token: Option<[u8; 32]>,
    metrics: Arc<HttpMetrics>,
}

impl Guard {
    /// The checks for a broker listening on a loopback address or not, with `--allowed-hosts`
    /// and `--auth-token`.
    pub(crate) fn new(
        loopback: bool,
        allowed_hosts: &[String],
        token: Option<&str>,
        metrics: Arc<HttpMetrics>,
    ) -> Self {
        let check_hosts = loopback || !allowed_hosts.is_empty();
        Self {
            hosts: check_hosts.then(|| {
                allowed_hosts
                    .iter()
                    .map(|h| {
                        let h = h.trim().to_ascii_lowercase();
                        h.strip_suffix('.').map(str::to_owned).unwrap_or(h)
                    })
                    .filter(|h| !h.is_empty())
                    .collect()
            }),
            token: token.map(|t| Sha256::digest(t.as_bytes()).into()),
            metrics,
        }
    }

    /// Passes the request, or says why not.
    fn check<B>(&self, request: &Request<B>) -> Result<(), (Refusal, ApiError)> {
        let headers = request.headers();
        let host = headers.get(header::HOST).map(|h| h.to_str().unwrap_or(""));
        if let (Some(allowed), Some(host)) = (&self.hosts, host)
            && !host_allowed(host, allowed)
        {
            return Err((
                Refusal::Host,
                ApiError::Forbidden(format!(
                    "Host {host:?} is not served: while the broker listens on a loopback \
                     address it answers only loopback names and those of --allowed-hosts \
                     (DNS rebinding)"
                )),
            ));
        }
        if let Some(origin) = headers.get(header::ORIGIN)
            && !same_origin(origin.as_bytes(), host)
        {
            return Err((
                Refusal::Site,
                ApiError::Forbidden(format!(
                    "a request from another site (Origin {:?}) is refused",
                    String::from_utf8_lossy(origin.as_bytes())
                )),
            ));
        }
        if let Some(site) = headers.get("sec-fetch-site")
            && !matches!(site.as_bytes(), b"same-origin" | b"none")
            && !opens_the_dashboard(request)
        {
            return Err((
                Refusal::Site,
                ApiError::Forbidden(format!(
                    "a request from another site (Sec-Fetch-Site {:?}) is refused",
                    String::from_utf8_lossy(site.as_bytes())
                )),
            ));
        }
        if let Some(digest) = &self.token
            && !matches!(request.uri().path(), "/" | "/healthz")
            && !token_matches(headers, digest)
        {
            return Err((Refusal::Token, ApiError::Unauthorized));
        }
        if has_body(headers) {
            let want = if is_plugin_upload(request) {
                WASM
            } else if request.uri().path().starts_with("/mmmq/internal/raft/") {
                BINARY
            } else {
                JSON
            };
            let given = headers.get(header::CONTENT_TYPE).map(|v| v.as_bytes());
            if !given.is_some_and(|t| is_type(t, want)) {
                return Err((
                    Refusal::ContentType,
                    ApiError::UnsupportedMediaType {
                        want,
                        given: given.map_or_else(
                            || "none".to_owned(),
                            |t| format!("{:?}", String::from_utf8_lossy(t)),
                        ),
                    },
                ));
            }
        }
        Ok(())
    }
}

/// Whether `host` (a `Host` header: name or address, maybe a port) is a loopback name or
/// address, or one of `allowed` (lowercased, without a trailing dot).
fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        // `[::1]:8080`
        Some(rest) => {
            let Some((ip, _port)) = rest.split_once(']') else {
                return false;
            };
            return ip
                .parse::<Ipv6Addr>()
                .is_ok_and(|ip| IpAddr::V6(ip).to_canonical().is_loopback())
                || allowed
                    .iter()
                    .any(|a| a.eq_ignore_ascii_case(&host[..ip.len() + 2]));
        }
        None => match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        },
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    if let Ok(ip) = name.parse::<Ipv4Addr>() {
        if ip.is_loopback() {
            return true;
        }
    } else {
        let bytes = name.as_bytes();
        let localhost = b".localhost";
        if name.eq_ignore_ascii_case("localhost")
            || (bytes.len() > localhost.len()
                && bytes[bytes.len() - localhost.len()..].eq_ignore_ascii_case(localhost))
        {
            return true;
        }
    }
    allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

/// Whether `origin` is this broker's own: `http://{Host}` (or `https://`, behind a proxy that
/// ends TLS).
fn same_origin(origin: &[u8], host: Option<&str>) -> bool {
    let Some(host) = host else { return false };
    origin
        .strip_prefix(b"http://")
        .or_else(|| origin.strip_prefix(b"https://"))
        .is_some_and(|rest| rest.eq_ignore_ascii_case(host.as_bytes()))
}

/// Following a link to the dashboard's page: a top-level navigation, `GET /`.
fn opens_the_dashboard<B>(request: &Request<B>) -> bool {
    matches!(*request.method(), Method::GET | Method::HEAD)
        && request.uri().path() == "/"
        && request
            .headers()
            .get("sec-fetch-mode")
            .is_some_and(|m| m == "navigate")
}

/// `Authorization: Bearer <token>` with the token whose SHA-256 is `digest`. Digests are
/// compared, not tokens, so the time taken tells nothing about the token's length.
fn token_matches(headers: &HeaderMap, digest: &[u8; 32]) -> bool {
    use subtle::ConstantTimeEq;
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .unwrap_or_default();
    let given: [u8; 32] = Sha256::digest(given).into();
    given.ct_eq(digest).into()
}

fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0")
}

/// `PUT /mmmq/plugins/{name}`.
fn is_plugin_upload<B>(request: &Request<B>) -> bool {
    request.method() == Method::PUT
        && request
            .uri()
            .path()
            .strip_prefix("/mmmq/plugins/")
            .is_some_and(|name| !name.is_empty() && !name.contains('/'))
}

/// Whether a `Content-Type` value is `want` (any case, parameters allowed); for JSON, any
/// `application/…+json` too (no page can send one without a preflight either).
fn is_type(content_type: &[u8], want: &str) -> bool {
    let essence = content_type
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    if essence.eq_ignore_ascii_case(want.as_bytes()) {
        return true;
    }
    let (prefix, suffix) = (b"application/", b"+json");
    want == JSON
        && essence.len() > prefix.len() + suffix.len()
        && essence[..prefix.len()].eq_ignore_ascii_case(prefix)
        && essence[essence.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
}

/// Puts a [`Guard`] in front of a service.
#[derive(Clone)]
pub(crate) struct GuardLayer(pub(crate) Arc<Guard>);

impl<S> tower::Layer<S> for GuardLayer {
    type Service = Guarded<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Guarded {
            inner,
            guard: self.0.clone(),
        }
    }
}

/// A service (the router) behind the checks of docs/http-api.md, "What a web page can do". It wraps the
/// router as a whole: `Router::layer` would wrap each route, after routing, and a method a path
/// does not serve would then still answer with the `Allow` header listing the others.
#[derive(Clone)]
pub struct Guarded<S> {
    inner: S,
    guard: Arc<Guard>,
}

impl<S, B> tower::Service<Request<B>> for Guarded<S>
where
    S: tower::Service<Request<B>, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<Ready<Result<Response, Infallible>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        match self.guard.check(&request) {
            Ok(()) => Either::Right(self.inner.call(request)),
            Err((reason, error)) => {
                self.guard.metrics.refused(reason);
                let mut response = error.into_response();
                if has_body(request.headers()) {
                    super::closes(&mut response);
                }
                Either::Left(ready(Ok(response)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_and_allowed_ones_pass_the_host_check() {
        let allowed = vec!["mmmq.internal".to_owned(), "[fd00::1]".to_owned()];
        for host in [
            "localhost",
            "LocalHost:8080",
            "localhost.",
            "a.b.localhost:1",
            "127.0.0.1",
            "127.255.0.9:80",
            "[::1]",
            "[::1]:8080",
            "[::ffff:127.0.0.1]:1",
            "mmmq.internal",
            "MMMQ.internal.:9",
            "[fd00::1]",
            "[FD00::1]:8080",
        ] {
            assert!(host_allowed(host, &allowed), "{host}");
        }
        for host in [
            "",
            "evil.example",
            "localhost.evil.example",
            "evillocalhost",
            "127.0.0.1.evil.example",
            "128.0.0.1",
            "0.0.0.0",
            "[::2]",
            "[::1",
            "mmmq.internal.evil",
            "localhost:80:80",
            "ŀocalhost",
        ] {
            assert!(!host_allowed(host, &allowed), "{host}");
        }
    }

    #[test]
    fn content_types_are_matched_by_their_essence() {
        for ok in [
            "application/json",
            "Application/JSON; charset=utf-8",
            " application/json ;x=1",
            "application/merge-patch+json",
        ] {
            assert!(is_type(ok.as_bytes(), JSON), "{ok}");
        }
        for bad in [
            "",
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "text/json+json",
            "application/jsonx",
            "+json",
        ] {
            assert!(!is_type(bad.as_bytes(), JSON), "{bad}");
        }
        assert!(is_type(b"application/wasm", WASM));
        assert!(!is_type(b"application/json", WASM));
        assert!(!is_type(b"application/wasm+json", WASM));
    }

    #[test]
    fn the_token_matches_exactly() {
        let digest: [u8; 32] = Sha256::digest(b"s3cret").into();
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            h
        };
        assert!(token_matches(&with("Bearer s3cret"), &digest));
        for wrong in [
            "Bearer s3cre",
            "Bearer s3cret2",
            "Bearer ",
            "s3cret",
            "bearer s3cret",
        ] {
            assert!(!token_matches(&with(wrong), &digest), "{wrong}");
        }
        assert!(!token_matches(&HeaderMap::new(), &digest));
    }
}
