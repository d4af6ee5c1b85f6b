//! The edges of a topic's life (docs/topics-and-groups.md, "Topics"), against the real binary: concurrent
//! administration, a delete whose request goes away, topic ids across a delete, what
//! `keepUndelivered` holds for groups and for dispatchers being replaced, and the topic cap.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mmmq_tests::{Broker, Consumer, host_dispatcher, write_dispatchers};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

async fn detail(broker: &Broker, topic: &str) -> Value {
    let (status, d) = broker.get(&format!("/mmmq/topics/{topic}")).await;
    assert_eq!(status, 200, "{d}");
    d
}

async fn wait_passes(broker: &Broker, more: f64) {
    let until = broker.metric("mmmq_retention_passes_total").await + more;
    mmmq_tests::eventually_async(WAIT, "retention passes", || async {
        (broker.metric("mmmq_retention_passes_total").await >= until).then_some(())
    })
    .await;
}

/// A broker with small segments and a fast retention pass, and `topic` expiring at once under
/// `keepUndelivered`.
async fn start_keeping(root: &std::path::Path, topic: &str) -> Broker {
    let broker = Broker::start_with(
        root,
        &["--segment-max-bytes", "200", "--retention-check-ms", "20"],
    )
    .await;
    let (s, body) = broker
        .put(
            &format!("/mmmq/topics/{topic}"),
            &json!({"retentionMs": 1, "keepUndelivered": true}),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    broker
}

/// Four identical grows sent at once (they raced: both read the old count and opened the same new
/// partitions — `File exists`, or two writers on one directory) all answer 200 while producers
/// write, and every acknowledged message reads back where its answer said.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_grows_all_succeed_and_lose_no_acknowledged_message() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Arc::new(Broker::start(tmp.path()).await);
    broker.produce("grow", json!({"seed": true})).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producer = {
        let (broker, stop) = (broker.clone(), stop.clone());
        tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || acked.len() < 50 {
                let (s, a) = broker
                    .post(
                        "/mmmq/messages",
                        &json!({"topic": "grow", "key": format!("k{n}"), "content": {"n": n}}),
                    )
                    .await;
                assert_eq!(s, 200, "{a}");
                acked.push((
                    a["partition"].as_u64().unwrap(),
                    a["offset"].as_u64().unwrap(),
                    n,
                ));
                n += 1;
            }
            acked
        })
    };
    for size in [4, 8] {
        let grows: Vec<_> = (0..4)
            .map(|_| {
                let broker = broker.clone();
                tokio::spawn(async move {
                    broker
                        .put("/mmmq/topics/grow", &json!({"partitions": size}))
                        .await
                })
            })
            .collect();
        for g in grows {
            let (status, body) = g.await.unwrap();
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["config"]["partitions"], size);
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let acked = producer.await.unwrap();
    assert_eq!(
        detail(&broker, "grow").await["partitions"]
            .as_array()
            .unwrap()
            .len(),
        8
    );
    for (partition, offset, n) in acked {
        let (s, page) = broker
            .get(&format!(
                "/mmmq/topics/grow/messages?partition={partition}&from={offset}&max=1"
            ))
            .await;
        assert_eq!(s, 200);
        let m = &page["messages"][0];
        assert_eq!(m["offset"], offset, "partition {partition}: {page}");
        assert_eq!(
            m["content"]["n"], n,
            "partition {partition} offset {offset}"
        );
    }
}

/// A `DELETE` whose client goes away before the answer (the delete waits for a dispatcher's slow
/// delivery) still runs to its end: the name is free again (it answered 503 "being deleted"
/// until a restart), and the topic does not come back at the next boot.
#[tokio::test(flavor = "multi_thread")]
async fn a_delete_whose_request_is_dropped_still_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    let consumer = Consumer::start_slow(
        0,
        Arc::new(|_| mmmq_tests::Answer::Ack),
        Duration::from_millis(1500),
    )
    .await;
    write_dispatchers(
        tmp.path(),
        &json!([host_dispatcher("slow", "gone", consumer.port)]),
    );
    let broker = Broker::start(tmp.path()).await;
    broker.produce("gone", json!({"old": 0})).await;
    broker.produce("gone", json!({"old": 1})).await;
    // The dispatcher is in its first (slow) delivery: the delete waits for it.
    consumer.wait_for(1, WAIT).await;
    let dropped = broker
        .http
        .delete(format!("{}/mmmq/topics/gone", broker.url))
        .timeout(Duration::from_millis(100))
        .send()
        .await;
    assert!(dropped.is_err(), "the delete answered before its timeout");
    let deadline = Instant::now() + WAIT;
    let answer = loop {
        let (s, a) = broker
            .post(
                "/mmmq/messages",
                &json!({"topic": "gone", "content": {"new": 0}}),
            )
            .await;
        if s == 200 {
            break a;
        }
        assert_eq!(s, 503, "{a}");
        assert!(
            Instant::now() < deadline,
            "the topic stayed 'being deleted': {a}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(answer["offset"], 0, "a new topic starts at offset 0");
    broker.terminate();
    let broker = Broker::start(tmp.path()).await;
    let all = broker.pull_all("gone").await;
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(all[0]["content"], json!({"new": 0}));
}

/// Each incarnation of a topic has its own id (docs/topics-and-groups.md, "Topics"), shown in its detail, the list
/// and every envelope; a group that read the old incarnation starts the new one at offset 0
/// (it kept the old committed offset and position: the new messages were never delivered and
/// its lag showed 0), and a commit naming the old id is refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_topic_created_again_has_a_new_id_and_groups_start_it_from_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    for n in 0..5 {
        broker.produce("inc", json!({"old": n})).await;
    }
    let old_id = detail(&broker, "inc").await["topicId"].clone();
    assert_eq!(old_id.as_str().unwrap().len(), 22, "{old_id}");
    let (_, list) = broker.get("/mmmq/topics").await;
    assert_eq!(list[0]["topicId"], old_id);
    let poll = "/mmmq/groups/g/messages?member=m&pattern=inc&max=100";
    let (s, page) = broker.get(poll).await;
    assert_eq!(s, 200, "{page}");
    assert_eq!(page["messages"].as_array().unwrap().len(), 5);
    assert_eq!(page["messages"][0]["topicId"], old_id);
    assert_eq!(page["assignment"][0]["topicId"], old_id);
    let (s, c) = broker
        .post(
            "/mmmq/groups/g/commit",
            &json!({"member": "m", "offsets": [{"topic": "inc", "topicId": old_id, "partition": 0, "offset": 5}]}),
        )
        .await;
    assert_eq!(s, 200, "{c}");

    let (s, _) = broker.delete("/mmmq/topics/inc").await;
    assert_eq!(s, 200);
    // A commit for the deleted topic: nobody owns it any more (409, so a client drops it).
    let (s, c) = broker
        .post(
            "/mmmq/groups/g/commit",
            &json!({"member": "m", "offsets": [{"topic": "inc", "partition": 0, "offset": 5}]}),
        )
        .await;
    assert_eq!(s, 409, "{c}");
    assert!(
        !tmp.path().join("topics/inc").exists(),
        "the commit recreated the topic"
    );
    for n in 0..3 {
        broker.produce("inc", json!({"new": n})).await;
    }
    let new_id = detail(&broker, "inc").await["topicId"].clone();
    assert_ne!(new_id, old_id);
    let (_, page) = broker.get(poll).await;
    let got: Vec<Value> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].clone())
        .collect();
    assert_eq!(got, (0..3).map(|n| json!({"new": n})).collect::<Vec<_>>());
    assert_eq!(page["messages"][0]["topicId"], new_id);
    let (_, g) = broker.get("/mmmq/groups/g").await;
    assert_eq!(g["partitions"][0]["committed"], 0, "{g}");
    assert_eq!(g["partitions"][0]["lag"], 3, "{g}");
    assert_eq!(g["partitions"][0]["topicId"], new_id);
    // The old incarnation's offsets are refused; the new one's are taken.
    let commit = |id: &Value| json!({"member": "m", "offsets": [{"topic": "inc", "topicId": id, "partition": 0, "offset": 3}]});
    let (s, c) = broker.post("/mmmq/groups/g/commit", &commit(&old_id)).await;
    assert_eq!(s, 409, "{c}");
    let (s, c) = broker.post("/mmmq/groups/g/commit", &commit(&new_id)).await;
    assert_eq!(s, 200, "{c}");
    // The id survives a restart.
    broker.terminate();
    let broker = Broker::start(tmp.path()).await;
    assert_eq!(detail(&broker, "inc").await["topicId"], new_id);
}

/// `keepUndelivered` holds what a pull group has not committed, whether or not it polls (it
/// protected only running dispatchers), and a group behind the horizon counts what retention
/// skipped.
#[tokio::test(flavor = "multi_thread")]
async fn keep_undelivered_holds_what_a_group_has_not_committed() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = start_keeping(tmp.path(), "kg").await;
    let poll = "/mmmq/groups/g/messages?member=m&pattern=kg&max=10&sessionTimeoutMs=100";
    let (s, _) = broker.get(poll).await;
    assert_eq!(s, 200);
    for n in 0..30 {
        broker.produce("kg", json!({"n": n})).await;
    }
    // The member's session ends; the group has committed nothing.
    tokio::time::sleep(Duration::from_millis(150)).await;
    wait_passes(&broker, 3.0).await;
    assert_eq!(
        detail(&broker, "kg").await["partitions"][0]["firstOffset"],
        0
    );
    let (_, page) = broker.get(poll).await;
    assert_eq!(page["messages"][0]["offset"], 0);
    let (s, c) = broker
        .post(
            "/mmmq/groups/g/commit",
            &json!({"member": "m", "offsets": [{"topic": "kg", "partition": 0, "offset": 20}]}),
        )
        .await;
    assert_eq!(s, 200, "{c}");
    wait_passes(&broker, 3.0).await;
    let first = detail(&broker, "kg").await["partitions"][0]["firstOffset"]
        .as_u64()
        .unwrap();
    assert!(first > 0 && first <= 20, "first offset {first}");
    // Without keepUndelivered everything expired goes; the group, whose position is 10 (its
    // last poll read 0–9), continues at firstOffset and counts the skip.
    broker
        .put("/mmmq/topics/kg", &json!({"keepUndelivered": false}))
        .await;
    mmmq_tests::eventually_async(WAIT, "retention of everything", || async {
        let d = detail(&broker, "kg").await;
        (d["partitions"][0]["firstOffset"] == 30).then_some(())
    })
    .await;
    let (s, page) = broker.get(poll).await;
    assert_eq!(s, 200);
    assert_eq!(page["messages"], json!([]));
    let (_, g) = broker.get("/mmmq/groups/g").await;
    assert_eq!(g["partitions"][0]["skipped"], 20, "{g}");
    assert!(
        broker
            .metric("mmmq_messages_skipped_by_retention_total")
            .await
            >= 20.0
    );
}

/// `keepUndelivered` also holds while a changed dispatcher is being replaced by a reload: the
/// old one stops (waiting for its slow delivery) before the new one starts, and it used to be out
/// of the running set for all that time.
#[tokio::test(flavor = "multi_thread")]
async fn keep_undelivered_holds_while_a_dispatcher_is_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    // Answers nothing for 3 s: the dispatcher stays at offset 0, its stop waits that long.
    let consumer = Consumer::start_slow(
        0,
        Arc::new(|_| mmmq_tests::Answer::Nack),
        Duration::from_secs(3),
    )
    .await;
    let spec = |retries: u32| {
        let mut d = host_dispatcher("held", "kd", consumer.port);
        d["maxNackRetries"] = json!(retries);
        json!([d])
    };
    write_dispatchers(tmp.path(), &spec(3));
    let broker = start_keeping(tmp.path(), "kd").await;
    for n in 0..30 {
        broker.produce("kd", json!({"n": n})).await;
    }
    consumer.wait_for(1, WAIT).await;
    write_dispatchers(tmp.path(), &spec(4));
    let (s, r) = broker.post("/mmmq/admin/reload", &json!({})).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["changed"], json!(["held"]));
    wait_passes(&broker, 3.0).await;
    assert_eq!(
        detail(&broker, "kd").await["partitions"][0]["firstOffset"],
        0
    );
}

/// `--max-topics` counts a `__` topic the topic API creates (it was exempt, like the dead-letter
/// topics the broker makes for its dispatchers, which still are), and its delete frees the slot.
#[tokio::test(flavor = "multi_thread")]
async fn the_topic_api_cannot_pass_the_topic_cap_with_internal_names() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start_with(tmp.path(), &["--max-topics", "1"]).await;
    // One the API made under a dead-letter name counts, and its delete gives the slot back.
    let (s, body) = broker.put("/mmmq/topics/__dlq.made", &json!({})).await;
    assert_eq!(s, 200, "{body}");
    let (s, body) = broker.put("/mmmq/topics/a", &json!({})).await;
    assert_eq!(s, 403, "{body}");
    let (s, _) = broker.delete("/mmmq/topics/__dlq.made").await;
    assert_eq!(s, 200);
    let (s, body) = broker.put("/mmmq/topics/a", &json!({})).await;
    assert_eq!(s, 200, "{body}");
    for name in ["__x", "__dlq.someone"] {
        let (s, body) = broker
            .put(&format!("/mmmq/topics/{name}"), &json!({}))
            .await;
        assert_eq!(s, 403, "{name}: {body}");
    }
    let (_, list) = broker.get("/mmmq/topics").await;
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
}

/// A topic with the longest name (249 characters) is deleted, and stays deleted across a
/// restart (its directory's name in the trash once did not fit 255 bytes: the delete failed
/// after the topic was closed, and it came back at the next boot).
#[tokio::test(flavor = "multi_thread")]
async fn a_topic_with_the_longest_name_is_deleted_for_good() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    let name = "t".repeat(249);
    broker.produce(&name, json!(1)).await;
    let (status, body) = broker.delete(&format!("/mmmq/topics/{name}")).await;
    assert_eq!(status, 200, "{body}");
    broker.kill();
    let broker = Broker::start(tmp.path()).await;
    let (status, body) = broker.get(&format!("/mmmq/topics/{name}")).await;
    assert_eq!(status, 404, "{body}");
}
