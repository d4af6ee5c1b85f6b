//! Partitions end to end (docs/topics-and-groups.md, "Topics"): routing by key as Kafka does, explicit partitions,
//! round robin, pull per partition, growing a topic, the layout on disk, and delivery of every
//! partition in order, through the real binary.

use std::collections::BTreeMap;
use std::time::Duration;

use mmmq_tests::{Broker, Consumer, host_dispatcher, write_dispatchers};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// `toPositive(murmur2(key))` for keys of Kafka's own `UtilsTest.testMurmur2`.
const KAFKA: [(&str, u64); 6] = [
    ("21", 1_173_551_340),
    ("foobar", 1_357_151_166),
    ("a-little-bit-long-string", 1_161_502_112),
    ("a-little-bit-longer-string", 661_178_819),
    (
        "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
        2_088_585_677,
    ),
    ("abc", 479_470_107),
];

async fn produce(broker: &Broker, body: Value) -> (u16, Value) {
    broker.post("/mmmq/messages", &body).await
}

#[tokio::test(flavor = "multi_thread")]
async fn keys_land_where_kafka_puts_them_and_partitions_are_chosen_or_rotated() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    let (status, d) = broker
        .put("/mmmq/topics/orders", &json!({"partitions": 8}))
        .await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(d["partitions"].as_array().unwrap().len(), 8);
    for (key, positive) in KAFKA {
        let (status, a) = produce(
            &broker,
            json!({"topic": "orders", "key": key, "content": {"k": key}}),
        )
        .await;
        assert_eq!(status, 200, "{a}");
        assert_eq!(a["partition"], positive % 8, "{key}");
    }
    // An explicit partition wins over the key; one that does not exist is refused.
    let (status, a) = produce(
        &broker,
        json!({"topic": "orders", "key": "21", "partition": 7, "content": 1}),
    )
    .await;
    assert_eq!((status, a["partition"].clone()), (200, json!(7)));
    let (status, e) = produce(
        &broker,
        json!({"topic": "orders", "partition": 8, "content": 1}),
    )
    .await;
    assert_eq!(status, 400, "{e}");
    assert!(e["error"].as_str().unwrap().contains("partition 8"), "{e}");
    // Without a key, messages go round the partitions.
    let mut counts = BTreeMap::new();
    for n in 0..16 {
        let (_, a) = produce(&broker, json!({"topic": "orders", "content": n})).await;
        *counts.entry(a["partition"].as_u64().unwrap()).or_insert(0) += 1;
    }
    assert_eq!(counts.len(), 8, "{counts:?}");
    assert!(counts.values().all(|&c| c == 2), "{counts:?}");
    // A batch: all or nothing, each result says its partition.
    let (status, e) = broker
        .post(
            "/mmmq/messages/batch",
            &json!([{"topic": "orders", "key": "abc", "content": 1},
                    {"topic": "orders", "partition": 9, "content": 2}]),
        )
        .await;
    assert_eq!(status, 400, "{e}");
    let before = broker.get("/mmmq/topics/orders").await.1;
    let (status, b) = broker
        .post(
            "/mmmq/messages/batch",
            &json!([{"topic": "orders", "key": "abc", "content": 1},
                    {"topic": "orders", "partition": 2, "content": 2}]),
        )
        .await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["results"][0]["partition"], 479_470_107u64 % 8);
    assert_eq!(b["results"][1]["partition"], 2);
    let after = broker.get("/mmmq/topics/orders").await.1;
    let total = |d: &Value| -> u64 {
        d["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["nextOffset"].as_u64().unwrap())
            .sum()
    };
    assert_eq!(
        total(&after),
        total(&before) + 2,
        "the refused batch appended nothing"
    );
    // Pull per partition: offsets are per partition, envelopes say theirs.
    let page = broker
        .get("/mmmq/topics/orders/messages?partition=7&from=0")
        .await
        .1;
    let msgs = page["messages"].as_array().unwrap();
    assert!(!msgs.is_empty());
    assert!(msgs.iter().all(|m| m["partition"] == 7));
    assert!(
        msgs.iter()
            .enumerate()
            .all(|(i, m)| m["offset"] == i as u64)
    );
    let (status, _) = broker.get("/mmmq/topics/orders/messages?partition=8").await;
    assert_eq!(status, 400);
    // The list sums the partitions; `firstOffset` is partition 0's.
    let list = broker.get("/mmmq/topics").await.1;
    assert_eq!(list[0]["partitionCount"], 8);
    assert_eq!(list[0]["nextOffset"], total(&after));
}

/// Eight producers over eight partitions, keyed: a dispatcher gets every message once, and each
/// key's messages in the order they were produced; each envelope carries the partition its key
/// routes to.
#[tokio::test(flavor = "multi_thread")]
async fn per_key_order_holds_under_eight_producers_over_eight_partitions() {
    let tmp = tempfile::tempdir().unwrap();
    let consumer = Consumer::start().await;
    write_dispatchers(
        tmp.path(),
        &json!([host_dispatcher("d", "keyed", consumer.port)]),
    );
    let broker =
        std::sync::Arc::new(Broker::start_with(tmp.path(), &["--default-partitions", "8"]).await);
    let mut tasks = Vec::new();
    for p in 0..8u64 {
        let broker = broker.clone();
        tasks.push(tokio::spawn(async move {
            for seq in 0..50u64 {
                let key = format!("key-{}", (p * 50 + seq) % 16);
                let (status, a) = produce(
                    &broker,
                    json!({"topic": "keyed", "key": key, "content": {"p": p, "seq": seq}}),
                )
                .await;
                assert_eq!(status, 200, "{a}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let got = consumer.wait_for(400, WAIT).await;
    assert_eq!(got.len(), 400);
    let mut seen = std::collections::HashSet::new();
    let mut last: BTreeMap<(String, u64), u64> = BTreeMap::new();
    let mut partition_of: BTreeMap<String, u64> = BTreeMap::new();
    for e in &got {
        let key = e["key"].as_str().unwrap().to_owned();
        let (p, seq) = (
            e["content"]["p"].as_u64().unwrap(),
            e["content"]["seq"].as_u64().unwrap(),
        );
        assert!(seen.insert((p, seq)), "delivered twice: {e}");
        let partition = e["partition"].as_u64().unwrap();
        assert_eq!(
            *partition_of.entry(key.clone()).or_insert(partition),
            partition
        );
        // One producer's messages of one key arrive in the order it produced them.
        if let Some(&before) = last.get(&(key.clone(), p)) {
            assert!(seq > before, "key {key}: {seq} after {before}");
        }
        last.insert((key, p), seq);
    }
    let d = broker.dispatcher_when("d", |d| d["lag"] == 0).await;
    let topics = d["topics"].as_array().unwrap();
    assert_eq!(topics.len(), 8, "one worker per partition: {d}");
    let delivered: u64 = topics
        .iter()
        .map(|t| t["delivered"].as_u64().unwrap())
        .sum();
    assert_eq!(delivered, 400);
}

/// A topic grows (never shrinks): partition 0 keeps its files and messages, the new partitions
/// live in `partitions/{p}/`, dispatchers deliver them, and a restart finds them all.
#[tokio::test(flavor = "multi_thread")]
async fn a_topic_grows_keeps_its_layout_and_survives_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let consumer = Consumer::start().await;
    write_dispatchers(
        tmp.path(),
        &json!([host_dispatcher("d", "grow", consumer.port)]),
    );
    let broker = Broker::start(tmp.path()).await;
    for n in 0..3 {
        broker.produce("grow", json!(n)).await;
    }
    let p0 = tmp.path().join("topics/grow/0000000000000000000.mmm");
    assert!(p0.exists());
    let (status, d) = broker
        .put("/mmmq/topics/grow", &json!({"partitions": 4}))
        .await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(d["partitions"][0]["nextOffset"], 3);
    for p in 1..4 {
        assert!(
            tmp.path()
                .join(format!(
                    "topics/grow/partitions/{p}/0000000000000000000.idx"
                ))
                .exists()
        );
    }
    let (status, e) = broker
        .put("/mmmq/topics/grow", &json!({"partitions": 2}))
        .await;
    assert_eq!(status, 400, "{e}");
    assert!(e["error"].as_str().unwrap().contains("never shrink"), "{e}");
    for p in 1..4u64 {
        let (status, a) = produce(
            &broker,
            json!({"topic": "grow", "partition": p, "content": {"in": p}}),
        )
        .await;
        assert_eq!((status, a["offset"].clone()), (200, json!(0)), "{a}");
    }
    let got = consumer.wait_for(6, WAIT).await;
    let mut parts: Vec<u64> = got
        .iter()
        .map(|e| e["partition"].as_u64().unwrap())
        .collect();
    parts.sort();
    assert_eq!(parts, [0, 0, 0, 1, 2, 3]);
    assert!(broker.terminate().success());
    let broker = Broker::start(tmp.path()).await;
    let d = broker.get("/mmmq/topics/grow").await.1;
    assert_eq!(d["config"]["partitions"], 4);
    let next: Vec<u64> = d["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["nextOffset"].as_u64().unwrap())
        .collect();
    assert_eq!(next, [3, 1, 1, 1]);
    let (_, a) = produce(
        &broker,
        json!({"topic": "grow", "partition": 2, "content": 9}),
    )
    .await;
    assert_eq!(a["offset"], 1);
    // Nothing is delivered again after the clean restart; the new message is.
    let got = consumer.wait_for(7, WAIT).await;
    assert_eq!(got.len(), 7);
    assert_eq!(got[6]["partition"], 2);
}

/// `--default-partitions`: a topic created by its first produce gets that many; one created by
/// `PUT` with fewer gets those (the default is not a floor), and only then may not shrink.
#[tokio::test(flavor = "multi_thread")]
async fn a_topic_created_by_a_produce_gets_the_default_partitions() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start_with(tmp.path(), &["--default-partitions", "3"]).await;
    broker.produce("auto", json!(1)).await;
    let d = broker.get("/mmmq/topics/auto").await.1;
    assert_eq!(d["config"]["partitions"], 3);
    assert_eq!(d["partitions"].as_array().unwrap().len(), 3);
    let (status, d) = broker
        .put("/mmmq/topics/small", &json!({"partitions": 1}))
        .await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(d["partitions"].as_array().unwrap().len(), 1, "{d}");
    assert_eq!(d["config"]["partitions"], 1, "{d}");
    let (status, e) = broker
        .put("/mmmq/topics/auto", &json!({"partitions": 2}))
        .await;
    assert_eq!(status, 400, "{e}");
    let (status, e) = broker.get("/mmmq/topics/auto/messages?partition=x").await;
    assert_eq!(status, 400, "{e}");
}
