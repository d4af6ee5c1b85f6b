//! Delivery in a cluster (contract §13; docs/cluster.md, "Delivery in a cluster"): a
//! partition's dispatchers deliver on its leader only, and after the leader's SIGKILL the new
//! leader continues from the replicated position — at-least-once redelivers at most what was
//! ACKed in the last checkpoint interval, in order; at-most-once sends nothing twice.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mmmq_tests::cluster::Cluster;
use mmmq_tests::{Answer, Consumer, host_dispatcher, write_dispatchers};
use serde_json::{Value, json};

const TOPIC: &str = "events";
/// Messages produced before the kill, and after it.
const BEFORE: u64 = 400;
const AFTER: u64 = 100;
/// The dispatchers' checkpoint interval.
const INTERVAL_MS: u64 = 200;

/// Three brokers, `TOPIC` with one partition on all three, `dispatcher` configured on every
/// broker, and a slow consumer (so that the kill lands mid-stream).
async fn cluster_with(dispatcher: impl Fn(u16) -> Value) -> (Cluster, Consumer) {
    let c = topic_on_three(1).await;
    let consumer =
        Consumer::start_slow(0, Arc::new(|_| Answer::Ack), Duration::from_millis(4)).await;
    configure(&c, &dispatcher(consumer.port)).await;
    (c, consumer)
}

/// Three brokers and `TOPIC` with `partitions` partitions, each on all three.
async fn topic_on_three(partitions: u32) -> Cluster {
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
async fn configure(c: &Cluster, dispatcher: &Value) {
    for id in 1..=3 {
        write_dispatchers(c.root(id), &json!([dispatcher]));
        let (code, report) = c.broker(id).post("/mmmq/admin/reload", &json!({})).await;
        assert_eq!(code, 200, "reload on {id}: {report}");
    }
}

/// Produces `n` messages from `from` through broker `via`, in batches of 100 (so that a backlog
/// builds however slow producing is), each batch until acknowledged (its ids make a retry
/// store nothing twice).
async fn produce(c: &Cluster, via: u64, from: u64, n: u64) {
    for start in (from..from + n).step_by(100) {
        let body: Vec<Value> = (start..(start + 100).min(from + n))
            .map(|i| json!({"topic": TOPIC, "content": {"i": i}, "id": format!("m{i}")}))
            .collect();
        let body = json!(body);
        mmmq_tests::eventually_async(Duration::from_secs(20), "a produce answered", || async {
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
fn checkpointed(port: u16) -> Value {
    let mut d = host_dispatcher("c1", TOPIC, port);
    d["checkpointIntervalMs"] = json!(INTERVAL_MS);
    d
}

/// What the consumer received once it holds every message of the scenario.
async fn every_delivered(consumer: &Consumer) -> Vec<(Instant, u64)> {
    mmmq_tests::eventually(Duration::from_secs(60), "every message delivered", || {
        let r = received(consumer);
        let distinct: std::collections::BTreeSet<u64> = r.iter().map(|(_, i)| *i).collect();
        (distinct.len() as u64 == BEFORE + AFTER).then_some(r)
    })
    .await
}

/// The content's `i` of every envelope received, with when it arrived, in order.
fn received(consumer: &Consumer) -> Vec<(Instant, u64)> {
    consumer
        .timed_envelopes()
        .into_iter()
        .map(|(at, e)| (at, e["content"]["i"].as_u64().expect("an i")))
        .collect()
}

/// Runs the scenario: produce, kill the partition's leader mid-stream, produce through a
/// survivor; answers what the consumer received and when the leader was killed.
async fn failover(c: &mut Cluster, consumer: &Consumer) -> (Vec<(Instant, u64)>, Instant) {
    produce(c, 1, 0, BEFORE).await;
    let leader = c.leader_of(1, TOPIC, 0).await.expect("a leader");
    // Late enough that a restart from offset 0 would repeat messages delivered long before the
    // kill (the consumer takes 4 ms a message: 300 take over a second).
    mmmq_tests::eventually(Duration::from_secs(30), "three quarters delivered", || {
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

#[tokio::test(flavor = "multi_thread")]
async fn at_least_once_continues_from_the_replicated_checkpoint_after_the_leaders_kill() {
    let (mut c, consumer) = cluster_with(checkpointed).await;
    let (_, killed) = failover(&mut c, &consumer).await;
    let all = every_delivered(&consumer).await;
    // In order, but for one rewind (the new leader's start at the replicated checkpoint), which
    // repeats a suffix of what was delivered: never a reorder, never a gap.
    let rewinds = rewinds(&all);
    let mut first_at: BTreeMap<u64, Instant> = BTreeMap::new();
    let mut repeated = Vec::new();
    for (at, i) in &all {
        if first_at.contains_key(i) {
            repeated.push(*i);
        } else {
            first_at.insert(*i, *at);
        }
    }
    // Redelivered: only what was first delivered within the last checkpoint interval (and the
    // checkpoint's commit) before the kill.
    let slack = Duration::from_millis(INTERVAL_MS + 400);
    for i in &repeated {
        let before_kill = killed.saturating_duration_since(first_at[i]);
        assert!(
            before_kill <= slack,
            "{i} redelivered, though first delivered {before_kill:?} before the kill"
        );
    }
    assert!(
        rewinds <= 1,
        "{rewinds} rewinds for one failover: {repeated:?}"
    );
    eprintln!(
        "redelivered after the failover: {} messages",
        repeated.len()
    );
    // Every survivor answers for the partition as the broker that delivers it now does.
    let running = c.running();
    let new_leader = c.leader_of(running[0], TOPIC, 0).await.expect("a leader");
    for via in running {
        let t = mmmq_tests::eventually_async(
            Duration::from_secs(10),
            "the status caught up",
            || async {
                let (_, status) = c.broker(via).get("/mmmq/dispatchers").await;
                let t = status[0]["topics"][0].clone();
                (t["lag"] == 0 && t["nextOffset"] == BEFORE + AFTER).then_some(t)
            },
        )
        .await;
        assert_eq!(t["deliveredBy"], new_leader, "through {via}: {t}");
        assert!(
            t["delivered"].as_u64().unwrap() >= AFTER,
            "through {via}: {t}"
        );
    }
}

/// How many deliveries in `all` repeat an earlier one; panics unless each repeated message was
/// first delivered within the checkpoint interval (and its commit) before `killed`.
fn repeated_only_before(all: &[(Instant, u64)], killed: Instant) -> usize {
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
fn rewinds(all: &[(Instant, u64)]) -> usize {
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

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_stopped_past_its_lease_never_delivers_again() {
    let (c, consumer) = cluster_with(|port| host_dispatcher("c1", TOPIC, port)).await;
    produce(&c, 1, 0, BEFORE).await;
    let leader = c.leader_of(1, TOPIC, 0).await.expect("a leader");
    mmmq_tests::eventually(Duration::from_secs(30), "a quarter delivered", || {
        (received(&consumer).len() as u64 >= BEFORE / 4).then_some(())
    })
    .await;
    // Frozen mid-stream (a request of its may be on the wire): another broker takes over and
    // delivers.
    c.broker(leader).signal(libc::SIGSTOP);
    let at_stop = received(&consumer).len();
    mmmq_tests::eventually(Duration::from_secs(30), "the new leader delivering", || {
        (received(&consumer).len() > at_stop + 20).then_some(())
    })
    .await;
    // Woken: its worker is where it was, mid-loop, with a lapsed lease. It must send nothing
    // more, though it still believes it leads until it hears of the new term.
    c.broker(leader).signal(libc::SIGCONT);
    let via = (1..=3).find(|b| *b != leader).unwrap();
    produce(&c, via, BEFORE, AFTER).await;
    let all = every_delivered(&consumer).await;
    mmmq_tests::eventually_async(
        Duration::from_secs(20),
        "the old leader deposed",
        || async {
            let now = c.leader_of(leader, TOPIC, 0).await;
            (now.is_some() && now != Some(leader)).then_some(())
        },
    )
    .await;
    // One rewind at most: the new leader's start. The old leader sending again after waking
    // would go back a second time (or skip ahead).
    let late = received(&consumer);
    assert!(late.len() >= all.len());
    assert!(
        rewinds(&late) <= 1,
        "the deposed leader delivered after waking"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn at_most_once_never_sends_twice_across_the_leaders_kill() {
    let (mut c, consumer) = cluster_with(|port| {
        let mut d = host_dispatcher("c1", TOPIC, port);
        d["delivery"] = json!("at-most-once");
        d
    })
    .await;
    failover(&mut c, &consumer).await;
    // Everything produced after the failover arrives (what the old leader claimed and did not
    // send is lost, at most one claim's worth).
    let all = mmmq_tests::eventually(
        Duration::from_secs(60),
        "the last message delivered",
        || {
            let r = received(&consumer);
            r.iter().any(|(_, i)| *i == BEFORE + AFTER - 1).then_some(r)
        },
    )
    .await;
    let mut seen = std::collections::BTreeSet::new();
    for (_, i) in &all {
        assert!(seen.insert(*i), "{i} delivered twice");
    }
    let lost = BEFORE + AFTER - seen.len() as u64;
    assert!(lost <= 64, "{lost} messages lost: more than one claim");
}

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

/// Produces `n` keyed messages (`KEYS` keys, `i % KEYS`) from `from` through broker `via`.
async fn produce_keyed(c: &Cluster, via: u64, from: u64, n: u64) {
    for start in (from..from + n).step_by(100) {
        let body: Vec<Value> = (start..(start + 100).min(from + n))
            .map(|i| {
                json!({"topic": TOPIC, "key": format!("k{}", i % KEYS), "content": {"i": i},
                    "id": format!("m{i}")})
            })
            .collect();
        let body = json!(body);
        mmmq_tests::eventually_async(Duration::from_secs(20), "a produce answered", || async {
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

/// Each key's messages (`produce_keyed`'s) in order but for one rewind.
fn each_key_in_order(all: &[(Instant, u64)]) {
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
const KEYS: u64 = 16;

#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_with_lanes_keeps_each_keys_order_across_the_leaders_kill() {
    let mut c = topic_on_three(1).await;
    let fleet = [
        Consumer::start_slow(0, Arc::new(|_| Answer::Ack), Duration::from_millis(4)).await,
        Consumer::start_slow(0, Arc::new(|_| Answer::Ack), Duration::from_millis(4)).await,
    ];
    let host = |port: u16| json!({"protocol": "HTTP", "address": "127.0.0.1", "port": port});
    let d = json!({"consumerId": "c1", "pattern": TOPIC, "maxInFlight": 8,
        "checkpointIntervalMs": INTERVAL_MS,
        "hosts": [host(fleet[0].port), host(fleet[1].port)]});
    configure(&c, &d).await;
    // Every delivery, in the order they arrived at either host.
    let all = |fleet: &[Consumer]| -> Vec<(Instant, u64)> {
        let mut all: Vec<(Instant, u64)> = fleet.iter().flat_map(received).collect();
        all.sort_by_key(|(at, _)| *at);
        all
    };
    produce_keyed(&c, 1, 0, BEFORE).await;
    let leader = c.leader_of(1, TOPIC, 0).await.expect("a leader");
    mmmq_tests::eventually(Duration::from_secs(30), "three quarters delivered", || {
        (all(&fleet).len() as u64 >= BEFORE * 3 / 4).then_some(())
    })
    .await;
    c.kill(leader);
    let killed = Instant::now();
    let via = (1..=3).find(|b| *b != leader).unwrap();
    produce_keyed(&c, via, BEFORE, AFTER).await;
    let all = mmmq_tests::eventually(Duration::from_secs(60), "every message delivered", || {
        let r = all(&fleet);
        let distinct: std::collections::BTreeSet<u64> = r.iter().map(|(_, i)| *i).collect();
        (distinct.len() as u64 == BEFORE + AFTER).then_some(r)
    })
    .await;
    assert!(
        fleet.iter().all(|f| !received(f).is_empty()),
        "both hosts of the fleet served"
    );
    // Per key, in order but for one rewind (the new leader's start from the replicated
    // checkpoint and its lanes' done ranges), repeating only what was first delivered within the
    // checkpoint interval before the kill.
    each_key_in_order(&all);
    let repeated = repeated_only_before(&all, killed);
    eprintln!("delivered again after the failover: {repeated} messages");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clean_stop_of_the_leader_hands_over_without_a_repeat() {
    // A rolling restart: the partition's leader (also the metadata group's, as broker 1 usually
    // is) stopped with SIGTERM mid-stream writes its final position before its groups stop, so
    // the next leader repeats nothing.
    let (mut c, consumer) = cluster_with(checkpointed).await;
    produce(&c, 1, 0, BEFORE).await;
    let leader = c.leader_of(1, TOPIC, 0).await.expect("a leader");
    mmmq_tests::eventually(Duration::from_secs(30), "a third delivered", || {
        (received(&consumer).len() as u64 >= BEFORE / 3).then_some(())
    })
    .await;
    let status = c.terminate(leader);
    assert!(status.success(), "a clean stop: {status:?}");
    let via = (1..=3).find(|b| *b != leader).unwrap();
    produce(&c, via, BEFORE, AFTER).await;
    let all = every_delivered(&consumer).await;
    assert_eq!(rewinds(&all), 0, "a clean stop repeated messages");
    assert_eq!(all.len() as u64, BEFORE + AFTER);
    // It comes back as a follower and the cluster goes on.
    c.restart(leader).await;
    produce(&c, leader, BEFORE + AFTER, 100).await;
    consumer
        .wait_for((BEFORE + AFTER + 100) as usize, Duration::from_secs(30))
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_down_across_the_leaders_kill_gets_everything_in_order_once_up() {
    // The consumer answers 500 (a communication failure: retried with backoff, never dead-lettered)
    // while `down`; the leader is killed during the outage; the new leader backs off as well, and
    // delivers everything once the consumer is up.
    let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acked: Arc<parking_lot::Mutex<Vec<(Instant, u64)>>> = Arc::default();
    let (policy_down, policy_acked) = (down.clone(), acked.clone());
    let mut c = topic_on_three(1).await;
    let consumer = Consumer::start_slow(
        0,
        Arc::new(move |e: &Value| {
            if policy_down.load(std::sync::atomic::Ordering::Relaxed) {
                return Answer::Error;
            }
            let i = e["content"]["i"].as_u64().expect("an i");
            policy_acked.lock().push((Instant::now(), i));
            Answer::Ack
        }),
        Duration::from_millis(4),
    )
    .await;
    configure(&c, &checkpointed(consumer.port)).await;
    produce(&c, 1, 0, BEFORE).await;
    let leader = c.leader_of(1, TOPIC, 0).await.expect("a leader");
    mmmq_tests::eventually(Duration::from_secs(30), "a third delivered", || {
        (acked.lock().len() as u64 >= BEFORE / 3).then_some(())
    })
    .await;
    down.store(true, std::sync::atomic::Ordering::Relaxed);
    c.kill(leader);
    let killed = Instant::now();
    let via = (1..=3).find(|b| *b != leader).unwrap();
    produce(&c, via, BEFORE, AFTER).await;
    // The new leader retries while the consumer is down, and any broker shows it.
    mmmq_tests::eventually_async(
        Duration::from_secs(30),
        "retries on the new leader",
        || async {
            let (_, status) = c.broker(via).get("/mmmq/dispatchers").await;
            let t = &status[0]["topics"][0];
            (t["deliveredBy"] != leader && t["retries"].as_u64().unwrap_or(0) > 0).then_some(())
        },
    )
    .await;
    down.store(false, std::sync::atomic::Ordering::Relaxed);
    let all = mmmq_tests::eventually(Duration::from_secs(60), "every message ACKed", || {
        let r = acked.lock().clone();
        let distinct: std::collections::BTreeSet<u64> = r.iter().map(|(_, i)| *i).collect();
        (distinct.len() as u64 == BEFORE + AFTER).then_some(r)
    })
    .await;
    assert!(rewinds(&all) <= 1, "more than one rewind for one failover");
    repeated_only_before(&all, killed);
    let (_, status) = c.broker(via).get("/mmmq/dispatchers").await;
    assert_eq!(status[0]["deadLettered"], 0, "{status}");
}

#[tokio::test(flavor = "multi_thread")]
async fn partitions_led_apart_continue_when_a_broker_that_is_not_the_metadata_leader_dies() {
    // Six partitions, their leaders spread over the brokers; the broker killed leads a
    // partition but not the metadata group, so its positions went through another broker's
    // metadata leader, and the survivors' partitions never stop.
    let mut c = topic_on_three(6).await;
    let consumer =
        Consumer::start_slow(0, Arc::new(|_| Answer::Ack), Duration::from_millis(4)).await;
    configure(&c, &checkpointed(consumer.port)).await;
    let meta = c.meta_leader(1).await;
    let leaders = mmmq_tests::eventually_async(Duration::from_secs(20), "leaders", || async {
        let mut leaders = Vec::new();
        for p in 0..6 {
            leaders.push(c.leader_of(meta, TOPIC, p).await?);
        }
        Some(leaders)
    })
    .await;
    // Elections are free: should the metadata leader lead all six (rare), the victim is a
    // follower of them all, and the test shows only that the others are not held up.
    let victim = leaders
        .iter()
        .copied()
        .find(|l| *l != meta)
        .unwrap_or_else(|| (1..=3).find(|b| *b != meta).unwrap());
    eprintln!("metadata leader {meta}, partition leaders {leaders:?}, killing {victim}");
    produce_keyed(&c, meta, 0, BEFORE).await;
    mmmq_tests::eventually(Duration::from_secs(30), "half delivered", || {
        (received(&consumer).len() as u64 >= BEFORE / 2).then_some(())
    })
    .await;
    c.kill(victim);
    let killed = Instant::now();
    assert!(
        (received(&consumer).len() as u64) < BEFORE,
        "everything was delivered before the kill"
    );
    produce_keyed(&c, meta, BEFORE, AFTER).await;
    let all = every_delivered(&consumer).await;
    each_key_in_order(&all);
    let repeated = repeated_only_before(&all, killed);
    eprintln!("delivered again after the failover: {repeated} messages");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_cut_off_from_the_others_stops_and_the_new_one_continues() {
    // The partition's leader (and the metadata's) loses every link to the other brokers but
    // still reaches the consumer: it stops once its lease lapses, the majority elects another,
    // which continues from the replicated position.
    let c = Cluster::start(3, &["--fault-injection"]).await;
    c.meta_leader(1).await;
    let (code, created) = c
        .broker(1)
        .put(&format!("/mmmq/topics/{TOPIC}"), &json!({"partitions": 1}))
        .await;
    assert_eq!(code, 200, "{created}");
    let consumer =
        Consumer::start_slow(0, Arc::new(|_| Answer::Ack), Duration::from_millis(4)).await;
    configure(&c, &checkpointed(consumer.port)).await;
    produce(&c, 1, 0, BEFORE).await;
    let leader = c.leader_of(1, TOPIC, 0).await.expect("a leader");
    mmmq_tests::eventually(Duration::from_secs(30), "a third delivered", || {
        (received(&consumer).len() as u64 >= BEFORE / 3).then_some(())
    })
    .await;
    c.isolate(leader).await;
    let cut = Instant::now();
    let via = (1..=3).find(|b| *b != leader).unwrap();
    produce(&c, via, BEFORE, AFTER).await;
    let all = every_delivered(&consumer).await;
    c.heal().await;
    assert!(rewinds(&all) <= 1, "more than one rewind for one failover");
    // What the old leader delivered after its last replicated checkpoint comes again: what it
    // ACKed in the checkpoint interval before the cut, and what it delivered in the rest of its
    // lease after it (its positions could no longer be written; the lease is 80 % of a 500 ms
    // election timeout).
    let mut first_at: BTreeMap<u64, Instant> = BTreeMap::new();
    let (mut before_cut, mut after_cut) = (0, 0);
    for (at, i) in &all {
        match first_at.get(i) {
            Some(first) if *first <= cut => {
                before_cut += 1;
                let before = cut.duration_since(*first);
                assert!(
                    before <= Duration::from_millis(INTERVAL_MS + 400),
                    "{i} delivered again, though first delivered {before:?} before the cut"
                );
            }
            Some(first) => {
                after_cut += 1;
                let after = first.duration_since(cut);
                assert!(
                    after <= Duration::from_millis(400 + 300),
                    "{i} first delivered {after:?} after the cut: past the old leader's lease"
                );
            }
            None => {
                first_at.insert(*i, *at);
            }
        }
    }
    eprintln!(
        "delivered again after the cut: {before_cut} first delivered before it, {after_cut} in the old leader's lease after it"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn batches_continue_from_the_replicated_checkpoint_after_the_leaders_kill() {
    // `batchMaxMessages` 20: the new leader resumes at a batch's edge as recorded, in order, and
    // repeats only what was ACKed within the interval before the kill.
    let (mut c, consumer) = cluster_with(|port| {
        let mut d = checkpointed(port);
        d["batchMaxMessages"] = json!(20);
        d
    })
    .await;
    let (_, killed) = failover(&mut c, &consumer).await;
    let all = every_delivered(&consumer).await;
    assert!(rewinds(&all) <= 1, "more than one rewind for one failover");
    let repeated = repeated_only_before(&all, killed);
    eprintln!("delivered again after the failover: {repeated} messages");
    assert!(
        consumer.requests().iter().any(Value::is_array),
        "delivered in batches"
    );
}
