//! A cluster of real `mmmq serve` processes on 127.0.0.1 for the cluster tests, the fault
//! campaign and the failover benchmark (docs/cluster.md, "What a run is checked for").

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::Broker;
use crate::checker::{Ack, MsgId, PartitionKey, Replica, Report};

/// `n` brokers on 127.0.0.1 started as one cluster (`--node-id`, `--peers`), each in its own
/// root dir.
pub struct Cluster {
    /// The brokers by id - 1; `None` while one is down.
    pub brokers: Vec<Option<Broker>>,
    roots: Vec<tempfile::TempDir>,
    ports: Vec<u16>,
    args: Vec<String>,
}

impl Cluster {
    pub async fn start(n: usize, extra: &[&str]) -> Self {
        let roots: Vec<_> = (0..n).map(|_| tempfile::tempdir().unwrap()).collect();
        let mut ports: Vec<u16> = Vec::new();
        while ports.len() < n {
            ports.push(new_port(&ports));
        }
        let mut c = Self {
            brokers: Vec::new(),
            roots,
            ports,
            args: extra.iter().map(|s| s.to_string()).collect(),
        };
        let starts: Vec<_> = (1..=n as u64).map(|id| c.spawn(id)).collect();
        for b in futures_util::future::join_all(starts).await {
            c.brokers.push(Some(b));
        }
        c
    }

    pub fn peers(&self) -> String {
        self.ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn spawn(&self, id: u64) -> impl std::future::Future<Output = Broker> + use<> {
        let i = (id - 1) as usize;
        let root = self.roots[i].path().to_owned();
        let mut args = vec![
            "--listen".to_owned(),
            format!("127.0.0.1:{}", self.ports[i]),
            "--node-id".to_owned(),
            id.to_string(),
            "--peers".to_owned(),
            self.peers(),
        ];
        args.extend(self.args.iter().cloned());
        async move {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            Broker::start_with(&root, &refs).await
        }
    }

    /// Starts one more broker (the next id) on its own root dir and port, with `--peers`
    /// naming every broker and itself, as an operator starts one before `mmmq cluster
    /// add-broker`; answers its id and address. It is no member until added.
    pub async fn spawn_extra(&mut self) -> (u64, String) {
        self.roots.push(tempfile::tempdir().unwrap());
        let port = new_port(&self.ports);
        self.ports.push(port);
        let id = self.ports.len() as u64;
        let b = self.spawn(id).await;
        self.brokers.push(Some(b));
        (id, format!("127.0.0.1:{}", self.ports[(id - 1) as usize]))
    }

    /// The root dir of broker `id` (running or not).
    pub fn root(&self, id: u64) -> &std::path::Path {
        self.roots[(id - 1) as usize].path()
    }

    pub fn broker(&self, id: u64) -> &Broker {
        self.brokers[(id - 1) as usize].as_ref().expect("running")
    }

    /// Waits until broker `via` sees a metadata leader and `n` live brokers; answers the leader.
    pub async fn meta_leader(&self, via: u64) -> u64 {
        let b = self.broker(via);
        crate::eventually_async(Duration::from_secs(20), "a metadata leader", || async {
            let (_, v) = b.get("/mmmq/cluster").await;
            let live = v["brokers"]
                .as_array()
                .map_or(0, |a| a.iter().filter(|b| b["alive"] == true).count());
            let running = self.brokers.iter().flatten().count();
            (live == running)
                .then(|| v["meta"]["leader"].as_u64())
                .flatten()
        })
        .await
    }
}

impl Cluster {
    /// Waits until every partition has a leader that reports each replica 0 entries behind
    /// (a pull would not tell: it is answered by the leader).
    pub async fn caught_up(&self, via: u64) {
        let b = self.broker(via);
        crate::eventually_async(Duration::from_secs(20), "replicas caught up", || async {
            let (_, v) = b.get("/mmmq/cluster").await;
            let parts = v["partitions"].as_array()?;
            parts
                .iter()
                .all(|p| {
                    p["lag"]
                        .as_object()
                        .is_some_and(|l| l.values().all(|x| x.as_u64() == Some(0)))
                })
                .then_some(())
        })
        .await
    }

    /// Stops every broker cleanly (SIGTERM) and reads each one's replica of `topic`'s partition
    /// `p` from its files: offset → content.
    pub async fn stop_and_read(self, topic: &str, p: u32) -> Vec<Replica> {
        let mut all = self.stop_and_read_partitions(topic, p + 1).await;
        all.remove(&(topic.to_owned(), p)).expect("read")
    }

    /// Stops every broker cleanly (SIGTERM) and reads each one's replicas of `topic`'s
    /// partitions `0..n`.
    pub async fn stop_and_read_partitions(
        mut self,
        topic: &str,
        n: u32,
    ) -> BTreeMap<PartitionKey, Vec<Replica>> {
        for b in self.brokers.iter_mut() {
            if let Some(b) = b.take() {
                assert!(b.terminate().success());
            }
        }
        let mut all = BTreeMap::new();
        for p in 0..n {
            all.insert((topic.to_owned(), p), self.read(topic, p).await);
        }
        all
    }

    async fn read(&self, topic: &str, p: u32) -> Vec<Replica> {
        let mut replicas = Vec::new();
        for (i, root) in self.roots.iter().enumerate() {
            replicas.push(read_replica(i as u64 + 1, &partition_dir(root.path(), topic, p)).await);
        }
        replicas
    }
}

/// Partition `p` of `topic`'s directory under a broker's root dir.
pub fn partition_dir(root: &std::path::Path, topic: &str, p: u32) -> std::path::PathBuf {
    let dir = root.join("topics").join(topic);
    if p == 0 {
        dir
    } else {
        dir.join("partitions").join(p.to_string())
    }
}

/// What a producer of [`produce_until_stopped`] got: its acknowledgements, every message it
/// sent (acknowledged or not), and the longest it waited for one acknowledgement.
pub struct ProduceRun {
    pub acks: Vec<Ack>,
    pub sent: BTreeSet<MsgId>,
    pub longest_wait: Duration,
}

/// Produces `{"p": producer, "s": 0, 1, …}` to partition 0 of `topic` through broker `b`, one at
/// a time, each sent again until acknowledged (a leader change answers 503), until `stop`.
pub fn produce_until_stopped(
    b: &Broker,
    topic: &str,
    producer: u64,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<ProduceRun> {
    let (url, http, topic) = (b.url.clone(), b.http.clone(), topic.to_owned());
    tokio::spawn(async move {
        let mut run = ProduceRun {
            acks: Vec::new(),
            sent: BTreeSet::new(),
            longest_wait: Duration::ZERO,
        };
        for seq in 0.. {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                break;
            }
            let msg = MsgId { producer, seq };
            run.sent.insert(msg);
            let body = json!({"topic": &topic, "partition": 0, "content": msg.content()});
            let started = std::time::Instant::now();
            let offset = loop {
                let answer = http
                    .post(format!("{url}/mmmq/messages"))
                    .json(&body)
                    .send()
                    .await;
                if let Ok(r) = answer
                    && r.status() == 200
                {
                    let v: Value = r.json().await.unwrap();
                    break v["offset"].as_u64().unwrap();
                }
                // A 503 while the leader changes: sent again (it may be stored twice, as
                // contract §13 allows without an id), paced so as not to spin.
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            run.longest_wait = run.longest_wait.max(started.elapsed());
            run.acks.push(Ack {
                partition: (topic.clone(), 0),
                offset,
                msg,
            });
        }
        run
    })
}

/// A free port none of `taken` is: a port freed by one probe can be the next probe's too.
fn new_port(taken: &[u16]) -> u16 {
    loop {
        let p = crate::free_port();
        if !taken.contains(&p) {
            return p;
        }
    }
}

/// A replica's messages, read from its segment files as the broker left them.
pub async fn read_replica(broker: u64, dir: &std::path::Path) -> Replica {
    let dir = dir.to_owned();
    tokio::task::spawn_blocking(move || {
        let config = mmmq::storage::LogConfig {
            raft_header: true,
            ..Default::default()
        };
        let log = mmmq::storage::Log::open(&dir, Arc::new(mmmq::storage::OsFs), config)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut entries = std::collections::BTreeMap::new();
        let mut at = log.first_offset();
        loop {
            let frames = log.read_raft_from(at, 1000, 1 << 24).unwrap();
            let Some(last) = frames.last() else { break };
            at = last.offset + 1;
            for f in frames {
                let (_, payload) = f.entry.expect("no corrupt entry");
                let stored: Value = serde_json::from_slice(&payload).unwrap();
                entries.insert(f.offset, stored["content"].clone());
            }
        }
        Replica { broker, entries }
    })
    .await
    .unwrap()
}

/// Produces `msgs` of `producer` through broker `via`, one at a time; answers the acks.
pub async fn produce(
    c: &Cluster,
    via: u64,
    topic: &str,
    producer: u64,
    seqs: std::ops::Range<u64>,
) -> Vec<Ack> {
    let b = c.broker(via);
    let mut acks = Vec::new();
    for seq in seqs {
        let msg = MsgId { producer, seq };
        let (code, body) = b
            .post(
                "/mmmq/messages",
                &json!({"topic": topic, "content": msg.content()}),
            )
            .await;
        assert_eq!(code, 200, "{body}");
        acks.push(Ack {
            partition: (topic.to_owned(), body["partition"].as_u64().unwrap() as u32),
            offset: body["offset"].as_u64().unwrap(),
            msg,
        });
    }
    acks
}

/// Produces `msg` to `orders` through `b` until a leader acknowledges it (within `wait`).
pub async fn acked_once_leader(b: &Broker, msg: MsgId, wait: Duration) -> Ack {
    // A fresh connection each time: a pooled one may be closed by the broker as it is reused.
    let http = reqwest::Client::new();
    let body = crate::eventually_async(wait, "a produce acknowledged", || async {
        let answer = http
            .post(format!("{}/mmmq/messages", b.url))
            .json(&json!({"topic": "orders", "content": msg.content()}))
            .send()
            .await;
        let (code, body) = match answer {
            Ok(r) => (
                r.status().as_u16(),
                r.json::<Value>().await.unwrap_or(Value::Null),
            ),
            Err(e) => (0, json!(e.to_string())),
        };
        if code != 200 {
            eprintln!("produce through {}: {code} {body}", b.url);
        }
        (code == 200).then_some(body)
    })
    .await;
    Ack {
        partition: ("orders".to_owned(), 0),
        offset: body["offset"].as_u64().unwrap(),
        msg,
    }
}

pub fn sent(acks: &[Ack]) -> BTreeSet<MsgId> {
    acks.iter().map(|a| a.msg).collect()
}

/// The checker's report on the replicas of `orders`' partition 0, the topic the cluster tests
/// produce to.
pub fn check_orders(replicas: Vec<Replica>, acks: &[Ack], sent: &BTreeSet<MsgId>) -> Report {
    let replicas = std::collections::BTreeMap::from([(("orders".to_owned(), 0), replicas)]);
    crate::checker::check(&replicas, acks, sent)
}

/// Asserts that every replica holds `n` messages.
pub fn assert_each_holds(replicas: &[Replica], n: usize) {
    for r in replicas {
        assert_eq!(
            r.entries.len(),
            n,
            "broker {} holds every message",
            r.broker
        );
    }
}

impl Cluster {
    /// The leader of `topic`'s partition `p` as broker `via` sees it, if it names one.
    pub async fn leader_of(&self, via: u64, topic: &str, p: u32) -> Option<u64> {
        let (_, view) = self.broker(via).get("/mmmq/cluster").await;
        view["partitions"].as_array()?.iter().find_map(|x| {
            (x["topic"] == topic && x["partition"] == p)
                .then(|| x["leader"].as_u64())
                .flatten()
        })
    }

    /// Three brokers started with `--fault-injection`, `n` messages of producer 1 acknowledged
    /// on `orders` and every replica caught up: the cluster, the acks and the partition's
    /// leader with the two others.
    pub async fn faulty_with_orders(n: u64) -> (Self, Vec<Ack>, u64, Vec<u64>) {
        let c = Cluster::start(3, &["--fault-injection"]).await;
        c.meta_leader(1).await;
        let acks = produce(&c, 1, "orders", 1, 0..n).await;
        c.caught_up(1).await;
        let leader = c.leader_of(1, "orders", 0).await.expect("a leader");
        let others = (1..=3).filter(|b| *b != leader).collect();
        (c, acks, leader, others)
    }

    /// SIGKILLs broker `id`.
    pub fn kill(&mut self, id: u64) {
        if let Some(b) = self.brokers[(id - 1) as usize].take() {
            b.kill();
        }
    }

    /// SIGTERMs broker `id` and waits for its clean stop.
    pub fn terminate(&mut self, id: u64) -> std::process::ExitStatus {
        let b = self.brokers[(id - 1) as usize].take().expect("running");
        b.terminate()
    }

    /// Starts broker `id` again on its root dir (it must be down).
    pub async fn restart(&mut self, id: u64) {
        assert!(
            self.brokers[(id - 1) as usize].is_none(),
            "broker {id} is up"
        );
        let b = self.spawn(id).await;
        self.brokers[(id - 1) as usize] = Some(b);
    }

    /// Starts every broker that is down, all at once (a broker waits for its peers).
    pub async fn restart_down(&mut self) {
        let down: Vec<u64> = (1..=self.brokers.len() as u64)
            .filter(|id| self.brokers[(*id - 1) as usize].is_none())
            .collect();
        let starts: Vec<_> = down.iter().map(|id| self.spawn(*id)).collect();
        for (id, b) in down
            .into_iter()
            .zip(futures_util::future::join_all(starts).await)
        {
            self.brokers[(id - 1) as usize] = Some(b);
        }
    }

    /// Broker `id`'s base URL, whether it is up or not.
    pub fn url(&self, id: u64) -> String {
        format!("http://127.0.0.1:{}", self.ports[(id - 1) as usize])
    }

    /// The ids of the brokers that are up.
    pub fn running(&self) -> Vec<u64> {
        (1..=self.brokers.len() as u64)
            .filter(|id| self.brokers[(*id - 1) as usize].is_some())
            .collect()
    }

    /// Sets broker `id`'s outgoing Raft fault rules (`--fault-injection`): peer id → `"drop"` or
    /// `{"delayMs": n}`; `{}` heals.
    pub async fn faults(&self, id: u64, rules: &Value) {
        // An internal route: a member's only, by the members' secret the broker keeps in its
        // root dir once its cluster drew one (until then it takes any).
        let body = rules.to_string();
        for _ in 0..100 {
            let secret = self.member_secret(id);
            let cluster = std::fs::read_to_string(self.root(id).join("cluster").join("id"))
                .map(|s| s.trim().to_owned());
            let mut headers = vec![];
            if let Some(secret) = &secret {
                headers.push(("x-mmmq-member", secret.as_str()));
            }
            if let Ok(cluster) = &cluster {
                headers.push(("x-mmmq-cluster", cluster.as_str()));
            }
            let (code, _, answer) = self
                .broker(id)
                .send(
                    "PUT",
                    "/mmmq/internal/faults",
                    &headers,
                    Some((&body, Some("application/json"))),
                )
                .await;
            // 403: the id or the secret arrived between the reads and the request.
            if code == 403 && (secret.is_none() || cluster.is_err()) {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                continue;
            }
            assert_eq!(code, 200, "{answer}");
            return;
        }
        panic!("broker {id} refused the fault rules");
    }

    /// The members' secret broker `id` keeps, once its cluster drew one.
    pub fn member_secret(&self, id: u64) -> Option<String> {
        std::fs::read_to_string(self.root(id).join("cluster").join("secret"))
            .ok()
            .map(|s| s.trim().to_owned())
    }

    /// Makes broker `id`'s disk refuse every write and fsync of its storage with `error`
    /// (`"eio"`, `"enospc"`), or work again (`None`). Like every `PUT /mmmq/internal/faults`,
    /// it replaces the broker's link rules too (with none).
    pub async fn disk(&self, id: u64, error: Option<&str>) {
        self.faults(id, &json!({ "disk": error })).await;
    }

    /// Cuts broker `id` off from every other broker, both directions.
    pub async fn isolate(&self, id: u64) {
        let n = self.brokers.len() as u64;
        let all: serde_json::Map<String, Value> = (1..=n)
            .filter(|p| *p != id)
            .map(|p| (p.to_string(), json!("drop")))
            .collect();
        self.faults(id, &Value::Object(all)).await;
        for p in self.running() {
            if p != id {
                self.faults(p, &json!({ id.to_string(): "drop" })).await;
            }
        }
    }

    /// Heals every link of every running broker.
    pub async fn heal(&self) {
        for p in self.running() {
            self.faults(p, &json!({})).await;
        }
    }
}
