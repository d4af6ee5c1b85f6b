//! The optional bearer token: the broker requires it, the clients and the CLI send it, and
//! dispatchers send their own to HTTP consumers.

use std::process::Command;
use std::time::Duration;

use mmmq_client::{Admin, ClientError, Producer};
use mmmq_tests::{Broker, Consumer, mmmq_bin, write_dispatchers};
use serde_json::{Value, json};

/// What answers without the token: health checks and the dashboard's page (which holds no data
/// and asks for the token). `GET` routes answer `HEAD` too.
const OPEN: [(&str, &str); 4] = [
    ("GET", "/healthz"),
    ("HEAD", "/healthz"),
    ("GET", "/"),
    ("HEAD", "/"),
];

/// Every (method, path) of the API's description (`GET /mmmq/openapi.json`, generated from the
/// router), `HEAD` beside each `GET`, path parameters filled in.
async fn described_routes(broker: &Broker, http: &reqwest::Client) -> Vec<(String, String)> {
    let doc: Value = http
        .get(format!("{}/mmmq/openapi.json", broker.url))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut routes = Vec::new();
    for (template, ops) in doc["paths"].as_object().unwrap() {
        // `/mmmq/topics/{topic}` → `/mmmq/topics/x`.
        let path: String = template
            .split('/')
            .map(|s| if s.starts_with('{') { "x" } else { s })
            .collect::<Vec<_>>()
            .join("/");
        for method in ops.as_object().unwrap().keys() {
            let method = method.to_uppercase();
            if method == "GET" {
                routes.push(("HEAD".to_owned(), path.clone()));
            }
            routes.push((method, path.clone()));
        }
    }
    routes
}

/// Every route the API describes refuses a request without the right token, but health and the
/// dashboard's page; other methods are refused too (`405`, or `401` when the path routes `HEAD`).
#[tokio::test(flavor = "multi_thread")]
async fn a_token_guards_every_endpoint_but_health_and_the_dashboard_page() {
    let tmp = tempfile::tempdir().unwrap();
    let consumer = Consumer::start().await;
    write_dispatchers(
        tmp.path(),
        &json!([{"consumerId": "c", "pattern": "**",
                 "host": {"protocol": "HTTP", "address": "127.0.0.1", "port": consumer.port, "authToken": "for-consumer"}}]),
    );
    let broker = Broker::start_with(tmp.path(), &["--auth-token", "s3cret"]).await;
    let http = reqwest::Client::new();
    let url = |p: &str| format!("{}{p}", broker.url);
    let body = json!({"topic": "t", "content": 1});

    let routes = described_routes(&broker, &http).await;
    for open in OPEN {
        assert!(
            routes.iter().any(|(m, p)| (m.as_str(), p.as_str()) == open),
            "{open:?} is described"
        );
    }
    // The description was read (35 when this was written: 23 operations, 12 of them `GET`).
    assert!(routes.len() >= 35, "{routes:?}");
    for (method, path) in &routes {
        let open = OPEN.contains(&(method.as_str(), path.as_str()));
        for auth in [
            None,
            Some("Bearer wrong"),
            Some("s3cret"),
            Some("Bearer s3cre"),
        ] {
            let mut req = http.request(method.parse().unwrap(), url(path)).json(&body);
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            let r = req.send().await.unwrap();
            if open {
                assert_eq!(r.status(), 200, "{method} {path} needs no token");
                continue;
            }
            assert_eq!(r.status(), 401, "{method} {path} with {auth:?}");
            assert_eq!(r.headers()["www-authenticate"], "Bearer");
            if method != "HEAD" {
                let err: Value = r.json().await.unwrap();
                assert!(err["error"].as_str().unwrap().contains("token"), "{err}");
            }
        }
    }
    // Without the token nothing else is told either: a method a path does not serve and a path
    // that does not exist answer `401`, with no `Allow` listing the methods; with it, `405`
    // (with `Allow`) and `404`.
    let paths: std::collections::BTreeSet<&String> = routes.iter().map(|(_, p)| p).collect();
    for path in paths {
        for method in ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"] {
            if routes.iter().any(|(m, p)| m == method && p == path) {
                continue;
            }
            let send = |token: Option<&str>| {
                let mut req = http.request(method.parse().unwrap(), url(path)).json(&body);
                if let Some(t) = token {
                    req = req.bearer_auth(t);
                }
                req.send()
            };
            let r = send(None).await.unwrap();
            let open = ["/", "/healthz"].contains(&path.as_str());
            assert_eq!(r.status(), if open { 405 } else { 401 }, "{method} {path}");
            assert_eq!(r.headers().contains_key("allow"), open, "{method} {path}");
            let r = send(Some("s3cret")).await.unwrap();
            assert_eq!(r.status(), 405, "{method} {path} with the token");
            assert!(r.headers().contains_key("allow"), "{method} {path}");
        }
    }
    let r = http.get(url("/mmmq/nothing")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = http
        .get(url("/mmmq/nothing"))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = http
        .post(url("/mmmq/messages"))
        .bearer_auth("s3cret")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // None of the refused produces stored anything.
    assert_eq!(r.json::<Value>().await.unwrap()["offset"], 0);

    // The clients send it; without it they get an error that says so.
    let producer = Producer::new(&broker.url)
        .unwrap()
        .auth_token(Some("s3cret".into()));
    assert_eq!(producer.send("t", &2).await.unwrap().offset, 1);
    match Producer::new(&broker.url).unwrap().send("t", &3).await {
        Err(ClientError::Unauthorized(_)) => {}
        other => panic!("{other:?}"),
    }
    let topics = Admin::new(&broker.url)
        .unwrap()
        .auth_token(Some("s3cret".into()))
        .topics()
        .await
        .unwrap();
    assert_eq!(topics[0].next_offset, 2);

    // So does the CLI, from MMMQ_AUTH_TOKEN.
    let out = Command::new(mmmq_bin())
        .args(["topics", "--json", "--broker", &broker.url])
        .env("MMMQ_AUTH_TOKEN", "s3cret")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(mmmq_bin())
        .args(["topics", "--broker", &broker.url])
        .env_remove("MMMQ_AUTH_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("401"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The dispatcher sends the consumer its own token.
    consumer.wait_for(2, Duration::from_secs(30)).await;
    let seen = consumer.authorization.lock().clone();
    assert!(
        seen.iter()
            .all(|a| a.as_deref() == Some("Bearer for-consumer")),
        "{seen:?}"
    );
}

/// A broker that listens beyond loopback without a token says so when it starts, for HTTP and
/// for Kafka; with the token, or on loopback, it does not.
#[tokio::test(flavor = "multi_thread")]
async fn serving_beyond_loopback_without_a_token_warns() {
    const HTTP: &str = "listening beyond loopback without --auth-token";
    const KAFKA: &str = "the Kafka listener is reachable beyond loopback without --auth-token";
    let cases: [(&[&str], bool); 3] = [
        (
            &["--listen", "0.0.0.0:0", "--kafka-listen", "0.0.0.0:0"],
            true,
        ),
        (
            &[
                "--listen",
                "0.0.0.0:0",
                "--kafka-listen",
                "0.0.0.0:0",
                "--auth-token",
                "t",
            ],
            false,
        ),
        (&["--kafka-listen", "127.0.0.1:0"], false),
    ];
    for (args, warns) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let (mut child, addr, log) = mmmq_tests::spawn_serve(tmp.path(), args);
        assert!(addr.is_some(), "{args:?}: {}", log.lock());
        mmmq_tests::eventually(Duration::from_secs(30), "kafka listening", || {
            log.lock().contains("kafka listening").then_some(())
        })
        .await;
        let text = log.lock().clone();
        assert_eq!(text.contains(HTTP), warns, "{args:?}: {text}");
        assert_eq!(text.contains(KAFKA), warns, "{args:?}: {text}");
        let _ = child.kill();
        let _ = child.wait();
    }
}
