//! Disk faults through the whole broker: real HTTP, real files, a real HTTP consumer, with the
//! storage layer's file wrapper failing writes or fsyncs on demand (ENOSPC, EIO).
//!
//! What must hold while the disk fails: produces are NACKed with 503 (and `Retry-After`), nothing
//! half-written becomes visible, other topics, reads and delivery keep working; when the fault
//! clears, appends resume without a restart, at the next offset, and everything acknowledged is
//! there after a restart.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use mmmq::config::ServeConfig;
use mmmq::storage::vfs::fault::{FaultyFs, Op};
use mmmq::storage::{OsFs, Vfs};
use mmmq_tests::{Consumer, eventually, host_dispatcher, write_dispatchers};
use serde_json::{Value, json};
use tokio::sync::oneshot;

struct InProcess {
    url: String,
    http: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl InProcess {
    async fn start(root: &Path, vfs: Arc<dyn Vfs>) -> Self {
        let mut config = ServeConfig::new(root);
        config.retry_after = Duration::from_millis(200);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            mmmq::server::run_on(listener, config, vfs, async {
                let _ = stopped.await;
            })
            .await
            .expect("serve");
        });
        let http = reqwest::Client::new();
        let health = format!("{url}/healthz");
        for _ in 0..500 {
            if let Ok(r) = http.get(&health).send().await
                && r.status() == 200
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Self {
            url,
            http,
            stop: Some(stop),
            task,
        }
    }

    async fn produce(&self, topic: &str, n: u64) -> (u16, Value, Option<String>) {
        let r = self
            .http
            .post(format!("{}/mmmq/messages", self.url))
            .json(&json!({"topic": topic, "content": {"n": n}}))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let retry = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        (status, r.json().await.unwrap(), retry)
    }

    async fn get(&self, path: &str) -> Value {
        self.http
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    async fn pull(&self, topic: &str) -> Vec<u64> {
        let r = self
            .get(&format!("/mmmq/topics/{topic}/messages?from=0&max=1000"))
            .await;
        r["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"]["n"].as_u64().unwrap())
            .collect()
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap();
    }
}

const WAIT: Duration = Duration::from_secs(10);

/// A consumer, a `dispatchers.json` sending it topic `orders`, and a broker on a file system that
/// fails on demand.
async fn start_with_consumer(root: &Path) -> (Consumer, FaultyFs, InProcess) {
    start_with_consumer_and(root, json!({})).await
}

/// [`start_with_consumer`], with `extra` fields in the dispatcher's entry.
async fn start_with_consumer_and(root: &Path, extra: Value) -> (Consumer, FaultyFs, InProcess) {
    let consumer = Consumer::start().await;
    let mut spec = host_dispatcher("audit", "orders", consumer.port);
    for (field, value) in extra.as_object().expect("an object") {
        spec[field] = value.clone();
    }
    write_dispatchers(root, &json!([spec]));
    let fs = FaultyFs::new();
    let broker = InProcess::start(root, Arc::new(fs.clone())).await;
    (consumer, fs, broker)
}

fn delivered(consumer: &Consumer) -> Vec<u64> {
    consumer
        .of_topic("orders")
        .iter()
        .map(|e| e["content"]["n"].as_u64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_disk_nacks_produces_keeps_reads_and_delivery_going_and_appends_resume_when_it_clears()
 {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let (consumer, fs, broker) = start_with_consumer(root).await;
    let mut acked = Vec::new();
    let mut n = 0;
    for _ in 0..5 {
        let (status, body, _) = broker.produce("orders", n).await;
        assert_eq!(status, 200, "{body}");
        acked.push(n);
        n += 1;
    }
    for (op, errno, what) in [
        (Op::Write, libc::ENOSPC, "No space left on device"),
        (Op::Sync, libc::EIO, "Input/output error"),
    ] {
        // Only the segments of `orders` fail: its checkpoints and every other topic are fine.
        fs.fail(op, "orders/000", errno);
        for _ in 0..3 {
            let (status, body, retry) = broker.produce("orders", n).await;
            n += 1;
            assert_eq!(status, 503, "{body}");
            assert_eq!(body["ack"], "NACK", "{body}");
            assert!(body["error"].as_str().unwrap().contains(what), "{body}");
            assert_eq!(retry.as_deref(), Some("1"));
        }
        let (status, body, _) = broker.produce("elsewhere", 0).await;
        assert_eq!(status, 200, "another topic is unaffected: {body}");
        // Nothing NACKed is visible, everything ACKed still reads and is still delivered.
        assert_eq!(broker.pull("orders").await, acked);
        let want = acked.len();
        consumer.wait_for(want, WAIT).await;
        assert_eq!(delivered(&consumer), acked);

        fs.clear();
        // Appends resume without a restart once the log retries (200 ms here).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (status, body, _) = broker.produce("orders", n).await;
            if status == 200 {
                assert_eq!(body["offset"], acked.len() as u64, "{body}");
                acked.push(n);
                n += 1;
                break;
            }
            assert_eq!(status, 503, "{body}");
            n += 1;
            assert!(
                std::time::Instant::now() < deadline,
                "appends never resumed"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for _ in 0..3 {
            let (status, body, _) = broker.produce("orders", n).await;
            assert_eq!(status, 200, "{body}");
            acked.push(n);
            n += 1;
        }
        assert_eq!(broker.pull("orders").await, acked);
    }
    let want = acked.len();
    consumer.wait_for(want, WAIT).await;
    assert_eq!(delivered(&consumer), acked, "in order, once");
    broker.stop().await;

    // After a restart on the real file system: exactly the acknowledged messages, nothing
    // redelivered.
    let broker = InProcess::start(root, Arc::new(OsFs)).await;
    assert_eq!(broker.pull("orders").await, acked);
    let (status, body, _) = broker.produce("orders", n).await;
    assert_eq!(status, 200, "{body}");
    acked.push(n);
    consumer.wait_for(acked.len(), WAIT).await;
    assert_eq!(delivered(&consumer), acked);
    broker.stop().await;
}

/// A batch over two topics when one topic's disk fails: the other topic's share is stored, and the
/// 503 says exactly which elements were (so a retry of the rest duplicates nothing). The client's
/// `send_batch` retries only those, and ends with each message stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_topics_on_a_failing_disk_says_which_elements_were_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = FaultyFs::new();
    let broker = InProcess::start(tmp.path(), Arc::new(fs.clone())).await;
    for t in ["orders", "other"] {
        assert_eq!(broker.produce(t, 0).await.0, 200);
    }
    fs.fail(Op::Sync, "orders/000", libc::EIO);
    let batch = json!([
        {"topic": "orders", "content": {"n": 1}},
        {"topic": "other", "content": {"n": 1}},
        {"topic": "orders", "content": {"n": 2}},
        {"topic": "other", "content": {"n": 2}},
    ]);
    let r = broker
        .http
        .post(format!("{}/mmmq/messages/batch", broker.url))
        .json(&batch)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["ack"], "NACK", "{body}");
    assert!(body["error"].as_str().unwrap().contains("2 of 4"), "{body}");
    assert_eq!(
        body["results"],
        json!([
            {"topic": "orders", "ack": "NACK"},
            {"topic": "other", "partition": 0, "offset": 1, "ack": "ACK"},
            {"topic": "orders", "ack": "NACK"},
            {"topic": "other", "partition": 0, "offset": 2, "ack": "ACK"},
        ]),
        "{body}"
    );
    assert_eq!(broker.pull("other").await, [0, 1, 2]);
    assert_eq!(broker.pull("orders").await, [0]);

    // The client retries only what was not stored; the disk recovers during its retries.
    let producer = mmmq_client::Producer::new(&broker.url).unwrap().retries(30);
    let records: Vec<mmmq_client::Record<Value>> = [("orders", 3), ("other", 3), ("orders", 4)]
        .iter()
        .map(|(t, n)| mmmq_client::Record::new(*t, json!({"n": n})))
        .collect();
    let clear = {
        let fs = fs.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            fs.clear();
        })
    };
    let receipts = producer.send_batch(&records).await.unwrap();
    clear.await.unwrap();
    let offsets: Vec<(String, u64)> = receipts.into_iter().map(|r| (r.topic, r.offset)).collect();
    assert_eq!(
        offsets,
        [
            ("orders".into(), 1),
            ("other".into(), 3),
            ("orders".into(), 2)
        ]
    );
    assert_eq!(broker.pull("other").await, [0, 1, 2, 3]);
    assert_eq!(broker.pull("orders").await, [0, 3, 4]);
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_checkpoint_write_is_retried_and_delivery_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let (consumer, fs, broker) = start_with_consumer(root).await;
    fs.fail(Op::Sync, "checkpoints", libc::EIO);
    for n in 0..5 {
        assert_eq!(broker.produce("orders", n).await.0, 200);
    }
    consumer.wait_for(5, WAIT).await;
    let checkpoint = root.join("topics/orders/checkpoints/audit.checkpoint");
    assert!(!checkpoint.exists(), "the fault is on");
    fs.clear();
    // No new message arrives: the saver retries on its own until the final position is on disk.
    // (A retry may first persist an older position: the consumer can hold all five messages
    // before the broker has processed the last ACK, so the saver's newest value may still be 1.)
    eventually(WAIT, "the checkpoint to reach 5", || {
        std::fs::read(&checkpoint)
            .ok()
            .filter(|v| v[..] == 5u64.to_be_bytes())
    })
    .await;
    broker.stop().await;
    assert_eq!(delivered(&consumer), (0..5).collect::<Vec<_>>());
}

/// Sends `n` messages one at a time, each delivered before the next; returns how long it took and
/// how many checkpoint writes it cost.
async fn deliver_one_by_one(
    consumer: &Consumer,
    fs: &FaultyFs,
    broker: &InProcess,
    n: u64,
) -> (Duration, usize) {
    let started = std::time::Instant::now();
    for i in 0..n {
        assert_eq!(broker.produce("orders", i).await.0, 200);
        consumer.wait_for(i as usize + 1, WAIT).await;
    }
    // A checkpoint write syncs its temporary file once.
    (started.elapsed(), fs.syncs("audit.checkpoint"))
}

/// Checkpoints are batched: a consumer that keeps up with a steady producer costs at most one
/// checkpoint write per `checkpointIntervalMs` (50 ms by default), not one per delivery (which
/// doubled the broker's fsyncs), and a clean stop still writes the final position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_consumer_costs_a_checkpoint_write_per_interval_not_per_delivery() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let (consumer, fs, broker) = start_with_consumer(root).await;
    const N: u64 = 300;
    let (elapsed, writes) = deliver_one_by_one(&consumer, &fs, &broker, N).await;
    let bound = (elapsed.as_millis() / 50) as usize + 3;
    assert!(
        writes <= bound,
        "{writes} checkpoint writes for {N} deliveries in {elapsed:?}; at most {bound} expected"
    );
    broker.stop().await;
    let checkpoint = root.join("topics/orders/checkpoints/audit.checkpoint");
    assert_eq!(std::fs::read(&checkpoint).unwrap(), N.to_be_bytes());
    assert_eq!(delivered(&consumer), (0..N).collect::<Vec<_>>());
}

/// `checkpointIntervalMs: 0` trades fsyncs for the smallest redelivery window: a checkpoint write
/// after every delivery round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_interval_of_zero_writes_after_every_delivery() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let (consumer, fs, broker) =
        start_with_consumer_and(root, json!({"checkpointIntervalMs": 0})).await;
    const N: u64 = 40;
    let (_, writes) = deliver_one_by_one(&consumer, &fs, &broker, N).await;
    assert!(
        writes >= N as usize / 2,
        "{writes} checkpoint writes for {N} deliveries"
    );
    let dispatchers = broker.get("/mmmq/dispatchers").await;
    assert_eq!(dispatchers[0]["checkpointIntervalMs"], 0, "{dispatchers}");
    broker.stop().await;
}
