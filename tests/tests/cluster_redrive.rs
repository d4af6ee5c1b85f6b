//! Dead letters and their redrive in a cluster (contract §13; docs/cluster.md, "Delivery in a
//! cluster", Redrive): NACKed messages dead-lettered into a clustered topic once each, and a
//! redrive through any broker that survives its dead-letter partition leader's SIGKILL and a
//! reload, one at a time across the cluster.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mmmq_tests::cluster_delivery::*;
use mmmq_tests::{Answer, Consumer, host_dispatcher};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread")]
async fn a_nacked_message_is_dead_lettered_into_a_clustered_topic_and_redriven() {
    let c = topic_on_three(2).await;
    // Every message whose i is a multiple of 5 is NACKed, every time, until `healed`.
    let healed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let policy = healed.clone();
    let consumer = Consumer::start_on(
        0,
        Arc::new(move |e: &Value| {
            let is_dead = e["content"]["i"]
                .as_u64()
                .is_some_and(|i| i.is_multiple_of(5));
            if is_dead && !policy.load(std::sync::atomic::Ordering::Relaxed) {
                Answer::Nack
            } else {
                Answer::Ack
            }
        }),
    )
    .await;
    let mut d = host_dispatcher("c1", TOPIC, consumer.port);
    d["maxNackRetries"] = json!(1);
    configure(&c, &d).await;
    for i in 0..20 {
        let body = json!({"topic": TOPIC, "key": format!("k{}", i % 4), "content": {"i": i}});
        let (code, answer) = c.broker(i % 3 + 1).post("/mmmq/messages", &body).await;
        assert_eq!(code, 200, "{answer}");
    }
    // The dead-letter topic is the cluster's: read through every broker, it holds each NACKed
    // message once, with the reason and its two attempts.
    for via in 1..=3 {
        let dead = c.broker(via).pull_until("__dlq.c1", 4).await;
        let mut dead_i: Vec<u64> = dead
            .iter()
            .map(|d| d["content"]["envelope"]["content"]["i"].as_u64().unwrap())
            .collect();
        dead_i.sort();
        assert_eq!(dead_i, vec![0, 5, 10, 15], "through {via}: {dead:?}");
        assert!(
            dead.iter().all(|d| d["content"]["attempts"] == 2),
            "{dead:?}"
        );
    }
    // The other sixteen are ACKed (another partition's may still be on their way when the
    // dead letters show).
    mmmq_tests::eventually(Duration::from_secs(20), "16 messages ACKed", || {
        let acked: std::collections::BTreeSet<u64> = received(&consumer)
            .into_iter()
            .map(|(_, i)| i)
            .filter(|i| i % 5 != 0)
            .collect();
        (acked.len() == 16).then_some(())
    })
    .await;
    // The consumer heals; a redrive through a broker that does not lead the dead-letter topic
    // runs on the one that does, and delivers each dead letter again.
    healed.store(true, std::sync::atomic::Ordering::Relaxed);
    let dlq_leader = c.leader_of(1, "__dlq.c1", 0).await.expect("a leader");
    let via = (1..=3).find(|b| *b != dlq_leader).unwrap();
    let before = consumer.envelopes().len();
    let (code, run) = c
        .broker(via)
        .post("/mmmq/dispatchers/c1/redrive", &json!({}))
        .await;
    assert_eq!(code, 200, "{run}");
    let redriven = consumer.wait_for(before + 4, Duration::from_secs(30)).await;
    let mut again: Vec<u64> = redriven[before..]
        .iter()
        .map(|e| e["content"]["i"].as_u64().unwrap())
        .collect();
    again.sort();
    assert_eq!(again, vec![0, 5, 10, 15]);
    // Where the next redrive starts is replicated: once the dead-letter partition's leader
    // shows it past the four, a redrive through another broker has nothing left.
    mmmq_tests::eventually_async(Duration::from_secs(10), "the redrive's end", || async {
        let (_, status) = c
            .broker(dlq_leader)
            .get("/mmmq/dispatchers?local=true")
            .await;
        (status[0]["redriveNext"][0]["next"] == 4 && status[0]["redrive"]["running"] == false)
            .then_some(())
    })
    .await;
    let (code, run) = c
        .broker(via)
        .post("/mmmq/dispatchers/c1/redrive", &json!({}))
        .await;
    assert_eq!(code, 200, "{run}");
    assert_eq!(run["remaining"], 0, "{run}");
}

/// Dead letters in the redrive below.
const DEAD: u64 = 300;

#[tokio::test(flavor = "multi_thread")]
async fn a_redrive_continues_on_the_new_leader_after_its_dead_letter_leaders_kill() {
    let mut c = topic_on_three(1).await;
    // Every message is NACKed (and dead-lettered at once) until `healed`; then each takes 5 ms,
    // so that the kill lands mid-redrive.
    let healed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let policy = healed.clone();
    let consumer = Consumer::start_slow(
        0,
        Arc::new(move |_: &Value| {
            if policy.load(std::sync::atomic::Ordering::Relaxed) {
                Answer::Ack
            } else {
                Answer::Nack
            }
        }),
        Duration::from_millis(5),
    )
    .await;
    let mut d = host_dispatcher("c1", TOPIC, consumer.port);
    d["maxNackRetries"] = json!(0);
    d["checkpointIntervalMs"] = json!(INTERVAL_MS);
    configure(&c, &d).await;
    produce(&c, 1, 0, DEAD).await;
    c.broker(1).pull_until("__dlq.c1", DEAD as usize).await;
    healed.store(true, std::sync::atomic::Ordering::Relaxed);
    let before = consumer.envelopes().len();
    let redriven =
        |consumer: &Consumer| -> Vec<(Instant, u64)> { received(consumer).split_off(before) };
    // Through a broker that does not lead the dead-letter partition.
    let dlq_leader = c.leader_of(1, "__dlq.c1", 0).await.expect("a leader");
    let via = (1..=3).find(|b| *b != dlq_leader).unwrap();
    let (code, run) = c
        .broker(via)
        .post("/mmmq/dispatchers/c1/redrive", &json!({}))
        .await;
    assert_eq!(code, 200, "{run}");
    assert_eq!(run["partitions"][0]["to"], DEAD, "{run}");
    // One redrive at a time, through any broker.
    let (code, again) = c
        .broker(dlq_leader)
        .post("/mmmq/dispatchers/c1/redrive", &json!({}))
        .await;
    assert_eq!(code, 409, "{again}");
    // A reload that restarts the dispatcher (its settings changed) does not end the redrive in a
    // cluster: it goes on from where the dispatcher's clean stop left it.
    mmmq_tests::eventually(Duration::from_secs(30), "a sixth redriven", || {
        (redriven(&consumer).len() as u64 >= DEAD / 6).then_some(())
    })
    .await;
    d["maxNackRetries"] = json!(1);
    configure(&c, &d).await;
    mmmq_tests::eventually(Duration::from_secs(30), "a third redriven", || {
        (redriven(&consumer).len() as u64 >= DEAD / 3).then_some(())
    })
    .await;
    c.kill(dlq_leader);
    let killed = Instant::now();
    let at_kill = redriven(&consumer).len() as u64;
    assert!(at_kill < DEAD, "the redrive ended before the kill");
    // One at a time across the failover, decided by the metadata: a redrive asked of the new
    // leader while it continues this one is refused.
    let survivor = c.running()[0];
    mmmq_tests::eventually_async(Duration::from_secs(20), "a new leader answers", || async {
        let (code, again) = c
            .broker(survivor)
            .post("/mmmq/dispatchers/c1/redrive", &json!({}))
            .await;
        match code {
            503 => None,
            409 => Some(()),
            other => panic!("a redrive during the redrive: HTTP {other} {again}"),
        }
    })
    .await;
    // The new leader continues the redrive from its replicated position, to its end.
    let all = mmmq_tests::eventually(
        Duration::from_secs(60),
        "every dead letter redriven",
        || {
            let r = redriven(&consumer);
            let distinct: std::collections::BTreeSet<u64> = r.iter().map(|(_, i)| *i).collect();
            (distinct.len() as u64 == DEAD).then_some(r)
        },
    )
    .await;
    let rewinds = rewinds(&all);
    assert!(
        rewinds <= 1,
        "{rewinds} rewinds for one failover and a reload"
    );
    let repeated = repeated_only_before(&all, killed);
    eprintln!("redriven again after the failover: {repeated} dead letters");
    // Every survivor shows it done; the next redrive has nothing left.
    for via in c.running() {
        mmmq_tests::eventually_async(Duration::from_secs(10), "the redrive's end", || async {
            let (_, status) = c.broker(via).get("/mmmq/dispatchers").await;
            let r = &status[0]["redrive"];
            (r["running"] == false
                && r["remaining"] == 0
                && r["partitions"][0]["next"] == DEAD
                && status[0]["redriveNext"][0]["next"] == DEAD)
                .then_some(())
        })
        .await;
    }
    let (code, run) = c
        .broker(survivor)
        .post("/mmmq/dispatchers/c1/redrive", &json!({}))
        .await;
    assert_eq!(code, 200, "{run}");
    assert_eq!(run["remaining"], 0, "{run}");
    // A range has a position of its own: it covers just that, and the next redrive without
    // `from` still starts at the end.
    let count = redriven(&consumer).len();
    let (code, run) = c
        .broker(survivor)
        .post(
            "/mmmq/dispatchers/c1/redrive",
            &json!({"from": 10, "to": 20}),
        )
        .await;
    assert_eq!(code, 200, "{run}");
    let again = consumer
        .wait_for(before + count + 10, Duration::from_secs(30))
        .await;
    let again: Vec<u64> = again[before + count..]
        .iter()
        .map(|e| e["content"]["i"].as_u64().unwrap())
        .collect();
    assert_eq!(again, (10..20).collect::<Vec<u64>>());
    mmmq_tests::eventually_async(Duration::from_secs(10), "the range's end", || async {
        let (_, status) = c.broker(survivor).get("/mmmq/dispatchers").await;
        let r = &status[0]["redrive"];
        (r["running"] == false
            && r["partitions"][0]["next"] == 20
            && status[0]["redriveNext"][0]["next"] == DEAD)
            .then_some(())
    })
    .await;
}
