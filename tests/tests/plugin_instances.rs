//! The bound on a plugin dispatcher's idle instances (docs/plugins.md, "WebAssembly handlers",
//! "Instances"): at most 64 are kept between calls, the least recently used dropped past that.
//! The testbed plugin logs how many messages its instance has handled (`seen`), so a reused
//! instance and a fresh one are told apart.

use std::time::Duration;

use mmmq_tests::{Broker, eventually, testbed_root};
use serde_json::{Value, json};

fn topic(i: usize) -> String {
    format!("idle.{i:02}")
}

/// The `seen` of the instance that handled `offset` of `topic` (its line in the broker's log).
async fn seen(broker: &Broker, topic: &str, offset: u64) -> u64 {
    let what = format!("the line of {topic} offset {offset}");
    eventually(Duration::from_secs(30), &what, || {
        broker
            .handled()
            .iter()
            .find(|h| h.topic == topic && h.offset == offset)
            .map(|h| h.seen)
    })
    .await
}

/// Produces one message to `topic` and waits until the dispatcher counted it (after the call,
/// its instance is back among the idle ones by then).
async fn one(broker: &Broker, topic: &str, delivered: u64) {
    broker.produce(topic, json!({})).await;
    broker
        .dispatcher_when("tb", |s| s["delivered"] == delivered)
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dispatcher_keeps_64_idle_instances_and_drops_the_least_recently_used() {
    let tmp = tempfile::tempdir().unwrap();
    testbed_root(tmp.path(), "tb", "idle.*", json!({}));
    let broker = Broker::start(tmp.path()).await;

    // 64 topics, one instance each.
    let items: Vec<Value> = (0..64)
        .map(|i| json!({"topic": topic(i), "content": {}}))
        .collect();
    let (status, body) = broker
        .post("/mmmq/messages/batch", &Value::Array(items))
        .await;
    assert_eq!(status, 200, "{body}");
    broker.dispatcher_when("tb", |s| s["delivered"] == 64).await;

    // All 64 are kept: each topic's second message goes to the same instance. One topic at a
    // time, so that the least recently used is idle.00, then idle.01, and so on.
    for i in 0..64 {
        one(&broker, &topic(i), 65 + i as u64).await;
    }
    for i in 0..64 {
        assert_eq!(
            seen(&broker, &topic(i), 1).await,
            2,
            "{} was reused",
            topic(i)
        );
    }

    // A 65th topic's instance is kept in place of the least recently used one, idle.00's.
    one(&broker, &topic(64), 129).await;
    assert_eq!(seen(&broker, &topic(64), 0).await, 1);
    one(&broker, &topic(63), 130).await;
    assert_eq!(
        seen(&broker, &topic(63), 2).await,
        3,
        "the most recent one is kept"
    );
    one(&broker, &topic(0), 131).await;
    assert_eq!(
        seen(&broker, &topic(0), 2).await,
        1,
        "the least recently used one was dropped and made afresh"
    );
}
