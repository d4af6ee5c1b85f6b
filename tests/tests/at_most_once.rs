//! `"delivery": "at-most-once"` end to end (docs/delivery.md, "Delivery modes"): the position is durable
//! before a message is sent, a NACK dead-letters at once, a communication failure drops the
//! message (counted), and nothing is ever sent twice, through clean restarts and SIGKILLs.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mmmq_tests::{Answer, Broker, Consumer, free_port, host_dispatcher, write_dispatchers};
use serde_json::{Value, json};

fn at_most_once(id: &str, pattern: &str, port: u16, max_in_flight: u64) -> Value {
    let mut d = host_dispatcher(id, pattern, port);
    d["delivery"] = json!("at-most-once");
    d["maxInFlight"] = json!(max_in_flight);
    d
}

fn n_of(e: &Value) -> u64 {
    e["content"]["n"].as_u64().unwrap()
}

/// Every fifth message NACKed, every fifth (other) one answered 500: each message reaches the
/// consumer exactly once; NACKed ones are dead-lettered after that one attempt, failed ones are
/// dropped and counted; a clean restart sends nothing again.
#[tokio::test(flavor = "multi_thread")]
async fn a_nack_dead_letters_at_once_a_failure_drops_and_nothing_comes_twice() {
    let tmp = tempfile::tempdir().unwrap();
    let consumer = Consumer::start_on(
        0,
        Arc::new(|e: &Value| match n_of(e) % 5 {
            1 => Answer::Nack,
            3 => Answer::Error,
            _ => Answer::Ack,
        }),
    )
    .await;
    write_dispatchers(
        tmp.path(),
        &json!([at_most_once("amo", "amo", consumer.port, 1)]),
    );
    let broker = Broker::start(tmp.path()).await;
    for n in 0..20 {
        broker.produce("amo", json!({"n": n})).await;
    }
    let s = broker
        .dispatcher_when("amo", |s| s["topics"][0]["nextOffset"] == 20)
        .await;
    assert_eq!(s["delivery"], "at-most-once", "{s}");
    assert_eq!(
        (
            &s["delivered"],
            &s["nacked"],
            &s["deadLettered"],
            &s["dropped"]
        ),
        (&json!(12), &json!(4), &json!(4), &json!(4)),
        "{s}"
    );
    assert_eq!(s["topics"][0]["retries"], 0, "{s}");
    let offsets: Vec<u64> = consumer.offsets();
    assert_eq!(offsets, (0..20).collect::<Vec<_>>(), "each exactly once");
    let dlq = broker.pull_all("__dlq.amo").await;
    assert_eq!(dlq.len(), 4);
    for d in &dlq {
        assert_eq!(d["content"]["attempts"], 1, "{d}");
        assert_eq!(n_of(&d["content"]["envelope"]) % 5, 1, "{d}");
    }
    assert_eq!(broker.metric("mmmq_messages_dropped_total").await, 4.0);
    assert!(broker.terminate().success());

    let broker = Broker::start(tmp.path()).await;
    broker.produce("amo", json!({"n": 20})).await;
    broker
        .dispatcher_when("amo", |s| s["topics"][0]["nextOffset"] == 21)
        .await;
    let offsets: Vec<u64> = consumer.offsets();
    assert_eq!(
        offsets,
        (0..21).collect::<Vec<_>>(),
        "nothing again after a restart"
    );
}

/// A consumer nobody runs: every message is dropped (a connection error is a communication
/// failure), once each, and the dispatcher goes on with the next.
#[tokio::test(flavor = "multi_thread")]
async fn messages_to_a_consumer_that_is_down_are_dropped_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    write_dispatchers(
        tmp.path(),
        &json!([at_most_once("gone", "gone", free_port(), 1)]),
    );
    let broker = Broker::start(tmp.path()).await;
    for n in 0..3 {
        broker.produce("gone", json!({"n": n})).await;
    }
    let s = broker.dispatcher_when("gone", |s| s["dropped"] == 3).await;
    assert_eq!(s["topics"][0]["nextOffset"], 3, "{s}");
    assert!(
        s["lastError"]
            .as_str()
            .unwrap()
            .contains("dropped (at-most-once)"),
        "{s}"
    );
}

/// What a consumer saw from one dispatcher: (partition, offset) → how many times.
fn tally(consumer: &Consumer) -> BTreeMap<(u64, u64), u32> {
    let mut seen = BTreeMap::new();
    for e in consumer.envelopes() {
        let k = (
            e["partition"].as_u64().unwrap(),
            e["offset"].as_u64().unwrap(),
        );
        *seen.entry(k).or_insert(0) += 1;
    }
    seen
}

/// SIGKILLs mid-stream, ten times, with one dispatcher in offset order and one with 8 lanes over
/// 4 partitions: no message ever reaches a consumer twice. What a kill loses is bounded by what
/// was claimed and not sent (one read batch per partition, or the lanes' window). A consumer that
/// answers 500 now and then: the final run's `dropped` counts exactly its 500s.
#[tokio::test(flavor = "multi_thread")]
async fn sigkill_campaign_never_sends_a_message_twice() {
    let tmp = tempfile::tempdir().unwrap();
    let fails = |e: &Value| n_of(e) % 97 == 5;
    let policy = Arc::new(move |e: &Value| if fails(e) { Answer::Error } else { Answer::Ack });
    let ordered = Consumer::start_slow(0, policy.clone(), Duration::from_millis(1)).await;
    let laned = Consumer::start_slow(0, policy, Duration::from_millis(1)).await;
    write_dispatchers(
        tmp.path(),
        &json!([
            at_most_once("ordered", "kill", ordered.port, 1),
            at_most_once("laned", "kill", laned.port, 8),
        ]),
    );
    let args = ["--default-partitions", "4"];
    let mut n = 0u64;
    let kills = 10;
    for cycle in 0..=kills {
        let last_start = Instant::now();
        let broker = Broker::start_with(tmp.path(), &args).await;
        let batch: Vec<Value> = (n..n + 400)
            .map(|i| json!({"topic": "kill", "key": format!("k{}", i % 13), "content": {"n": i}}))
            .collect();
        n += 400;
        let (status, b) = broker.post("/mmmq/messages/batch", &json!(batch)).await;
        assert_eq!(status, 200, "{b}");
        if cycle < kills {
            // Mid-stream: some of this cycle's messages are out, others not yet.
            let (a, b) = (ordered.envelopes().len(), laned.envelopes().len());
            mmmq_tests::eventually(Duration::from_secs(60), "deliveries under way", || {
                (ordered.envelopes().len() > a + 50 && laned.envelopes().len() > b + 50)
                    .then_some(())
            })
            .await;
            broker.kill();
        } else {
            for id in ["ordered", "laned"] {
                broker.dispatcher_when(id, |s| s["lag"] == 0).await;
            }
            let (_, status) = broker.get("/mmmq/dispatchers").await;
            let since_start = |c: &Consumer| {
                c.timed_envelopes()
                    .iter()
                    .filter(|(at, e)| *at >= last_start && fails(e))
                    .count()
            };
            for (id, c) in [("ordered", &ordered), ("laned", &laned)] {
                let s = status
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|s| s["consumerId"] == id)
                    .unwrap();
                assert_eq!(s["dropped"], json!(since_start(c)), "{id}: {s}");
            }
            assert!(broker.terminate().success());
        }
    }
    for (id, c, bound) in [("ordered", &ordered, 65u64), ("laned", &laned, 128)] {
        let seen = tally(c);
        let twice: Vec<_> = seen.iter().filter(|&(_, &k)| k > 1).collect();
        assert!(twice.is_empty(), "{id}: sent twice: {twice:?}");
        let lost = n - seen.len() as u64;
        assert!(
            lost <= kills * 4 * bound,
            "{id}: {lost} lost over {kills} kills"
        );
        let contents: HashSet<u64> = c.envelopes().iter().map(n_of).collect();
        assert_eq!(contents.len(), seen.len(), "{id}: one message per offset");
        eprintln!(
            "at-most-once SIGKILL campaign, {id}: {kills} kills, {n} messages, {lost} lost, 0 twice"
        );
    }
}
