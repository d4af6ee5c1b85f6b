//! Emit exactly once (docs/plugins.md, "WebAssembly handlers"): the router example plugin moves every message
//! of a partitioned topic to `routed.<type>` while the real broker is SIGKILLed at random moments
//! and restarted, many times. The dispatcher checkpoints only every 2 s, so nearly every kill
//! leaves routed messages stored past the checkpoint, whose inputs are handled again after the
//! restart.
//!
//! At the end every input is in its routed topic exactly once, and a key's messages are there in
//! the order they were produced. The broker's log shows that re-runs did find what they had
//! already emitted (so the test exercised the crash window).
//!
//! A redrive's emits are checked the same way, with kills in the middle of the redrive.
//!
//! `MMMQ_EMIT_CRASH_CYCLES` sets the number of kills (20 by default), `MMMQ_CRASH_SEED` replays a
//! run (the seed is printed).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use mmmq_tests::{Broker, deploy_plugin, plugin_dispatcher, plugin_wasm, write_dispatchers};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

const TYPES: [&str; 3] = ["a", "b", "c"];
const KEYS: u64 = 7;
const BATCH: u64 = 40;

fn input(seq: u64) -> Value {
    json!({
        "topic": "orders",
        "key": format!("k{}", seq % KEYS),
        "id": format!("m-{seq}"),
        "content": {"type": TYPES[(seq % 3) as usize], "seq": seq},
    })
}

/// The kills' timing: from `MMMQ_CRASH_SEED` (a run replayed) or a new seed, printed.
fn crash_rng() -> StdRng {
    let seed = std::env::var("MMMQ_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("MMMQ_CRASH_SEED={seed}");
    StdRng::seed_from_u64(seed)
}

/// Produces batches of the next inputs until `stop`; `acked` is the first input not yet ACKed
/// (a batch that got no answer is sent again, with the same ids, by the next producer).
async fn produce_until(broker_url: String, acked: Arc<AtomicU64>, stop: Arc<AtomicBool>) {
    let http = reqwest::Client::new();
    while !stop.load(Ordering::Relaxed) {
        let from = acked.load(Ordering::Relaxed);
        let batch: Vec<Value> = (from..from + BATCH).map(input).collect();
        let answer = http
            .post(format!("{broker_url}/mmmq/messages/batch"))
            .json(&batch)
            .send()
            .await;
        match answer {
            Ok(r) if r.status() == 200 => acked.store(from + BATCH, Ordering::Relaxed),
            _ => return,
        }
    }
}

/// A root dir with the router example as dispatcher `router` on `orders` (`extra`: its other
/// fields).
fn router_root(extra: Value) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    deploy_plugin(tmp.path(), &plugin_wasm("router", None), "router.wasm");
    write_dispatchers(
        tmp.path(),
        &json!([plugin_dispatcher("router", "orders", "router.wasm", extra)]),
    );
    tmp
}

#[tokio::test(flavor = "multi_thread")]
async fn a_router_emits_every_message_once_through_sigkills() {
    let cycles = std::env::var("MMMQ_EMIT_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20u32);
    let mut rng = crash_rng();
    let tmp = router_root(json!({"maxInFlight": 3, "checkpointIntervalMs": 2000}));
    let acked = Arc::new(AtomicU64::new(0));
    let mut found_again = 0;
    {
        let broker = Broker::start(tmp.path()).await;
        assert_eq!(
            broker
                .put("/mmmq/topics/orders", &json!({"partitions": 3}))
                .await
                .0,
            200
        );
        assert_eq!(
            broker
                .put("/mmmq/topics/routed.a", &json!({"partitions": 2}))
                .await
                .0,
            200
        );
        broker.kill();
    }
    for cycle in 0..cycles {
        let broker = Broker::start(tmp.path()).await;
        let stop = Arc::new(AtomicBool::new(false));
        let producer = tokio::spawn(produce_until(
            broker.url.clone(),
            acked.clone(),
            stop.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..900))).await;
        let log = broker.log.clone();
        broker.kill();
        stop.store(true, Ordering::Relaxed);
        producer.await.unwrap();
        found_again += log
            .lock()
            .matches("emits stored before a restart found")
            .count();
        eprintln!(
            "cycle {cycle}: {} inputs acknowledged",
            acked.load(Ordering::Relaxed)
        );
    }
    // The last run: what the last kill left unanswered is produced again (the ids make it once),
    // then everything is routed.
    let broker = Broker::start(tmp.path()).await;
    let from = acked.load(Ordering::Relaxed);
    let batch: Vec<Value> = (from..from + BATCH).map(input).collect();
    assert_eq!(
        broker.post("/mmmq/messages/batch", &json!(batch)).await.0,
        200
    );
    let total = from + BATCH;
    let status = broker
        .dispatcher_when("router", |s| {
            s["lag"] == 0 && s["delivered"].as_u64().is_some()
        })
        .await;
    found_again += broker
        .log
        .lock()
        .matches("emits stored before a restart found")
        .count();
    assert_eq!(status["deadLettered"], 0, "{status}");

    // Every input once, in its type's topic, a key's inputs in produce order.
    let mut seen: HashMap<u64, (String, u32)> = HashMap::new();
    let mut duplicates = Vec::new();
    for t in TYPES {
        let topic = format!("routed.{t}");
        let partitions = if t == "a" { 2 } else { 1 };
        for p in 0..partitions {
            let mut last_of_key: BTreeMap<String, u64> = BTreeMap::new();
            let mut from = 0;
            loop {
                let (code, page) = broker
                    .get(&format!(
                        "/mmmq/topics/{topic}/messages?partition={p}&from={from}&max=1000"
                    ))
                    .await;
                assert_eq!(code, 200, "{page}");
                let messages = page["messages"].as_array().unwrap().clone();
                if messages.is_empty() {
                    break;
                }
                for m in &messages {
                    let seq = m["content"]["seq"].as_u64().unwrap();
                    assert_eq!(m["content"]["type"], t, "{m}");
                    let key = m["key"].as_str().unwrap().to_owned();
                    assert_eq!(key, format!("k{}", seq % KEYS), "{m}");
                    assert_eq!(m["origin"]["consumerId"], "router", "{m}");
                    if let Some(&prev) = last_of_key.get(&key) {
                        assert!(prev < seq, "{topic}/{p}: {key} has {seq} after {prev}");
                    }
                    last_of_key.insert(key, seq);
                    if let Some(first) = seen.insert(seq, (topic.clone(), p)) {
                        duplicates.push((seq, first));
                    }
                }
                from = page["next"].as_u64().unwrap();
            }
        }
    }
    assert!(duplicates.is_empty(), "emitted twice: {duplicates:?}");
    let missing: Vec<u64> = (0..total).filter(|s| !seen.contains_key(s)).collect();
    assert!(missing.is_empty(), "never emitted: {missing:?}");
    assert_eq!(seen.len() as u64, total);
    assert!(
        found_again > 0,
        "no restart found emits past the checkpoint: the crash window was never exercised"
    );
    eprintln!("{total} inputs, each emitted once; {found_again} restarts found earlier emits");
}

/// A source topic deleted and produced to again is a new log with new checkpoints: its emits are
/// bounded and found again after a crash like a first topic's, not confused with the old one's.
#[tokio::test(flavor = "multi_thread")]
async fn a_recreated_source_topic_emits_once_through_a_crash() {
    let tmp = router_root(json!({"checkpointIntervalMs": 60000}));
    let broker = Broker::start(tmp.path()).await;
    for seq in 0..5 {
        broker
            .produce("orders", json!({"type": "a", "seq": seq}))
            .await;
    }
    assert_eq!(broker.pull_until("routed.a", 5).await.len(), 5);
    assert_eq!(broker.delete("/mmmq/topics/orders").await.0, 200);
    // The new topic's first message is handled (its first checkpoint write takes that position)
    // before the other two come, which the next write (a minute later) would cover: a crash now
    // hands those two to the plugin again.
    broker
        .produce("orders", json!({"type": "a", "seq": 5}))
        .await;
    assert_eq!(broker.pull_until("routed.a", 6).await.len(), 6);
    for seq in 6..8 {
        broker
            .produce("orders", json!({"type": "a", "seq": seq}))
            .await;
    }
    assert_eq!(broker.pull_until("routed.a", 8).await.len(), 8);
    broker.kill();
    let broker = Broker::start(tmp.path()).await;
    let s = broker
        .dispatcher_when("router", |s| {
            s["topics"][0]["nextOffset"] == 3 && s["lag"] == 0
        })
        .await;
    assert!(
        s["delivered"].as_u64() >= Some(1),
        "nothing was handled again: {s}"
    );
    let seqs: Vec<u64> = broker
        .pull_all("routed.a")
        .await
        .iter()
        .map(|m| m["content"]["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (0..8).collect::<Vec<_>>());
}

/// The checkpoint file's next offset (its first 8 bytes), or 0.
/// A redrive's emits (docs/delivery.md, "Dead-letter redrive"): dead letters redriven to a plugin that now
/// ACKs them, the broker SIGKILLed in the middle of the redrive and the redrive continued after
/// each restart. Every dead letter's emits are stored once, with the dead letter as their origin:
/// a re-run finds what the killed redrive stored, and the redrive's position never passed emits
/// that were not stored yet.
#[tokio::test(flavor = "multi_thread")]
async fn a_redrives_emits_are_appended_once_through_sigkills() {
    const N: u64 = 4000;
    const CYCLES: u32 = 4;
    // Loop rounds per call: the redrive takes about a second, so the kills land inside it.
    const SPIN: u64 = 3_000_000;
    let mut rng = crash_rng();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    deploy_plugin(root, &plugin_wasm("testbed", None), "testbed.wasm");
    // Each message emits two messages to `out`, then takes the verdict the config gives.
    let dispatchers = |verdict: &str| {
        json!([plugin_dispatcher(
            "r",
            "src",
            "testbed.wasm",
            json!({
                "maxNackRetries": 0,
                "checkpointIntervalMs": 2000,
                "plugin": {"config": {"verdict": verdict}},
            })
        )])
    };
    write_dispatchers(root, &dispatchers("nack"));
    {
        let broker = Broker::start(root).await;
        let batch: Vec<Value> = (0..N)
            .map(|_| json!({"topic": "src", "content": {"do": "emit", "to": "out", "n": 2, "then": "config", "spin": SPIN}}))
            .collect();
        for chunk in batch.chunks(1000) {
            let (code, body) = broker.post("/mmmq/messages/batch", &json!(chunk)).await;
            assert_eq!(code, 200, "{body}");
        }
        broker
            .dispatcher_when("r", |s| s["deadLettered"] == N)
            .await;
        assert_eq!(
            broker.get("/mmmq/topics/out").await.0,
            404,
            "a NACKed call emitted"
        );
        // Stopped cleanly: the dispatcher's own position is past every message, so only the
        // redrive delivers them again.
        assert!(broker.terminate().success());
    }
    write_dispatchers(root, &dispatchers("ack"));
    let mut found_again = 0;
    for cycle in 0..CYCLES {
        let broker = Broker::start(root).await;
        let (code, body) = broker.post("/mmmq/dispatchers/r/redrive", &json!({})).await;
        assert_eq!(code, 200, "{body}");
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..600))).await;
        let log = broker.log.clone();
        let status = broker.dispatcher("r").await;
        broker.kill();
        found_again += log
            .lock()
            .matches("emits stored before a restart found")
            .count();
        eprintln!("cycle {cycle}: killed at {}", status["redrive"]);
    }
    let broker = Broker::start(root).await;
    let (code, body) = broker.post("/mmmq/dispatchers/r/redrive", &json!({})).await;
    assert_eq!(code, 200, "{body}");
    let done = broker
        .dispatcher_when("r", |s| s["redrive"]["running"] == false)
        .await;
    assert_eq!(done["redrive"]["remaining"], 0, "{done}");
    found_again += broker
        .log
        .lock()
        .matches("emits stored before a restart found")
        .count();

    let mut seen: HashMap<(u64, u64), u64> = HashMap::new();
    let mut duplicates = Vec::new();
    for m in broker.pull_all("out").await {
        let origin = &m["origin"];
        assert_eq!(origin["consumerId"], "r", "{m}");
        assert_eq!(origin["topic"], "__dlq.r", "{m}");
        // The dead letter at dlq offset k holds source offset k (all were dead-lettered in order).
        let (from, i) = (
            m["content"]["from"].as_u64().unwrap(),
            m["content"]["i"].as_u64().unwrap(),
        );
        assert_eq!(origin["offset"].as_u64(), Some(from), "{m}");
        assert_eq!(origin["index"].as_u64(), Some(i), "{m}");
        if let Some(n) = seen.insert((from, i), m["offset"].as_u64().unwrap()) {
            duplicates.push(((from, i), n));
        }
    }
    assert!(duplicates.is_empty(), "emitted twice: {duplicates:?}");
    let missing: Vec<(u64, u64)> = (0..N)
        .flat_map(|f| [(f, 0), (f, 1)])
        .filter(|k| !seen.contains_key(k))
        .collect();
    assert!(missing.is_empty(), "never emitted: {missing:?}");
    assert!(
        found_again > 0,
        "no restart found a redrive's emits: the crash window was never exercised"
    );
    eprintln!(
        "{N} dead letters, each one's emits stored once; {found_again} restarts found earlier emits"
    );
}
