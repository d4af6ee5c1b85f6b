//! Idempotent produce (docs/delivery.md, "Idempotent produce"): an `id` produced again within the topic's
//! `dedupWindowMs` stores nothing and answers the first one's position — across partitions, inside
//! a batch, across a restart and a SIGKILL — and is forgotten after the window.

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
