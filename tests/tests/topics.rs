//! The topic API and retention end to end (docs/topics-and-groups.md, "Topics"), against the real binary.

use std::time::Duration;

use mmmq_tests::{Broker, Consumer, eventually, host_dispatcher, write_dispatchers};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

async fn detail(broker: &Broker, topic: &str) -> Value {
    let (status, d) = broker.get(&format!("/mmmq/topics/{topic}")).await;
    assert_eq!(status, 200, "{d}");
    d
}

async fn passes(broker: &Broker) -> f64 {
    broker.metric("mmmq_retention_passes_total").await
}

/// Waits for `n` more complete retention passes.
async fn wait_passes(broker: &Broker, n: f64) {
    let start = passes(broker).await;
    let deadline = std::time::Instant::now() + WAIT;
    while passes(broker).await < start + n {
        assert!(std::time::Instant::now() < deadline, "retention never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_topic_api_creates_shows_configures_and_refuses_bad_input_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    let (status, d) = broker
        .put(
            "/mmmq/topics/orders",
            &json!({"retentionMs": 60000, "retentionBytes": 1000000}),
        )
        .await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(
        d["config"],
        json!({"partitions": 1, "retentionMs": 60000, "retentionBytes": 1000000,
               "keepUndelivered": false, "dedupWindowMs": 120000})
    );
    assert_eq!(
        d["partitions"],
        json!([{"partition": 0, "firstOffset": 0, "nextOffset": 0, "segments": 1, "bytes": 0}])
    );
    // Only the fields named change; null keeps forever.
    let (status, d) = broker
        .put("/mmmq/topics/orders", &json!({"retentionMs": null}))
        .await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(d["config"]["retentionMs"], Value::Null);
    assert_eq!(d["config"]["retentionBytes"], 1000000);
    broker.produce("orders", json!({"n": 1})).await;
    let list = broker.get("/mmmq/topics").await.1;
    let orders = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "orders")
        .unwrap()
        .clone();
    assert_eq!(orders["partitionCount"], 1);
    assert_eq!(orders["firstOffset"], 0);
    assert_eq!(orders["nextOffset"], 1);

    for (body, field) in [
        (json!({"partitions": 0}), "partitions"),
        (json!({"partitions": 2000}), "partitions"),
        (json!({"retentionMs": -5}), "retentionMs"),
        (json!({"retentionMs": "1d"}), "retentionMs"),
        (json!({"retentionBytes": 0}), "retentionBytes"),
        (json!({"keepUndelivered": 1}), "keepUndelivered"),
        (json!({"dedupWindowMs": 1e12}), "dedupWindowMs"),
        (json!({"retention": 5}), "retention"),
    ] {
        let (status, e) = broker.put("/mmmq/topics/orders", &body).await;
        assert_eq!(status, 400, "{body}: {e}");
        assert!(e["error"].as_str().unwrap().contains(field), "{body}: {e}");
    }
    let (status, e) = broker.put("/mmmq/topics/x", &json!([1])).await;
    assert_eq!(status, 400, "{e}");
    let (status, _) = broker.put("/mmmq/topics/bad%20name", &json!({})).await;
    assert_eq!(status, 400);
    // A refused PUT creates nothing.
    let (status, _) = broker.get("/mmmq/topics/x").await;
    assert_eq!(status, 404);
    let (status, e) = broker.delete("/mmmq/topics/nope").await;
    assert_eq!(status, 404, "{e}");
    // The configuration is on disk, and survives a restart.
    let stored: Value = serde_json::from_slice(
        &std::fs::read(tmp.path().join("topics/orders/topic.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(stored["retentionBytes"], 1000000);
    broker.terminate();
    let broker = Broker::start(tmp.path()).await;
    let d = detail(&broker, "orders").await;
    assert_eq!(d["config"]["retentionMs"], Value::Null);
    assert_eq!(d["config"]["retentionBytes"], 1000000);
    assert_eq!(d["partitions"][0]["nextOffset"], 1);
}

/// Retention by time deletes whole sealed segments (and seals an expired tail); a dispatcher that
/// delivered everything loses nothing, one that starts behind the horizon continues at the first
/// offset, counting exactly what it skipped; pulls from 0 start there.
#[tokio::test(flavor = "multi_thread")]
async fn retention_by_time_with_a_dispatcher_ahead_and_one_behind_the_horizon() {
    let tmp = tempfile::tempdir().unwrap();
    let ahead = Consumer::start().await;
    let behind = Consumer::start().await;
    write_dispatchers(
        tmp.path(),
        &json!([host_dispatcher("ahead", "ret.*", ahead.port)]),
    );
    let broker = Broker::start_with(
        tmp.path(),
        &["--segment-max-bytes", "300", "--retention-check-ms", "20"],
    )
    .await;
    for n in 0..50 {
        broker.produce("ret.t", json!({"n": n})).await;
    }
    ahead.wait_for(50, WAIT).await;
    assert!(detail(&broker, "ret.t").await["partitions"][0]["segments"].as_u64() > Some(5));
    let (status, _) = broker
        .put("/mmmq/topics/ret.t", &json!({"retentionMs": 1}))
        .await;
    assert_eq!(status, 200);
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let p = &detail(&broker, "ret.t").await["partitions"][0];
        if p["firstOffset"] == 50 {
            assert_eq!(p["nextOffset"], 50);
            assert_eq!(p["bytes"], 0);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "retention never deleted: {p}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Only the tail segment's files are left.
    let files = std::fs::read_dir(tmp.path().join("topics/ret.t"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".mmm"))
        .collect::<Vec<_>>();
    assert_eq!(files, vec!["0000000000000000050.mmm".to_owned()]);
    let page = broker.get("/mmmq/topics/ret.t/messages?from=0").await.1;
    assert_eq!(page["messages"], json!([]));
    assert_eq!(page["next"], 50);

    // Keep what comes next; a new dispatcher starts behind the horizon.
    broker
        .put("/mmmq/topics/ret.t", &json!({"retentionMs": null}))
        .await;
    write_dispatchers(
        tmp.path(),
        &json!([
            host_dispatcher("ahead", "ret.*", ahead.port),
            host_dispatcher("behind", "ret.*", behind.port)
        ]),
    );
    let (status, r) = broker.post("/mmmq/admin/reload", &json!({})).await;
    assert_eq!(status, 200, "{r}");
    for n in 50..55 {
        broker.produce("ret.t", json!({"n": n})).await;
    }
    let got = behind.wait_for(5, WAIT).await;
    let offsets: Vec<u64> = got.iter().map(|e| e["offset"].as_u64().unwrap()).collect();
    assert_eq!(offsets, (50..55).collect::<Vec<_>>());
    let offsets: Vec<u64> = ahead
        .wait_for(55, WAIT)
        .await
        .iter()
        .map(|e| e["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(
        offsets,
        (0..55).collect::<Vec<_>>(),
        "nothing lost or repeated"
    );
    let d = broker
        .dispatcher_when("behind", |d| d["topics"][0]["nextOffset"] == 55)
        .await;
    assert_eq!(d["topics"][0]["skipped"], 50);
    let a = broker
        .dispatcher_when("ahead", |d| d["topics"][0]["nextOffset"] == 55)
        .await;
    assert_eq!(a["topics"][0]["skipped"], 0);
    assert!(
        broker
            .log
            .lock()
            .contains("retention deleted messages this dispatcher had not delivered"),
        "the skip is logged"
    );
    assert_eq!(
        broker
            .metric("mmmq_messages_skipped_by_retention_total")
            .await,
        50.0
    );
}

/// Retention by size keeps a partition under `retentionBytes` (plus its tail), deleting the oldest
/// whole segments; what remains is every message from the first offset on.
#[tokio::test(flavor = "multi_thread")]
async fn retention_by_size_deletes_the_oldest_segments() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start_with(
        tmp.path(),
        &["--segment-max-bytes", "300", "--retention-check-ms", "20"],
    )
    .await;
    broker
        .put("/mmmq/topics/size", &json!({"retentionBytes": 1000}))
        .await;
    for n in 0..100 {
        broker.produce("size", json!({"n": n})).await;
    }
    wait_passes(&broker, 2.0).await;
    let p = detail(&broker, "size").await["partitions"][0].clone();
    let first = p["firstOffset"].as_u64().unwrap();
    assert!(first > 0, "{p}");
    assert!(p["bytes"].as_u64().unwrap() <= 1000 + 400, "{p}");
    let all = broker.pull_from("size", 0).await;
    let ns: Vec<u64> = all
        .iter()
        .map(|e| e["content"]["n"].as_u64().unwrap())
        .collect();
    assert_eq!(ns, (first..100).collect::<Vec<_>>());
}

/// `keepUndelivered`: a consumer that is down holds retention back; once it is back and has
/// every message, retention deletes them.
#[tokio::test(flavor = "multi_thread")]
async fn keep_undelivered_holds_messages_for_a_consumer_that_is_down() {
    let tmp = tempfile::tempdir().unwrap();
    let port = mmmq_tests::free_port();
    write_dispatchers(tmp.path(), &json!([host_dispatcher("late", "keep", port)]));
    let broker = Broker::start_with(
        tmp.path(),
        &["--segment-max-bytes", "200", "--retention-check-ms", "20"],
    )
    .await;
    broker
        .put(
            "/mmmq/topics/keep",
            &json!({"retentionMs": 1, "keepUndelivered": true}),
        )
        .await;
    for n in 0..30 {
        broker.produce("keep", json!({"n": n})).await;
    }
    wait_passes(&broker, 3.0).await;
    assert_eq!(
        detail(&broker, "keep").await["partitions"][0]["firstOffset"],
        0
    );
    let consumer = Consumer::start_on(port, std::sync::Arc::new(|_| mmmq_tests::Answer::Ack)).await;
    let got = consumer.wait_for(30, WAIT).await;
    let offsets: Vec<u64> = got.iter().map(|e| e["offset"].as_u64().unwrap()).collect();
    assert_eq!(offsets, (0..30).collect::<Vec<_>>());
    let deadline = std::time::Instant::now() + WAIT;
    while detail(&broker, "keep").await["partitions"][0]["firstOffset"] != 30 {
        assert!(
            std::time::Instant::now() < deadline,
            "delivered messages were never deleted"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let d = broker.dispatcher_when("late", |_| true).await;
    assert_eq!(d["topics"][0]["skipped"], 0);
}

/// Deleting a topic while producers and a dispatcher are busy: producers get answers (200, or 503
/// for the moment the topic is going), never lose an acknowledged message of the new topic, and
/// the dispatcher delivers each incarnation of the topic from offset 0, in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_topic_deleted_under_load_goes_whole_and_comes_back_at_offset_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let consumer = Consumer::start().await;
    write_dispatchers(
        tmp.path(),
        &json!([host_dispatcher("d", "busy", consumer.port)]),
    );
    let broker =
        std::sync::Arc::new(Broker::start_with(tmp.path(), &["--segment-max-bytes", "2000"]).await);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut producers = Vec::new();
    for p in 0..4u64 {
        let (broker, stop) = (broker.clone(), stop.clone());
        producers.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut seq = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let id = format!("{p}-{seq}");
                seq += 1;
                let (status, body) = broker
                    .post(
                        "/mmmq/messages",
                        &json!({"topic": "busy", "content": {"id": id}}),
                    )
                    .await;
                match status {
                    200 => acked.push((id, body["offset"].as_u64().unwrap())),
                    503 => {}
                    other => panic!("a produce during a delete answered {other}: {body}"),
                }
            }
            acked
        }));
    }
    consumer.wait_for(100, WAIT).await;
    let (status, body) = broker.delete("/mmmq/topics/busy").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"deleted": "busy"}));
    // Producers go on for a while against the new topic.
    let after = consumer.envelopes().len();
    eventually(WAIT, "deliveries of the new topic", || {
        consumer
            .envelopes()
            .iter()
            .skip(after)
            .any(|e| e["offset"] == 20)
            .then_some(())
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut acked = std::collections::HashSet::new();
    for p in producers {
        acked.extend(p.await.unwrap().into_iter().map(|(id, _)| id));
    }
    let stored = broker.pull_from("busy", 0).await;
    for m in &stored {
        assert!(
            acked.contains(m["content"]["id"].as_str().unwrap()),
            "a stored message nobody was told about: {m}"
        );
    }
    let n = stored.len() as u64;
    assert_eq!(
        detail(&broker, "busy").await["partitions"][0]["nextOffset"],
        n
    );
    let got = consumer.wait_for(0, WAIT).await;
    // The deliveries split into two runs, each consecutive from 0: the old topic, then the new.
    let offsets: Vec<u64> = got.iter().map(|e| e["offset"].as_u64().unwrap()).collect();
    let restart = offsets
        .windows(2)
        .position(|w| w[1] != w[0] + 1)
        .map(|i| i + 1)
        .expect("the new topic was delivered from 0");
    assert_eq!(offsets[restart], 0);
    assert!(
        offsets[..restart]
            .iter()
            .enumerate()
            .all(|(i, &o)| o == i as u64)
    );
    let new_run = &got[restart..];
    assert!(
        new_run
            .iter()
            .enumerate()
            .all(|(i, e)| e["offset"] == i as u64)
    );
    // Every message of the new topic is what the dispatcher delivered for it, in order.
    let delivered = consumer
        .wait_for(restart + n as usize, WAIT)
        .await
        .split_off(restart);
    let contents = |v: &[Value]| v.iter().map(|e| e["content"].clone()).collect::<Vec<_>>();
    assert_eq!(contents(&delivered), contents(&stored));
    // The old topic's files are gone, trash included.
    let trash = tmp.path().join("trash");
    assert_eq!(std::fs::read_dir(&trash).unwrap().count(), 0);
}

/// A root dir written before topics had a configuration opens as it is, with the defaults, and a
/// clean stop leaves its files byte for byte as they were.
#[tokio::test(flavor = "multi_thread")]
async fn a_root_dir_from_before_topic_configuration_opens_unchanged_with_the_defaults() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("topics/legacy");
    std::fs::create_dir_all(&dir).unwrap();
    let mut data = Vec::new();
    let mut index = Vec::new();
    for n in 0..3u64 {
        index.extend_from_slice(&(data.len() as u64).to_be_bytes());
        let payload = format!(r#"{{"timestamp":1764400000000,"key":null,"content":{{"n":{n}}}}}"#);
        data.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        data.extend_from_slice(&crc32c::crc32c(payload.as_bytes()).to_be_bytes());
        data.extend_from_slice(payload.as_bytes());
    }
    let (data_path, index_path) = (
        dir.join("0000000000000000000.mmm"),
        dir.join("0000000000000000000.idx"),
    );
    std::fs::write(&data_path, &data).unwrap();
    std::fs::write(&index_path, &index).unwrap();
    // The messages are far older than the default retention; a broker that keeps them forever
    // by flag must not delete them.
    let broker = Broker::start_with(tmp.path(), &["--default-retention-ms", "forever"]).await;
    let d = detail(&broker, "legacy").await;
    assert_eq!(d["config"]["retentionMs"], Value::Null);
    assert_eq!(d["config"]["partitions"], 1);
    assert_eq!(d["config"]["dedupWindowMs"], 120000);
    assert_eq!(d["partitions"][0]["nextOffset"], 3);
    let all = broker.pull_all("legacy").await;
    assert_eq!(all.len(), 3);
    assert!(broker.terminate().success());
    assert_eq!(std::fs::read(&data_path).unwrap(), data);
    assert_eq!(std::fs::read(&index_path).unwrap(), index);
    assert!(!dir.join("topic.json").exists());
    // With the default retention (14 days), the same old messages go.
    let broker = Broker::start_with(tmp.path(), &["--retention-check-ms", "20"]).await;
    let d = detail(&broker, "legacy").await;
    assert_eq!(d["config"]["retentionMs"], 1209600000u64);
    let deadline = std::time::Instant::now() + WAIT;
    while detail(&broker, "legacy").await["partitions"][0]["firstOffset"] != 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "old messages were kept"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A crash after a delete renamed the topic away but before its files were removed leaves them in
/// the trash, which the next boot empties.
#[tokio::test(flavor = "multi_thread")]
async fn the_trash_of_an_interrupted_delete_is_emptied_at_boot() {
    let tmp = tempfile::tempdir().unwrap();
    let left = tmp.path().join("trash/gone.1764400000000000000");
    std::fs::create_dir_all(left.join("checkpoints")).unwrap();
    std::fs::write(left.join("0000000000000000000.mmm"), b"x").unwrap();
    let broker = Broker::start(tmp.path()).await;
    assert_eq!(
        std::fs::read_dir(tmp.path().join("trash")).unwrap().count(),
        0
    );
    assert_eq!(broker.get("/mmmq/topics").await.1, json!([]));
}
