//! Delivery in a cluster (contract §13; docs/cluster.md, "Delivery in a cluster"): a
//! partition's dispatchers deliver on its leader only, and after the leader's SIGKILL the new
//! leader continues from the replicated position — at-least-once redelivers at most what was
//! ACKed in the last checkpoint interval, in order; at-most-once sends nothing twice; lanes,
//! fleets, batches, a clean stop, a consumer down, partitions led apart, a leader cut off.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mmmq_tests::cluster::Cluster;
use mmmq_tests::cluster_delivery::*;
use mmmq_tests::{Answer, Consumer, host_dispatcher};
use serde_json::{Value, json};

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
