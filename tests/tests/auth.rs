//! The optional bearer token: the broker requires it, the clients and the CLI send it, and
//! dispatchers send their own to HTTP consumers.

use std::process::Command;
use std::time::Duration;

use mmmq_client::{Admin, ClientError, Producer};
use mmmq_tests::{Broker, Consumer, mmmq_bin, write_dispatchers};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread")]
async fn a_token_guards_every_endpoint_but_health() {
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

    for (method, path) in [
        ("POST", "/mmmq/messages"),
        ("POST", "/mmmq/messages/batch"),
        ("GET", "/mmmq/topics"),
        ("GET", "/mmmq/topics/t/messages"),
        ("GET", "/mmmq/dispatchers"),
        ("POST", "/mmmq/admin/reload"),
        ("GET", "/metrics"),
    ] {
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
            assert_eq!(r.status(), 401, "{method} {path} with {auth:?}");
            assert_eq!(r.headers()["www-authenticate"], "Bearer");
            let err: Value = r.json().await.unwrap();
            assert!(err["error"].as_str().unwrap().contains("token"), "{err}");
        }
    }
    let r = http.get(url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200, "health needs no token");
    let r = http
        .post(url("/mmmq/messages"))
        .bearer_auth("s3cret")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

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
