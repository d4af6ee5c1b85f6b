//! `maxInFlight` lanes end to end (docs/dispatchers.md, "Dispatchers"): many requests in flight per partition,
//! same-key messages one at a time in offset order, a NACK holding back only its lane, and
//! nothing delivered again after a clean restart.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use mmmq_tests::{Answer, Broker, Consumer, write_dispatchers};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

fn lanes_dispatcher(id: &str, pattern: &str, port: u16, max_in_flight: u64) -> Value {
    json!({
        "consumerId": id,
        "pattern": pattern,
        "host": {"protocol": "HTTP", "address": "127.0.0.1", "port": port, "timeoutMs": 5000},
        "maxInFlight": max_in_flight,
        "maxNackRetries": 2,
    })
}

/// Checks every (key, seq) arrived once, each key's in the order produced.
fn check_per_key_order(got: &[Value], keys: u64, per_key: u64) {
    assert_eq!(mmmq_tests::check_per_key_order(got) as u64, keys * per_key);
}

/// A consumer that takes 5 ms per message, 64 lanes over 1,000 keys: every message once, each
/// key's in order, many requests in flight at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_consumer_with_64_lanes_gets_every_message_once_in_key_order() {
    let tmp = tempfile::tempdir().unwrap();
    let consumer =
        Consumer::start_slow(0, Arc::new(|_| Answer::Ack), Duration::from_millis(5)).await;
    write_dispatchers(
        tmp.path(),
        &json!([lanes_dispatcher("fast", "lanes", consumer.port, 64)]),
    );
    let broker = Broker::start(tmp.path()).await;
    broker.produce_keyed("lanes", 1000, 0..2).await;
    let got = consumer.wait_for(2000, WAIT).await;
    check_per_key_order(&got, 1000, 2);
    let d = broker.dispatcher_when("fast", |d| d["lag"] == 0).await;
    assert_eq!(d["maxInFlight"], 64);
    assert_eq!(d["delivered"], 2000);
    // 2,000 messages at 5 ms each one at a time would take 10 s: the requests overlapped.
    let times = consumer.timed_envelopes();
    let span = times.last().unwrap().0 - times.first().unwrap().0;
    assert!(span < Duration::from_secs(5), "{span:?}");
}

/// A consumer that counts the requests it holds at once per partition, taking `delay` over each.
#[derive(Default)]
struct InFlight {
    /// Per partition: requests held now, and the most held at once.
    per_partition: parking_lot::Mutex<BTreeMap<u64, (usize, usize)>>,
    received: parking_lot::Mutex<Vec<Value>>,
}

impl InFlight {
    /// Serves on a free port; returns it.
    async fn serve(self: &Arc<Self>, delay: Duration) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let me = self.clone();
        let app = axum::Router::new().route(
            "/mmmq/messages",
            axum::routing::post(move |axum::Json(e): axum::Json<Value>| {
                let me = me.clone();
                async move {
                    let partition = e["partition"].as_u64().expect("an envelope");
                    {
                        let mut all = me.per_partition.lock();
                        let (now, most) = all.entry(partition).or_default();
                        *now += 1;
                        *most = (*most).max(*now);
                    }
                    me.received.lock().push(e);
                    tokio::time::sleep(delay).await;
                    me.per_partition.lock().get_mut(&partition).unwrap().0 -= 1;
                    axum::Json(json!({"ack": "ACK"}))
                }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        port
    }
}

/// Lanes spread keys by a hash of their own. By the partitioner's (`murmur2(key) % 8`, lanes
/// `murmur2(key) % 8`) every key of a partition took the same lane of 8: one request in flight
/// per partition. Now each of 8 partitions has several at once, each key still in order and each
/// message delivered once.
#[tokio::test(flavor = "multi_thread")]
async fn eight_lanes_overlap_within_each_of_eight_partitions() {
    let tmp = tempfile::tempdir().unwrap();
    let consumer = Arc::new(InFlight::default());
    let port = consumer.serve(Duration::from_millis(20)).await;
    write_dispatchers(
        tmp.path(),
        &json!([lanes_dispatcher("wide", "wide", port, 8)]),
    );
    let broker = Broker::start(tmp.path()).await;
    let (status, t) = broker
        .put("/mmmq/topics/wide", &json!({"partitions": 8}))
        .await;
    assert_eq!(status, 200, "{t}");
    // 200 keys: at least 13 on each partition (short keys leave partition 7 the fewest).
    broker.produce_keyed("wide", 200, 0..2).await;
    mmmq_tests::eventually(WAIT, "400 envelopes", || {
        (consumer.received.lock().len() >= 400).then_some(())
    })
    .await;
    let d = broker.dispatcher_when("wide", |d| d["lag"] == 0).await;
    assert_eq!(d["delivered"], 400, "{d}");
    let got = consumer.received.lock().clone();
    check_per_key_order(&got, 200, 2);
    let most: BTreeMap<u64, usize> = consumer
        .per_partition
        .lock()
        .iter()
        .map(|(&p, &(_, most))| (p, most))
        .collect();
    assert_eq!(most.len(), 8, "{most:?}");
    assert!(
        most.values().all(|&m| (2..=8).contains(&m)),
        "most requests in flight at once per partition: {most:?}"
    );
}

/// A key whose messages are NACKed is retried and dead-lettered in its lane while every other key
/// flows; the dead-letter topic holds exactly its messages.
#[tokio::test(flavor = "multi_thread")]
async fn a_nacking_key_holds_back_only_its_lane() {
    let tmp = tempfile::tempdir().unwrap();
    let consumer = Consumer::start_slow(
        0,
        Arc::new(|e: &Value| {
            if e["key"] == "k0" {
                Answer::Nack
            } else {
                Answer::Ack
            }
        }),
        Duration::from_millis(20),
    )
    .await;
    write_dispatchers(
        tmp.path(),
        &json!([lanes_dispatcher("picky", "nack", consumer.port, 8)]),
    );
    let broker = Broker::start(tmp.path()).await;
    broker.produce_keyed("nack", 8, 0..5).await;
    let d = broker.dispatcher_when("picky", |d| d["lag"] == 0).await;
    assert_eq!(d["deadLettered"], 5, "{d}");
    assert_eq!(d["delivered"], 35, "{d}");
    let got = consumer.envelopes();
    let good: Vec<Value> = got.iter().filter(|e| e["key"] != "k0").cloned().collect();
    check_per_key_order(&good, 7, 5);
    // k0 got 3 attempts per message (maxNackRetries 2), in order.
    let k0: Vec<u64> = got
        .iter()
        .filter(|e| e["key"] == "k0")
        .map(|e| e["content"]["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(k0, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]);
    let dlq = broker.pull_all("__dlq.picky").await;
    let seqs: Vec<u64> = dlq
        .iter()
        .map(|e| e["content"]["envelope"]["content"]["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [0, 1, 2, 3, 4]);
    // Keys in other lanes than k0's were not held back behind its retries: their last message
    // arrived before k0's last attempt. (Keys hashed to k0's lane wait for it, in key order.)
    let lane = |k: &str| mmmq::dispatch::lane_of(Some(k), 0, 8);
    let other_lane = |e: &Value| lane(e["key"].as_str().unwrap()) != lane("k0");
    let times = consumer.timed_envelopes();
    assert!(times.iter().any(|(_, e)| other_lane(e)));
    let last_good = times.iter().rposition(|(_, e)| other_lane(e)).unwrap();
    let last_k0 = times.iter().rposition(|(_, e)| e["key"] == "k0").unwrap();
    assert!(last_good < last_k0, "good keys waited for k0's retries");
}

/// After a clean stop, nothing ACKed is delivered again, though lanes finished out of offset
/// order: the checkpoint keeps the done offsets above the low watermark.
#[tokio::test(flavor = "multi_thread")]
async fn a_clean_restart_with_lanes_delivers_nothing_twice() {
    let tmp = tempfile::tempdir().unwrap();
    // k0 is slow (it holds the low watermark back), the other keys are quick.
    let policy = Arc::new(|_: &Value| Answer::Ack);
    let consumer = Consumer::start_slow(0, policy, Duration::from_millis(2)).await;
    write_dispatchers(
        tmp.path(),
        &json!([lanes_dispatcher("r", "restart", consumer.port, 16)]),
    );
    let broker = Broker::start(tmp.path()).await;
    broker.produce_keyed("restart", 50, 0..10).await;
    // Stop while delivery is under way.
    consumer.wait_for(100, WAIT).await;
    assert!(broker.terminate().success());
    let before = consumer.envelopes().len();
    let checkpoint =
        std::fs::read(tmp.path().join("topics/restart/checkpoints/r.checkpoint")).unwrap();
    assert!(
        checkpoint.len() >= 8 && (checkpoint.len() - 8).is_multiple_of(16),
        "{}",
        checkpoint.len()
    );
    let broker = Broker::start(tmp.path()).await;
    broker.dispatcher_when("r", |d| d["lag"] == 0).await;
    let got = consumer.envelopes();
    assert!(got.len() > before);
    check_per_key_order(&got, 50, 10);
    assert!(broker.terminate().success());
}

/// SIGKILLs under load with 16 lanes: nothing acknowledged is lost; within each run of the broker
/// every key's messages arrive in order, and a restart never skips ahead of what a key had;
/// a message comes again only after a kill, and only if it was first delivered within the last
/// checkpoint interval (50 ms, 300 ms allowed for a busy machine) before that kill.
#[tokio::test(flavor = "multi_thread")]
async fn sigkill_with_lanes_loses_nothing_and_keeps_each_key_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let consumer =
        Consumer::start_slow(0, Arc::new(|_| Answer::Ack), Duration::from_millis(2)).await;
    write_dispatchers(
        tmp.path(),
        &json!([lanes_dispatcher("k", "kill", consumer.port, 16)]),
    );
    let keys = 32u64;
    let mut kills = Vec::new();
    let mut seq = 0u64;
    for cycle in 0..4 {
        let broker = Broker::start(tmp.path()).await;
        broker.produce_keyed("kill", keys, seq..seq + 40).await;
        seq += 40;
        let target = consumer.envelopes().len() + 500;
        consumer.wait_for(target, WAIT).await;
        if cycle < 3 {
            // The moment the process is gone (a request it sent just before still counts as
            // before the kill, however late the consumer's handler records it).
            broker.kill();
            tokio::time::sleep(Duration::from_millis(20)).await;
            kills.push(std::time::Instant::now());
        } else {
            broker.dispatcher_when("k", |d| d["lag"] == 0).await;
            assert!(broker.terminate().success());
        }
    }
    let timed = consumer.timed_envelopes();
    // Every message arrived.
    let mut first_seen: BTreeMap<(String, u64), std::time::Instant> = BTreeMap::new();
    for (at, e) in &timed {
        let k = (
            e["key"].as_str().unwrap().to_owned(),
            e["content"]["seq"].as_u64().unwrap(),
        );
        first_seen.entry(k).or_insert(*at);
    }
    assert_eq!(first_seen.len() as u64, keys * seq);
    // Per run: each key in order; across runs: no key skips ahead.
    let run_of = |at: std::time::Instant| kills.iter().filter(|&&k| k <= at).count();
    let mut last: BTreeMap<(String, usize), u64> = BTreeMap::new();
    let mut high: BTreeMap<String, u64> = BTreeMap::new();
    for (at, e) in &timed {
        let key = e["key"].as_str().unwrap().to_owned();
        let s = e["content"]["seq"].as_u64().unwrap();
        let run = run_of(*at);
        if let Some(&before) = last.get(&(key.clone(), run)) {
            assert!(s > before, "key {key}, run {run}: {s} after {before}");
        } else if let Some(&h) = high.get(&key) {
            assert!(s <= h + 1, "key {key} skipped from {h} to {s} at run {run}");
        }
        last.insert((key.clone(), run), s);
        let h = high.entry(key).or_insert(s);
        *h = (*h).max(s);
    }
    // Redeliveries: only after a kill, of messages first delivered shortly before it.
    let mut seen = HashSet::new();
    let mut again = 0;
    for (at, e) in &timed {
        let k = (
            e["key"].as_str().unwrap().to_owned(),
            e["content"]["seq"].as_u64().unwrap(),
        );
        if !seen.insert(k.clone()) {
            again += 1;
            let first = first_seen[&k];
            let kill = kills
                .iter()
                .find(|&&kill| kill >= first && kill <= *at)
                .unwrap_or_else(|| panic!("{k:?} delivered twice without a kill in between"));
            assert!(
                *kill - first <= Duration::from_millis(300),
                "{k:?} was first delivered {:?} before the kill",
                *kill - first
            );
        }
    }
    eprintln!(
        "lanes SIGKILL campaign: {} kills, {again} redeliveries",
        kills.len()
    );
}
