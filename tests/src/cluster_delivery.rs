//! Delivery in a cluster, the scenarios' common parts (docs/cluster.md, "Delivery in a
//! cluster"): three brokers, a topic on all three, a slow consumer, producers with ids, and the
//! checks of what the consumer received — in order but for one rewind, repeating only what was
//! delivered within the checkpoint interval before a failover.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cluster::Cluster;
use crate::{Answer, Consumer, host_dispatcher, write_dispatchers};

pub const TOPIC: &str = "events";
/// Messages produced before the kill, and after it.
pub const BEFORE: u64 = 400;
pub const AFTER: u64 = 100;
/// The dispatchers' checkpoint interval.
pub const INTERVAL_MS: u64 = 200;

/// Three brokers, `TOPIC` with one partition on all three, `dispatcher` configured on every
/// broker, and a slow consumer (so that the kill lands mid-stream).
pub async fn cluster_with(dispatcher: impl Fn(u16) -> Value) -> (Cluster, Consumer) {
    let c = topic_on_three(1).await;
    let consumer =
        Consumer::start_slow(0, Arc::new(|_| Answer::Ack), Duration::from_millis(4)).await;
    configure(&c, &dispatcher(consumer.port)).await;
    (c, consumer)
}

/// Three brokers and `TOPIC` with `partitions` partitions, each on all three.
pub async fn topic_on_three(partitions: u32) -> Cluster {
    let c = Cluster::start(3, &[]).await;
    c.meta_leader(1).await;
    let (code, created) = c
        .broker(1)
        .put(
            &format!("/mmmq/topics/{TOPIC}"),
            &json!({"partitions": partitions}),
        )
        .await;
    assert_eq!(code, 200, "{created}");
    c
}

/// `dispatcher` in every broker's `dispatchers.json`, reloaded.
pub async fn configure(c: &Cluster, dispatcher: &Value) {
    for id in 1..=3 {
        write_dispatchers(c.root(id), &json!([dispatcher]));
        let (code, report) = c.broker(id).post("/mmmq/admin/reload", &json!({})).await;
        assert_eq!(code, 200, "reload on {id}: {report}");
    }
}

/// Produces `n` messages from `from` through broker `via`, in batches of 100 (so that a backlog
/// builds however slow producing is), each batch until acknowledged (its ids make a retry
/// store nothing twice).
pub async fn produce(c: &Cluster, via: u64, from: u64, n: u64) {
    produce_each(
        c,
        via,
        from,
        n,
        |i| json!({"topic": TOPIC, "content": {"i": i}, "id": format!("m{i}")}),
    )
    .await
}

/// As [`produce`], each message made by `message` from its `i`.
async fn produce_each(c: &Cluster, via: u64, from: u64, n: u64, message: impl Fn(u64) -> Value) {
    for start in (from..from + n).step_by(100) {
        let body: Vec<Value> = (start..(start + 100).min(from + n)).map(&message).collect();
        let body = json!(body);
        crate::eventually_async(Duration::from_secs(20), "a produce answered", || async {
            let (code, answer) = c.broker(via).post("/mmmq/messages/batch", &body).await;
            match code {
                200 => Some(()),
                503 => None,
                other => panic!("produce through {via}: HTTP {other} {answer}"),
            }
        })
        .await;
    }
}

/// The dispatcher `c1` to the consumer on `port`, its checkpoint every [`INTERVAL_MS`].
pub fn checkpointed(port: u16) -> Value {
    let mut d = host_dispatcher("c1", TOPIC, port);
    d["checkpointIntervalMs"] = json!(INTERVAL_MS);
    d
}

/// What the consumer received once it holds every message of the scenario.
pub async fn every_delivered(consumer: &Consumer) -> Vec<(Instant, u64)> {
    crate::eventually(Duration::from_secs(60), "every message delivered", || {
        let r = received(consumer);
        let distinct: std::collections::BTreeSet<u64> = r.iter().map(|(_, i)| *i).collect();
        (distinct.len() as u64 == BEFORE + AFTER).then_some(r)
    })
    .await
}

/// The content's `i` of every envelope received, with when it arrived, in order.
pub fn received(consumer: &Consumer) -> Vec<(Instant, u64)> {
    consumer
        .timed_envelopes()
        .into_iter()
        .map(|(at, e)| (at, e["content"]["i"].as_u64().expect("an i")))
        .collect()
}

/// Runs the scenario: produce, kill the partition's leader mid-stream, produce through a
/// survivor; answers what the consumer received and when the leader was killed.
pub async fn failover(c: &mut Cluster, consumer: &Consumer) -> (Vec<(Instant, u64)>, Instant) {
    produce(c, 1, 0, BEFORE).await;
    let leader = c.leader_of(1, TOPIC, 0).await.expect("a leader");
    // Late enough that a restart from offset 0 would repeat messages delivered long before the
    // kill (the consumer takes 4 ms a message: 300 take over a second).
    crate::eventually(Duration::from_secs(30), "three quarters delivered", || {
        (received(consumer).len() as u64 >= BEFORE * 3 / 4).then_some(())
    })
    .await;
    // Before the failover, one broker delivers: nothing was sent twice.
    let so_far = received(consumer);
    let mut seen = std::collections::BTreeSet::new();
    for (_, i) in &so_far {
        assert!(seen.insert(*i), "{i} delivered twice before any failover");
    }
    c.kill(leader);
    let killed = Instant::now();
    let via = (1..=3).find(|b| *b != leader).unwrap();
    produce(c, via, BEFORE, AFTER).await;
    (received(consumer), killed)
}

/// How many deliveries in `all` repeat an earlier one; panics unless each repeated message was
/// first delivered within the checkpoint interval (and its commit) before `killed`.
pub fn repeated_only_before(all: &[(Instant, u64)], killed: Instant) -> usize {
    let mut first_at: BTreeMap<u64, Instant> = BTreeMap::new();
    let mut repeated = 0;
    for (at, i) in all {
        match first_at.get(i) {
            Some(first) => {
                repeated += 1;
                let before_kill = killed.saturating_duration_since(*first);
                assert!(
                    before_kill <= Duration::from_millis(INTERVAL_MS + 400),
                    "{i} delivered again, though first delivered {before_kill:?} before the kill"
                );
            }
            None => {
                first_at.insert(*i, *at);
            }
        }
    }
    repeated
}

/// How many times delivery went back to an earlier message; panics on a gap or a reorder.
pub fn rewinds(all: &[(Instant, u64)]) -> usize {
    let mut rewinds = 0;
    let mut next = 0;
    for (_, i) in all {
        if *i == next {
            next += 1;
        } else if *i < next {
            rewinds += 1;
            next = i + 1;
        } else {
            panic!("{i} delivered before {next}: a gap or a reorder");
        }
    }
    rewinds
}

/// Produces `n` keyed messages (`KEYS` keys, `i % KEYS`) from `from` through broker `via`.
pub async fn produce_keyed(c: &Cluster, via: u64, from: u64, n: u64) {
    produce_each(c, via, from, n, |i| {
        json!({"topic": TOPIC, "key": format!("k{}", i % KEYS), "content": {"i": i},
            "id": format!("m{i}")})
    })
    .await
}

/// Each key's messages (`produce_keyed`'s) in order but for one rewind.
pub fn each_key_in_order(all: &[(Instant, u64)]) {
    for key in 0..KEYS {
        let of_key: Vec<(Instant, u64)> = all
            .iter()
            .filter(|(_, i)| i % KEYS == key)
            .map(|(at, i)| (*at, i / KEYS))
            .collect();
        let rewinds = rewinds(&of_key);
        assert!(
            rewinds <= 1,
            "key k{key}: {rewinds} rewinds for one failover"
        );
    }
}

/// Keys of the lanes test.
pub const KEYS: u64 = 16;
