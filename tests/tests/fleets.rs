//! Fleets (`hosts`, docs/dispatchers.md, "Dispatchers") end to end: a dispatcher's lanes served by several
//! consumers, moved off a host that fails and given back once it answers.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use mmmq_tests::{Answer, Broker, Consumer, write_dispatchers};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

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
    broker.produce_keyed("fleet", 30, 0..5).await;
    wait_acked(150).await;
    down[1].store(true, Ordering::SeqCst);
    broker.produce_keyed("fleet", 30, 10..15).await;
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
        broker.produce_keyed("fleet", 30, round..round + 1).await;
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
    let produced = broker.pull_all("fleet").await.len();
    assert_eq!(
        mmmq_tests::check_per_key_order(&all),
        produced,
        "every message acknowledged once"
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
    broker.produce_keyed("py", 30, 0..20).await;
    mmmq_tests::eventually(WAIT, "some deliveries", || {
        (total(&logs) > 100).then_some(())
    })
    .await;
    hosts[1].kill().unwrap();
    hosts[1].wait().unwrap();
    broker.produce_keyed("py", 30, 20..40).await;
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
        broker.produce_keyed("py", 30, seq..seq + 1).await;
        seq += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for mut h in hosts {
        let _ = h.kill();
        let _ = h.wait();
    }
}
