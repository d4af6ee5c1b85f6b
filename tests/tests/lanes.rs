//! `maxInFlight` lanes end to end (README, "Dispatchers"): many requests in flight per partition,
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

/// Checks every (key, seq) arrived, each key's in the order produced; returns how many arrived.
fn check_per_key_order(got: &[Value], keys: u64, per_key: u64) {
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    let mut seen = HashSet::new();
    for e in got {
        let key = e["key"].as_str().unwrap().to_owned();
        let seq = e["content"]["seq"].as_u64().unwrap();
        assert!(
            seen.insert((key.clone(), seq)),
            "{key}/{seq} delivered twice"
        );
        if let Some(&before) = last.get(&key) {
            assert!(seq > before, "key {key}: {seq} arrived after {before}");
        }
        last.insert(key, seq);
    }
    assert_eq!(seen.len() as u64, keys * per_key);
}

async fn produce_keyed(broker: &Broker, topic: &str, keys: u64, per_key: u64) {
    let mut batch = Vec::new();
    for seq in 0..per_key {
        for k in 0..keys {
            batch.push(json!({"topic": topic, "key": format!("k{k}"), "content": {"seq": seq}}));
        }
    }
    for chunk in batch.chunks(500) {
        let (status, b) = broker.post("/mmmq/messages/batch", &json!(chunk)).await;
        assert_eq!(status, 200, "{b}");
    }
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
    produce_keyed(&broker, "lanes", 1000, 2).await;
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
    produce_keyed(&broker, "wide", 200, 2).await;
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
    produce_keyed(&broker, "nack", 8, 5).await;
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
    produce_keyed(&broker, "restart", 50, 10).await;
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

/// A fleet of three hosts, one of which fails for a while: its lanes move to the others (nothing
/// lost, each key in order), and once it answers again it gets lanes back.
#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_moves_the_lanes_of_a_failing_host_and_gives_them_back() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let tmp = tempfile::tempdir().unwrap();
    let acked: Arc<parking_lot::Mutex<Vec<(usize, Value)>>> = Arc::default();
    let down: Arc<Vec<AtomicBool>> = Arc::new((0..3).map(|_| AtomicBool::new(false)).collect());
    let mut consumers = Vec::new();
    for h in 0..3 {
        let (acked, down) = (acked.clone(), down.clone());
        let policy = Arc::new(move |e: &Value| {
            if down[h].load(Ordering::SeqCst) {
                return Answer::Error;
            }
            acked.lock().push((h, e.clone()));
            Answer::Ack
        });
        consumers.push(Consumer::start_slow(0, policy, Duration::from_millis(1)).await);
    }
    let host = |c: &Consumer| json!({"protocol": "HTTP", "address": "127.0.0.1", "port": c.port});
    write_dispatchers(
        tmp.path(),
        &json!([{"consumerId": "fleet", "pattern": "fleet", "maxInFlight": 6,
                 "hosts": consumers.iter().map(host).collect::<Vec<_>>()}]),
    );
    let broker = Broker::start(tmp.path()).await;
    let wait_acked = |n: usize| {
        let acked = acked.clone();
        mmmq_tests::eventually(WAIT, "acknowledgements", move || {
            (acked.lock().len() >= n).then_some(())
        })
    };
    produce_keyed(&broker, "fleet", 30, 5).await;
    wait_acked(150).await;
    down[1].store(true, Ordering::SeqCst);
    produce_keyed_from(&broker, "fleet", 30, 5, 10).await;
    wait_acked(300).await;
    let d = broker.dispatcher_when("fleet", |d| d["lag"] == 0).await;
    assert!(
        d["target"]["hosts"][1]["failures"].as_u64().unwrap() > 0,
        "{d}"
    );
    down[1].store(false, Ordering::SeqCst);
    let before = acked.lock().iter().filter(|(h, _)| *h == 1).count();
    // Host 1 gets lanes back once its rest is over.
    let mut round = 20;
    loop {
        produce_keyed_from(&broker, "fleet", 30, 1, round).await;
        round += 1;
        let n = 300 + 30 * (round - 20) as usize;
        wait_acked(n).await;
        if acked.lock().iter().filter(|(h, _)| *h == 1).count() > before {
            break;
        }
        assert!(round < 400, "host 1 never got lanes back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all: Vec<Value> = acked.lock().iter().map(|(_, e)| e.clone()).collect();
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    let mut seen = HashSet::new();
    for e in &all {
        let key = e["key"].as_str().unwrap().to_owned();
        let seq = e["content"]["seq"].as_u64().unwrap();
        assert!(
            seen.insert((key.clone(), seq)),
            "{key}/{seq} acknowledged twice"
        );
        if let Some(&before) = last.get(&key) {
            assert!(seq > before, "key {key}: {seq} after {before}");
        }
        last.insert(key, seq);
    }
    let produced = broker.pull_all("fleet").await.len();
    assert_eq!(all.len(), produced, "every message acknowledged once");
}

async fn produce_keyed_from(broker: &Broker, topic: &str, keys: u64, per_key: u64, from: u64) {
    let mut batch = Vec::new();
    for seq in from..from + per_key {
        for k in 0..keys {
            batch.push(json!({"topic": topic, "key": format!("k{k}"), "content": {"seq": seq}}));
        }
    }
    let (status, b) = broker.post("/mmmq/messages/batch", &json!(batch)).await;
    assert_eq!(status, 200, "{b}");
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
        produce_keyed_from(&broker, "kill", keys, 40, seq).await;
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

/// A consumer process (Python's `http.server`) that ACKs everything and appends each envelope it
/// ACKs to `log` as a JSON line; killed with SIGKILL, it is gone, connections and all.
fn python_consumer(port: u16, log: &std::path::Path) -> std::process::Child {
    let script = r#"
import http.server, json, sys
port, log = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        items = json.loads(body)
        items = items if isinstance(items, list) else [items]
        with open(log, "a") as f:
            for e in items:
                f.write(json.dumps(e) + "\n")
        out = b'{"ack":"ACK"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer.allow_reuse_address = True
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"#;
    std::process::Command::new("python3")
        .args(["-c", script, &port.to_string()])
        .arg(log)
        .spawn()
        .expect("python3 runs")
}

fn logged(log: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// A fleet of three consumer processes, one killed (SIGKILL) mid-stream: its lanes move to the
/// others, every message arrives, each key in order per host; restarted, it gets lanes again.
#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_survives_a_host_killed_mid_stream_and_takes_it_back() {
    let tmp = tempfile::tempdir().unwrap();
    let ports: Vec<u16> = (0..3).map(|_| mmmq_tests::free_port()).collect();
    let logs: Vec<std::path::PathBuf> = (0..3)
        .map(|h| tmp.path().join(format!("host{h}.jsonl")))
        .collect();
    let mut hosts: Vec<std::process::Child> = (0..3)
        .map(|h| python_consumer(ports[h], &logs[h]))
        .collect();
    let hosts_json: Vec<Value> = ports
        .iter()
        .map(|p| json!({"protocol": "HTTP", "address": "127.0.0.1", "port": p, "timeoutMs": 2000}))
        .collect();
    write_dispatchers(
        tmp.path(),
        &json!([{"consumerId": "py", "pattern": "py", "maxInFlight": 6, "hosts": hosts_json}]),
    );
    let broker = Broker::start(tmp.path()).await;
    let total = |logs: &[std::path::PathBuf]| logs.iter().map(|l| logged(l).len()).sum::<usize>();
    produce_keyed(&broker, "py", 30, 20).await;
    mmmq_tests::eventually(WAIT, "some deliveries", || {
        (total(&logs) > 100).then_some(())
    })
    .await;
    hosts[1].kill().unwrap();
    hosts[1].wait().unwrap();
    produce_keyed_from(&broker, "py", 30, 20, 20).await;
    broker.dispatcher_when("py", |d| d["lag"] == 0).await;
    // Every message arrived (a request the killed host read but never answered comes again).
    let all: Vec<Value> = logs.iter().flat_map(|l| logged(l)).collect();
    let unique: HashSet<(String, u64)> = all
        .iter()
        .map(|e| {
            (
                e["key"].as_str().unwrap().to_owned(),
                e["content"]["seq"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(unique.len(), 30 * 40);
    // Each host saw each key's messages in order.
    for log in &logs {
        let mut last: BTreeMap<String, u64> = BTreeMap::new();
        for e in logged(log) {
            let key = e["key"].as_str().unwrap().to_owned();
            let seq = e["content"]["seq"].as_u64().unwrap();
            if let Some(&before) = last.get(&key) {
                assert!(seq >= before, "{key}: {seq} after {before}");
            }
            last.insert(key, seq);
        }
    }
    let d = broker.dispatcher_when("py", |_| true).await;
    assert_eq!(d["target"]["hosts"][1]["healthy"], false, "{d}");
    // Back on its port, it gets lanes again.
    hosts[1] = python_consumer(ports[1], &logs[1]);
    let before = logged(&logs[1]).len();
    let deadline = std::time::Instant::now() + WAIT;
    let mut seq = 40;
    while logged(&logs[1]).len() == before {
        assert!(
            std::time::Instant::now() < deadline,
            "host 1 never got lanes back"
        );
        produce_keyed_from(&broker, "py", 30, 1, seq).await;
        seq += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for mut h in hosts {
        let _ = h.kill();
        let _ = h.wait();
    }
}
