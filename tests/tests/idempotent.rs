//! Idempotent produce (docs/delivery.md, "Idempotent produce"): an `id` produced again within the topic's
//! `dedupWindowMs` stores nothing and answers the first one's position — across partitions, inside
//! a batch, across a restart and a SIGKILL — and is forgotten after the window. Boot restores the
//! window from each topic's id snapshot and reads only the messages stored after it
//! (docs/storage.md, "Produce-id snapshots").

use std::time::Duration;

use mmmq_tests::Broker;
use serde_json::{Value, json};

async fn produce(broker: &Broker, body: Value) -> Value {
    let (status, a) = broker.post("/mmmq/messages", &body).await;
    assert_eq!(status, 200, "{a}");
    a
}

fn total(detail: &Value) -> u64 {
    detail["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["nextOffset"].as_u64().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_repeated_id_stores_once_across_partitions_batches_and_restarts() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    broker
        .put("/mmmq/topics/idem", &json!({"partitions": 4}))
        .await;
    // Keyless: a retry would be routed to another partition; the check is per topic.
    let first = produce(
        &broker,
        json!({"topic": "idem", "id": "order-1", "content": 1}),
    )
    .await;
    assert_eq!(first.get("duplicate"), None, "{first}");
    for _ in 0..3 {
        let again = produce(
            &broker,
            json!({"topic": "idem", "id": "order-1", "content": 1}),
        )
        .await;
        assert_eq!(again["duplicate"], true, "{again}");
        assert_eq!(
            (again["partition"].clone(), again["offset"].clone()),
            (first["partition"].clone(), first["offset"].clone())
        );
    }
    // Inside one batch, and against what was stored before.
    let (status, b) = broker
        .post(
            "/mmmq/messages/batch",
            &json!([{"topic": "idem", "id": "a", "content": "a"},
                    {"topic": "idem", "id": "b", "content": "b"},
                    {"topic": "idem", "id": "a", "content": "a"},
                    {"topic": "idem", "id": "order-1", "content": 1},
                    {"topic": "idem", "content": "no id"}]),
        )
        .await;
    assert_eq!(status, 200, "{b}");
    let r = b["results"].as_array().unwrap();
    assert_eq!(r[2]["duplicate"], true);
    assert_eq!(
        (r[2]["partition"].clone(), r[2]["offset"].clone()),
        (r[0]["partition"].clone(), r[0]["offset"].clone())
    );
    assert_eq!(r[3]["duplicate"], true);
    assert_eq!(r[3]["offset"], first["offset"]);
    assert!(r[0].get("duplicate").is_none() && r[4].get("duplicate").is_none());
    let d = broker.get("/mmmq/topics/idem").await.1;
    assert_eq!(total(&d), 4, "order-1, a, b and the one without an id");
    // The envelope carries the id.
    let p = first["partition"].as_u64().unwrap();
    let page = broker
        .get(&format!("/mmmq/topics/idem/messages?partition={p}&from=0"))
        .await
        .1;
    assert!(
        page["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["id"] == "order-1"),
        "{page}"
    );
    // A clean restart, then a SIGKILL: the window is rebuilt from the log.
    assert!(broker.terminate().success());
    let broker = Broker::start(tmp.path()).await;
    let again = produce(&broker, json!({"topic": "idem", "id": "b", "content": "b"})).await;
    assert_eq!(again["duplicate"], true, "{again}");
    let late = produce(
        &broker,
        json!({"topic": "idem", "id": "late", "content": 2}),
    )
    .await;
    broker.kill();
    let broker = Broker::start(tmp.path()).await;
    let again = produce(
        &broker,
        json!({"topic": "idem", "id": "late", "content": 2}),
    )
    .await;
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["offset"], late["offset"]);
    assert_eq!(total(&broker.get("/mmmq/topics/idem").await.1), 5);
}

/// What `broker`'s boot said restoring the topics' ids took: ids loaded from snapshots and
/// messages read from the logs (its log line is waited for: stderr is read by another thread).
async fn restored(broker: &Broker) -> (u64, u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let line = loop {
        if let Some(l) = broker
            .log
            .lock()
            .lines()
            .find(|l| l.contains("topics restored"))
        {
            break l.to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no \"topics restored\" line"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let field = |name: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
    };
    (field("ids_loaded"), field("messages_scanned"))
}

/// Where the topic's id snapshot says each partition was read to, summed (its layout:
/// docs/storage.md, "Produce-id snapshots").
fn snapshot_read_to(root: &std::path::Path, topic: &str) -> Option<u64> {
    let b = std::fs::read(root.join("topics").join(topic).join("ids")).ok()?;
    if b.len() < 40 || &b[..8] != b"MMMQIDS\0" {
        return None;
    }
    let partitions = u32::from_be_bytes(b[36..40].try_into().unwrap()) as usize;
    let read_to = (0..partitions).map(|p| {
        let at = 40 + 8 * p;
        u64::from_be_bytes(b[at..at + 8].try_into().unwrap())
    });
    Some(read_to.sum())
}

/// Produces `n` messages with ids `{prefix}-0`… to `topic` in one batch; returns each id with
/// where it went.
async fn produce_ids(broker: &Broker, topic: &str, prefix: &str, n: usize) -> Vec<(String, Value)> {
    let items: Vec<Value> = (0..n)
        .map(|i| json!({"topic": topic, "id": format!("{prefix}-{i}"), "content": i}))
        .collect();
    let (status, b) = broker
        .post("/mmmq/messages/batch", &Value::from(items))
        .await;
    assert_eq!(status, 200, "{b}");
    let results = b["results"].as_array().unwrap();
    (0..n)
        .map(|i| {
            assert!(results[i].get("duplicate").is_none(), "{b}");
            (format!("{prefix}-{i}"), results[i].clone())
        })
        .collect()
}

/// Every id of `stored` is a duplicate at its first position.
async fn assert_duplicates(broker: &Broker, topic: &str, stored: &[(String, Value)]) {
    let items: Vec<Value> = stored
        .iter()
        .map(|(id, _)| json!({"topic": topic, "id": id, "content": 0}))
        .collect();
    let (status, b) = broker
        .post("/mmmq/messages/batch", &Value::from(items))
        .await;
    assert_eq!(status, 200, "{b}");
    for ((id, first), again) in stored.iter().zip(b["results"].as_array().unwrap()) {
        assert_eq!(again["duplicate"], true, "{id}: {again}");
        assert_eq!(
            (&again["partition"], &again["offset"]),
            (&first["partition"], &first["offset"]),
            "{id}"
        );
    }
}

/// A clean stop writes each topic's id snapshot: the next boot has every id back without
/// reading a message. A crash after a retention pass wrote one: the next boot reads only the
/// messages stored after it, and still knows every id.
#[tokio::test(flavor = "multi_thread")]
async fn ids_come_back_from_the_snapshot_and_the_messages_after_it() {
    let tmp = tempfile::tempdir().unwrap();
    let args = ["--retention-check-ms", "5000"];
    let broker = Broker::start_with(tmp.path(), &args).await;
    broker
        .put("/mmmq/topics/snap", &json!({"partitions": 3}))
        .await;
    let mut stored = produce_ids(&broker, "snap", "before-stop", 20).await;
    assert!(broker.terminate().success());
    assert_eq!(snapshot_read_to(tmp.path(), "snap"), Some(20));
    let broker = Broker::start_with(tmp.path(), &args).await;
    assert_eq!(restored(&broker).await, (20, 0));
    assert_duplicates(&broker, "snap", &stored).await;

    // A retention pass writes the snapshot of a topic that advanced ...
    stored.extend(produce_ids(&broker, "snap", "before-pass", 10).await);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while snapshot_read_to(tmp.path(), "snap") != Some(30) {
        assert!(
            std::time::Instant::now() < deadline,
            "no snapshot of 30 messages was written"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ... and what comes after it is read from the log after a crash.
    stored.extend(produce_ids(&broker, "snap", "after-pass", 3).await);
    broker.kill();
    let read_to = snapshot_read_to(tmp.path(), "snap").unwrap();
    assert_eq!(
        read_to, 30,
        "no pass ran between the last produce and the kill"
    );
    let broker = Broker::start_with(tmp.path(), &args).await;
    assert_eq!(restored(&broker).await, (30, 3));
    assert_duplicates(&broker, "snap", &stored).await;
    assert_eq!(total(&broker.get("/mmmq/topics/snap").await.1), 33);
}

/// Boot after a clean stop does not read the messages of the window: a topic whose recent
/// messages carry no id costs it nothing (before snapshots every one of them was read).
#[tokio::test(flavor = "multi_thread")]
async fn a_boot_after_a_clean_stop_reads_no_message_to_restore_the_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    broker
        .put("/mmmq/topics/plain", &json!({"partitions": 2}))
        .await;
    broker.produce_keyed("plain", 4, 0..500).await;
    assert!(broker.terminate().success());
    let broker = Broker::start(tmp.path()).await;
    assert_eq!(restored(&broker).await, (0, 0));
    assert_eq!(total(&broker.get("/mmmq/topics/plain").await.1), 2000);
    // A crash with no snapshot (the file removed) reads the window again, as it always did.
    broker.kill();
    std::fs::remove_file(tmp.path().join("topics/plain/ids")).unwrap();
    let broker = Broker::start(tmp.path()).await;
    assert_eq!(restored(&broker).await, (0, 2000));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_id_is_forgotten_after_the_window_and_bad_ids_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    broker
        .put("/mmmq/topics/w", &json!({"dedupWindowMs": 300}))
        .await;
    let first = produce(&broker, json!({"topic": "w", "id": "x", "content": 1})).await;
    // Within the window it is a duplicate; once the window has passed, it is stored again.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let a = produce(&broker, json!({"topic": "w", "id": "x", "content": 1})).await;
        if a.get("duplicate").is_none() {
            assert_eq!(a["offset"], first["offset"].as_u64().unwrap() + 1);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never forgotten");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (id, why) in [
        (json!(""), "id"),
        (json!("x".repeat(129)), "id"),
        (json!(5), "id"),
    ] {
        let (status, e) = broker
            .post(
                "/mmmq/messages",
                &json!({"topic": "w", "id": id, "content": 1}),
            )
            .await;
        assert_eq!(status, 400, "{e}");
        assert!(e["error"].as_str().unwrap().contains(why), "{e}");
    }
    // 128 characters (not bytes) is fine.
    let ok = produce(
        &broker,
        json!({"topic": "w", "id": "é".repeat(128), "content": 1}),
    )
    .await;
    assert!(ok.get("duplicate").is_none());
}

/// `mmmq-client`'s `Producer` gives every message an id; a record sent again with its id is
/// stored once; the CLI's `--id` does the same.
#[tokio::test(flavor = "multi_thread")]
async fn the_client_and_the_cli_produce_with_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    let producer = mmmq_client::Producer::new(&broker.url).unwrap();
    let a = producer.send("cid", &json!({"n": 1})).await.unwrap();
    let b = producer.send("cid", &json!({"n": 1})).await.unwrap();
    assert_eq!(
        (a.offset, b.offset, b.duplicate),
        (0, 1, false),
        "fresh ids each time"
    );
    let rec = mmmq_client::Record::new("cid", json!({"n": 2})).with_id("fixed");
    let r1 = producer
        .send_batch(std::slice::from_ref(&rec))
        .await
        .unwrap();
    let r2 = producer.send_batch(&[rec]).await.unwrap();
    assert!(!r1[0].duplicate && r2[0].duplicate);
    assert_eq!(r1[0].offset, r2[0].offset);
    let page = broker.get("/mmmq/topics/cid/messages").await.1;
    let ids: Vec<&Value> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["id"])
        .collect();
    assert!(ids.iter().all(|id| id.is_string()), "{page}");
    let run = || {
        std::process::Command::new(mmmq_tests::mmmq_bin())
            .args([
                "produce",
                "--topic",
                "cid",
                "--id",
                "cli-1",
                "--broker",
                &broker.url,
                "7",
            ])
            .output()
            .unwrap()
    };
    let first: Value = serde_json::from_slice(&run().stdout).unwrap();
    let second: Value = serde_json::from_slice(&run().stdout).unwrap();
    assert_eq!(first.get("duplicate"), None);
    assert_eq!(second["duplicate"], true);
    assert_eq!(first["offset"], second["offset"]);
}
