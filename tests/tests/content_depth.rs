//! Content at the deepest nesting the broker accepts must parse, with serde_json's default limit
//! and with Python's `json`, inside every wrapper the broker puts it in: a pull page, a batched
//! delivery, a dead letter (pulled, and delivered in a batch to a dispatcher of dead letters).

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use mmmq_tests::{Answer, Broker, Consumer, write_dispatchers};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// `depth` nested arrays around a number.
fn nested(depth: usize) -> String {
    format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
}

/// Whether serde_json (default recursion limit) and Python's `json` both parse `text`.
fn parses_everywhere(text: &str) -> Result<(), String> {
    serde_json::from_str::<Value>(text).map_err(|e| format!("serde_json: {e}"))?;
    let mut python = Command::new("python3")
        .args(["-c", "import json, sys; json.loads(sys.stdin.read())"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    use std::io::Write;
    python
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = python.wait_with_output().unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("python: {}", String::from_utf8_lossy(&out.stderr)))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn content_at_the_depth_limit_parses_in_every_wrapper() {
    let tmp = tempfile::tempdir().unwrap();
    // `batched` takes everything in batches; `refuser` dead-letters it; `dlq` takes the dead
    // letters in batches.
    let batched = Consumer::start().await;
    let refuser = Consumer::start_on(0, Arc::new(|_| Answer::Nack)).await;
    let dlq = Consumer::start().await;
    let host = |port: u16| json!({"protocol": "HTTP", "address": "127.0.0.1", "port": port});
    write_dispatchers(
        tmp.path(),
        &json!([
            {"consumerId": "batched", "pattern": "deep", "batchMaxMessages": 10, "host": host(batched.port)},
            {"consumerId": "refuser", "pattern": "deep", "maxNackRetries": 0, "host": host(refuser.port)},
            {"consumerId": "dlq", "pattern": "__dlq.*", "batchMaxMessages": 10, "host": host(dlq.port)},
        ]),
    );
    let broker = Broker::start(tmp.path()).await;
    let limit = mmmq_core::MAX_CONTENT_DEPTH;
    let deepest = nested(limit);
    let message = |content: String| format!(r#"{{"topic":"deep","content":{content}}}"#);
    let (status, body) = broker.post_raw("/mmmq/messages", message(deepest)).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = broker
        .post_raw("/mmmq/messages", message(nested(limit + 1)))
        .await;
    assert_eq!(status, 400, "one level more is refused: {body}");

    // A pull page.
    let page = broker.get_text("/mmmq/topics/deep/messages").await;
    parses_everywhere(&page).unwrap_or_else(|e| panic!("pull page: {e}"));
    // A batched delivery (the consumer's raw body).
    batched.wait_for(1, WAIT).await;
    // A dead letter, pulled, and delivered in a batch to a dispatcher of dead letters.
    broker.pull_until("__dlq.refuser", 1).await;
    let page = broker.get_text("/mmmq/topics/__dlq.refuser/messages").await;
    parses_everywhere(&page).unwrap_or_else(|e| panic!("dead letter pull page: {e}"));
    dlq.wait_for(1, WAIT).await;
    for (what, consumer) in [("batched delivery", &batched), ("dead letters", &dlq)] {
        for body in consumer.requests() {
            let text = body.to_string();
            parses_everywhere(&text).unwrap_or_else(|e| panic!("{what}: {e}"));
        }
    }
}
