//! Outbound HTTP from plugins (docs/plugins.md, "WebAssembly handlers"): requests through `wasi:http` reach
//! the origins of `plugin.allowedHosts` and no others, a plugin without it has no network, and a
//! request counts against `timeoutMs`. The enricher example enriches through a local API.

use std::time::{Duration, Instant};

use mmmq_tests::{
    Broker, deploy_plugin, eventually, plugin_dispatcher, plugin_wasm, write_dispatchers,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

/// A local API: `/hello` says `hi`, `/slow` answers after 5 s, `/customers/c-7` is a gold
/// customer, any other customer is 404.
async fn api() -> (u16, tokio::task::JoinHandle<()>) {
    use axum::routing::get;
    let app = axum::Router::new()
        .route("/hello", get(|| async { "hi" }))
        .route(
            "/count",
            axum::routing::post(|body: axum::body::Bytes| async move {
                format!("{} bytes", body.len())
            }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                "late"
            }),
        )
        .route(
            "/customers/{id}",
            get(
                |axum::extract::Path(id): axum::extract::Path<String>| async move {
                    if id == "c-7" {
                        Ok(axum::Json(json!({"tier": "gold"})))
                    } else {
                        Err(axum::http::StatusCode::NOT_FOUND)
                    }
                },
            ),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (port, task)
}

/// A server that answers as soon as it has a request's headers, before its body, then reads and
/// drops the body until the client closes ("lingering close", RFC 9112 §9.6). A server that
/// closes (or half-closes) while the body is still coming makes the host's HTTP client fail the
/// request (`hyper::Error(IncompleteMessage)`, seen in CI with a server that closed at once) — a
/// race of that server's, not something the SDK can answer.
async fn early_answer_server() -> (u16, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = vec![0u8; 64 * 1024];
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let answer =
                    "HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nearly";
                if conn.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
                while let Ok(n) = conn.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            });
        }
    });
    (port, task)
}

fn log_line(broker: &Broker, needle: &str) -> impl FnMut() -> Option<String> {
    let log = broker.log.clone();
    let needle = needle.to_owned();
    move || {
        log.lock()
            .lines()
            .find(|l| l.contains(&needle))
            .map(str::to_owned)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_reach_allowed_origins_only_and_count_against_the_timeout() {
    let (port, _api) = api().await;
    let (other_port, _other) = api().await;
    let (early_port, _early) = early_answer_server().await;
    let tmp = tempfile::tempdir().unwrap();
    deploy_plugin(tmp.path(), &plugin_wasm("testbed", None), "testbed.wasm");
    write_dispatchers(
        tmp.path(),
        &json!([
            plugin_dispatcher(
                "net",
                "calls",
                "testbed.wasm",
                json!({"maxNackRetries": 0, "plugin": {"timeoutMs": 1000, "allowedHosts": [
                    format!("http://127.0.0.1:{port}"),
                    format!("http://127.0.0.1:{early_port}"),
                ]}})
            ),
            plugin_dispatcher("offline", "offline", "testbed.wasm", json!({}))
        ]),
    );
    let broker = Broker::start(tmp.path()).await;
    let url = |p: u16, path: &str| format!("http://127.0.0.1:{p}{path}");
    broker
        .produce("calls", json!({"do": "http", "url": url(port, "/hello")}))
        .await;
    eventually(
        WAIT,
        "the allowed answer",
        log_line(&broker, "http status=200 body=hi"),
    )
    .await;

    // A body reaches the server whole.
    broker
        .produce(
            "calls",
            json!({"do": "http", "url": url(port, "/count"), "post": 1_500_000}),
        )
        .await;
    eventually(
        WAIT,
        "the posted body",
        log_line(&broker, "http status=200 body=1500000 bytes"),
    )
    .await;
    // An answer that comes while the body is still being written is an answer.
    broker
        .produce(
            "calls",
            json!({"do": "http", "url": url(early_port, "/early"), "post": 1_500_000}),
        )
        .await;
    eventually(
        WAIT,
        "the answer before the body",
        log_line(&broker, "http status=200 body=early"),
    )
    .await;

    broker
        .produce(
            "calls",
            json!({"do": "http", "url": url(other_port, "/hello")}),
        )
        .await;
    let refused = eventually(WAIT, "the refusal", log_line(&broker, "http error=")).await;
    assert!(refused.contains("HttpRequestDenied"), "{refused}");
    let why = eventually(
        WAIT,
        "the reason",
        log_line(&broker, "refused: not in plugin.allowedHosts"),
    )
    .await;
    assert!(why.contains(&format!("127.0.0.1:{other_port}")), "{why}");

    broker
        .produce("offline", json!({"do": "http", "url": url(port, "/hello")}))
        .await;
    eventually(
        WAIT,
        "no network",
        log_line(&broker, "no plugin.allowedHosts"),
    )
    .await;

    // A user in the authority (`user@host`) is refused, though the host after the `@` is allowed:
    // the connection would go to the whole authority, not to the host that was checked.
    broker
        .produce(
            "calls",
            json!({"do": "http", "url": format!("http://user@127.0.0.1:{port}/hello")}),
        )
        .await;
    let why = eventually(
        WAIT,
        "the reason",
        log_line(&broker, "refused: the URL carries a user"),
    )
    .await;
    assert!(
        why.contains(&format!("request to http://127.0.0.1:{port} refused")),
        "{why}"
    );
    broker.dispatcher_when("net", |s| s["delivered"] == 5).await;
    let denied = broker
        .log
        .lock()
        .lines()
        .filter(|l| {
            l.contains("consumer_id=\"net\"")
                && l.contains("http error=")
                && l.contains("HttpRequestDenied")
        })
        .count();
    assert_eq!(
        denied, 2,
        "the other origin and the user were refused to the guest"
    );

    // A server that answers after 5 s cannot hold a call of 1 s: a request still waiting when the
    // call's time is up ends the call as a timeout, like any other wait past `timeoutMs`.
    let started = Instant::now();
    broker
        .produce("calls", json!({"do": "http", "url": url(port, "/slow")}))
        .await;
    let s = broker
        .dispatcher_when("net", |s| s["lag"] == 0 && s["deadLettered"] == 1)
        .await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(3000),
        "the slow call took {took:?}: {s}"
    );
    assert_eq!(s["delivered"], 5, "{s}");
    let dlq = broker.pull_until("__dlq.net", 1).await;
    let reason = dlq[0]["content"]["reason"].as_str().unwrap();
    assert_eq!(reason, "plugin timed out after 1000 ms", "{dlq:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_enricher_example_enriches_through_a_local_api() {
    let (port, _api) = api().await;
    let tmp = tempfile::tempdir().unwrap();
    deploy_plugin(tmp.path(), &plugin_wasm("enricher", None), "enricher.wasm");
    write_dispatchers(
        tmp.path(),
        &json!([plugin_dispatcher(
            "enrich",
            "orders",
            "enricher.wasm",
            json!({"plugin": {
                "allowedHosts": [format!("http://127.0.0.1:{port}")],
                "config": {"url": format!("http://127.0.0.1:{port}/customers/")}
            }})
        )]),
    );
    let broker = Broker::start(tmp.path()).await;
    for (key, customer) in [("a", "c-7"), ("b", "nobody")] {
        let (code, body) = broker
            .post(
                "/mmmq/messages",
                &json!({"topic": "orders", "key": key, "content": {"customerId": customer, "n": 1}}),
            )
            .await;
        assert_eq!(code, 200, "{body}");
    }
    let s = broker
        .dispatcher_when("enrich", |s| s["lag"] == 0 && s["deadLettered"] == 1)
        .await;
    assert_eq!(s["delivered"], 1, "{s}");
    let out = broker.pull_until("orders.enriched", 1).await;
    assert_eq!(out.len(), 1);
    assert_eq!(out[0]["key"], "a");
    assert_eq!(
        out[0]["content"],
        json!({"customerId": "c-7", "n": 1, "customer": {"tier": "gold"}})
    );
    let dlq: Vec<Value> = broker.pull_all("__dlq.enrich").await;
    assert!(
        dlq[0]["content"]["reason"]
            .as_str()
            .unwrap()
            .contains("not found"),
        "{dlq:?}"
    );
}
