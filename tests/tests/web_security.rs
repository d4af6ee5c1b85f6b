//! What a web page can do to a broker (docs/http-api.md, "What a web page can do"), against the real
//! binary: bodies must say what they are (no CORS-free cross-site writes), requests from other
//! sites are refused, a DNS-rebinding `Host` reads nothing, and the dashboard's page cannot be
//! framed or run code it does not ship. The budgets a client cannot pass are in `http_budgets.rs`.

use mmmq_tests::{Broker, error_of};
use serde_json::json;

const MESSAGE: &str = r#"{"topic":"t","content":1}"#;

/// A request with a body that does not say it is JSON (what a cross-site `fetch` or form can send
/// without a CORS preflight) is refused with `415`, whatever the route; a plugin upload must be
/// `application/wasm`; a body-less POST needs no type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_must_say_they_are_json_or_wasm() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    for ct in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let (status, _, body) = broker
            .send("POST", "/mmmq/messages", &[], Some((MESSAGE, ct)))
            .await;
        assert_eq!(status, 415, "{ct:?}: {body}");
        assert!(error_of(&body).contains("application/json"), "{body}");
    }
    for (method, path) in [
        ("PUT", "/mmmq/topics/t"),
        ("POST", "/mmmq/admin/reload"),
        ("POST", "/mmmq/groups/g/commit"),
    ] {
        let (status, _, body) = broker.send(method, path, &[], Some(("{}", None))).await;
        assert_eq!(status, 415, "{method} {path}: {body}");
    }
    let json_utf8 = Some("Application/JSON; charset=utf-8");
    let (status, _, body) = broker
        .send("POST", "/mmmq/messages", &[], Some((MESSAGE, json_utf8)))
        .await;
    assert_eq!(status, 200, "{body}");
    // A plugin upload is a component, nothing else.
    for ct in [
        None,
        Some("application/json"),
        Some("application/octet-stream"),
    ] {
        let (status, _, body) = broker
            .send("PUT", "/mmmq/plugins/p", &[], Some(("\0asm", ct)))
            .await;
        assert_eq!(status, 415, "{ct:?}: {body}");
        assert!(error_of(&body).contains("application/wasm"), "{body}");
    }
    let wasm = Some("application/wasm");
    let (status, _, body) = broker
        .send("PUT", "/mmmq/plugins/p", &[], Some(("\0asm", wasm)))
        .await;
    assert_eq!(status, 400, "not a component: {body}");
    // No body, no type needed (curl -X POST …/reload).
    let (status, _, body) = broker.send("POST", "/mmmq/admin/reload", &[], None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        broker.pull_all("t").await.len(),
        1,
        "only the JSON produce stored"
    );
    assert_eq!(broker.metric("mmmq_http_requests_refused_total").await, 9.0);
}

/// A browser request from another origin or site is refused with `403` before anything happens,
/// body-less POSTs included (a form's CSRF); the broker's own pages and non-browser clients are
/// served; a link from elsewhere still opens the dashboard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_from_other_sites_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    let own = broker.url.clone();
    let json = Some("application/json");
    for origin in [
        "http://evil.example",
        "null",
        "http://localhost:1",
        &own.replace("127.0.0.1", "localhost"),
    ] {
        let h = [("origin", origin)];
        let (status, _, body) = broker
            .send("POST", "/mmmq/messages", &h, Some((MESSAGE, json)))
            .await;
        assert_eq!(status, 403, "{origin}: {body}");
        assert!(error_of(&body).contains("another site"), "{body}");
        let (status, _, body) = broker.send("POST", "/mmmq/admin/reload", &h, None).await;
        assert_eq!(status, 403, "{origin}: a body-less POST: {body}");
    }
    for site in ["cross-site", "same-site"] {
        for (method, path) in [
            ("GET", "/mmmq/topics"),
            ("GET", "/mmmq/groups/g/messages?member=m"),
            ("POST", "/mmmq/admin/reload"),
            ("GET", "/healthz"),
        ] {
            let h = [("sec-fetch-site", site), ("sec-fetch-mode", "no-cors")];
            let (status, _, body) = broker.send(method, path, &h, None).await;
            assert_eq!(status, 403, "{site} {method} {path}: {body}");
        }
        // Following a link to the dashboard is fine (the page holds no data); to anything else not.
        let nav = [("sec-fetch-site", site), ("sec-fetch-mode", "navigate")];
        assert_eq!(broker.send("GET", "/", &nav, None).await.0, 200, "{site}");
        let (status, _, _) = broker
            .send("GET", "/mmmq/groups/g/messages?member=m", &nav, None)
            .await;
        assert_eq!(status, 403, "{site} navigation");
    }
    let (_, groups) = broker.get("/mmmq/groups").await;
    assert_eq!(groups, json!([]), "no member joined by a refused poll");
    // The broker's own origin (what the dashboard sends) and a typed URL are served.
    let h = [("origin", own.as_str()), ("sec-fetch-site", "same-origin")];
    let (status, _, body) = broker
        .send("POST", "/mmmq/messages", &h, Some((MESSAGE, json)))
        .await;
    assert_eq!(status, 200, "{body}");
    let h = [("sec-fetch-site", "none"), ("sec-fetch-mode", "navigate")];
    assert_eq!(broker.send("GET", "/mmmq/topics", &h, None).await.0, 200);
    assert_eq!(
        broker.pull_all("t").await.len(),
        1,
        "only the same-origin produce stored"
    );
}

/// While the broker listens on loopback, a `Host` that is not a loopback name (a DNS-rebinding
/// page's) is refused on every path; `--allowed-hosts` adds names. On another address there is
/// no check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_loopback_only_loopback_and_allowed_host_names_are_served() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start_with(
        tmp.path(),
        &["--allowed-hosts", "mmmq.internal,Other.Example"],
    )
    .await;
    let port = broker.addr().rsplit(':').next().unwrap().to_owned();
    for host in [
        format!("evil.example:{port}"),
        "127.0.0.1.evil.example".into(),
        "localhost.evil.example".into(),
        "evil-localhost".into(),
        format!("mmmq.internal.evil:{port}"),
        "[::2]".into(),
    ] {
        for path in ["/healthz", "/", "/mmmq/topics", "/metrics"] {
            let (status, _, body) = broker.send("GET", path, &[("host", &host)], None).await;
            assert_eq!(status, 403, "{host} {path}: {body}");
            if path != "/" {
                assert!(error_of(&body).contains("--allowed-hosts"), "{body}");
            }
        }
    }
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "LOCALHOST".into(),
        "app.localhost:1".into(),
        "127.1.2.3".into(),
        format!("[::1]:{port}"),
        format!("mmmq.internal:{port}"),
        "other.example".into(),
    ] {
        let (status, _, body) = broker
            .send("GET", "/mmmq/topics", &[("host", &host)], None)
            .await;
        assert_eq!(status, 200, "{host}: {body}");
    }
    // Listening on every address: reached by name, no Host check.
    let tmp = tempfile::tempdir().unwrap();
    let open = Broker::start_with(tmp.path(), &["--listen", "0.0.0.0:0"]).await;
    let (status, _, body) = open
        .send("GET", "/mmmq/topics", &[("host", "evil.example")], None)
        .await;
    assert_eq!(status, 200, "{body}");
}

/// The dashboard's page may not be framed (clickjacking) and runs only the script and style it
/// ships (a Content-Security-Policy of hashes, no network beyond the broker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_page_cannot_be_framed_or_run_foreign_code() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    let (status, headers, _) = broker.send("GET", "/", &[], None).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-frame-options"], "DENY");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    let csp = headers["content-security-policy"].to_str().unwrap();
    for part in [
        "default-src 'none'",
        "frame-ancestors 'none'",
        "connect-src 'self'",
        "script-src 'sha256-",
        "style-src 'sha256-",
    ] {
        assert!(csp.contains(part), "{part} in {csp}");
    }
    assert!(!csp.contains("unsafe"), "{csp}");
}
