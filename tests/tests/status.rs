//! What people read of a dispatcher (docs/http-api.md, "HTTP API"; docs/operations.md,
//! "Command-line client"): its last error says when it happened and whether delivery has worked since, in `GET /mmmq/dispatchers`
//! and in `mmmq dispatchers`; tables show the first line of a reason, `--json` the whole.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use mmmq_tests::{Answer, Broker, Consumer, host_dispatcher, testbed_root, write_dispatchers};
use serde_json::{Value, json};

/// The LAST ERROR cell of dispatcher `id` in `mmmq dispatchers` (the last column).
fn last_error_cell(broker: &Broker, id: &str) -> String {
    let out = broker.cli_ok(["dispatchers"]);
    let text = String::from_utf8(out.stdout).unwrap();
    let header = text.lines().next().unwrap();
    let at = header.find("LAST ERROR").expect("a LAST ERROR column");
    let row = text
        .lines()
        .find(|l| l.starts_with(&format!("{id} ")))
        .unwrap_or_else(|| panic!("no row for {id}:\n{text}"));
    row[at..].to_owned()
}

/// A consumer answers `500` until it is fixed: the error carries its time and stays open (in
/// the dispatcher and in its partition); once a delivery is ACKed it shows as resolved, with the
/// same message and time.
#[tokio::test(flavor = "multi_thread")]
async fn a_last_error_says_when_and_shows_resolved_once_delivery_works_again() {
    let tmp = tempfile::tempdir().unwrap();
    let fixed = Arc::new(AtomicBool::new(false));
    let f = fixed.clone();
    let consumer = Consumer::start_on(
        0,
        Arc::new(move |_: &Value| {
            if f.load(Ordering::SeqCst) {
                Answer::Ack
            } else {
                Answer::Error
            }
        }),
    )
    .await;
    write_dispatchers(
        tmp.path(),
        &json!([host_dispatcher("flaky", "jobs", consumer.port)]),
    );
    let broker = Broker::start(tmp.path()).await;
    let before = mmmq_core::now_ms();
    broker.produce("jobs", json!({"n": 0})).await;
    let failing = broker
        .dispatcher_when("flaky", |s| s["lastError"].is_string())
        .await;
    let at = failing["lastErrorAt"].as_u64().expect("lastErrorAt");
    assert!((before..=mmmq_core::now_ms()).contains(&at), "{failing}");
    assert_eq!(failing["lastErrorResolvedAt"], Value::Null, "{failing}");
    let partition = &failing["topics"][0];
    assert_eq!(partition["lastError"], failing["lastError"], "{failing}");
    assert_eq!(partition["lastErrorAt"], at, "{failing}");
    assert_eq!(partition["lastErrorResolvedAt"], Value::Null, "{failing}");
    let cell = last_error_cell(&broker, "flaky");
    assert!(cell.contains("s ago: "), "{cell}");
    assert!(!cell.contains("(resolved)"), "{cell}");

    fixed.store(true, Ordering::SeqCst);
    let resolved = broker
        .dispatcher_when("flaky", |s| {
            s["delivered"] == 1 && !s["lastErrorResolvedAt"].is_null()
        })
        .await;
    let message = failing["lastError"].clone();
    assert_eq!(resolved["lastError"], message, "{resolved}");
    let resolved_at = resolved["lastErrorResolvedAt"]
        .as_u64()
        .expect("lastErrorResolvedAt");
    assert!(resolved_at >= resolved["lastErrorAt"].as_u64().unwrap());
    let partition = &resolved["topics"][0];
    assert_eq!(partition["lastErrorResolvedAt"], resolved_at, "{resolved}");
    let cell = last_error_cell(&broker, "flaky");
    assert!(
        cell.ends_with(" (resolved)") && cell.contains("s ago: "),
        "{cell}"
    );
}

/// A dead letter whose reason has several lines: `mmmq dlq list` and `mmmq dispatchers` show its
/// first line, `--json` the whole; the next ACK resolves the dispatcher's error.
#[tokio::test(flavor = "multi_thread")]
async fn tables_show_the_first_line_of_a_reason_and_json_the_whole() {
    let tmp = tempfile::tempdir().unwrap();
    testbed_root(tmp.path(), "p", "orders", json!({}));
    let broker = Broker::start(tmp.path()).await;
    let reason = "bad order\nfield x is missing";
    broker
        .produce("orders", json!({"do": "deadletter", "reason": reason}))
        .await;
    broker
        .dispatcher_when("p", |s| s["deadLettered"] == 1)
        .await;

    let out = broker.cli_ok(["dlq", "list", "p"]);
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[1].ends_with("  bad order…"), "{text}");
    let out = broker.cli_ok(["dlq", "list", "p", "--json"]);
    let dead: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(dead["content"]["reason"], reason);

    let cell = last_error_cell(&broker, "p");
    assert!(
        cell.contains("s ago: offset 0 dead-lettered after 1 attempts: bad order…")
            && !cell.contains("(resolved)"),
        "{cell}"
    );
    let out = broker.cli_ok(["dispatchers", "--json"]);
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        all[0]["lastError"]
            .as_str()
            .unwrap()
            .ends_with("bad order\nfield x is missing"),
        "{all}"
    );

    broker.produce("orders", json!({"n": 1})).await;
    broker.dispatcher_when("p", |s| s["delivered"] == 1).await;
    let cell = last_error_cell(&broker, "p");
    assert!(cell.ends_with("bad order… (resolved)"), "{cell}");
}
