//! Kafka clients nobody here wrote, in Python and JavaScript (docs/kafka.md): confluent-kafka
//! (librdkafka 2.x) and kafka-python, from the venv `./scripts/test` makes (`MMMQ_KAFKA_PYTHON`),
//! driven by `tests/kafka/clients.py`, and kafkajs from npm (`MMMQ_KAFKAJS_NODE_PATH`), driven by
//! `tests/kafka/kafkajs.js`, against the real binary: an idempotent producer across a SIGKILL
//! of the broker, a consumer group of three with one killed, kafka-python's and kafkajs's own
//! protocol code.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use mmmq_tests::kafka::Client;
use mmmq_tests::{Broker, eventually};
use serde_json::{Value, json};

async fn start(root: &Path, kafka: &str) -> Broker {
    Broker::start_with(root, &["--kafka-listen", kafka]).await
}

/// An idempotent producer (acks=all) while the broker is SIGKILLed and started again on the
/// same port: every record is acknowledged, and each is stored exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_producer_stores_each_record_once_across_a_sigkill() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", mmmq_tests::free_port());
    let broker = start(tmp.path(), &kafka).await;
    let (status, body) = broker
        .put("/mmmq/topics/idem", &json!({"partitions": 3}))
        .await;
    assert_eq!(status, 200, "{body}");
    let n = 30_000;
    let producer = Client::start(&["idempotent", &kafka, "idem", &n.to_string()]);
    eventually(
        Duration::from_secs(60),
        "5,000 records acknowledged",
        || (producer.count("acked ") >= 5_000).then_some(()),
    )
    .await;
    broker.kill();
    let broker = start(tmp.path(), &kafka).await;
    producer.produced_all(Duration::from_secs(120), n).await;
    let mut seen: HashMap<String, usize> = HashMap::new();
    for p in 0..3 {
        for m in pull_partition(&broker, "idem", p).await {
            *seen.entry(value_of(&m)).or_default() += 1;
        }
    }
    let twice: Vec<_> = seen.iter().filter(|(_, c)| **c > 1).collect();
    assert!(
        twice.is_empty(),
        "stored twice: {} e.g. {:?}",
        twice.len(),
        twice.first()
    );
    assert_eq!(seen.len(), n, "every record stored");
}

/// A record's value as text: JSON content as its text, else the bytes of `contentBase64`.
fn value_of(m: &Value) -> String {
    use base64::Engine;
    match m.get("contentBase64").and_then(Value::as_str) {
        Some(b) => {
            String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b).unwrap()).unwrap()
        }
        None => m["content"].to_string(),
    }
}

/// Every message of one partition, by pull.
async fn pull_partition(broker: &Broker, topic: &str, p: u32) -> Vec<Value> {
    let mut out = Vec::new();
    let mut from = 0;
    loop {
        let (status, body) = broker
            .get(&format!(
                "/mmmq/topics/{topic}/messages?partition={p}&from={from}&max=1000"
            ))
            .await;
        assert_eq!(status, 200, "{body}");
        let next = body["next"].as_u64().unwrap();
        if next == from {
            return out;
        }
        out.extend(body["messages"].as_array().unwrap().iter().cloned());
        from = next;
    }
}

/// Three members over six partitions, one SIGKILLed mid-stream: the others take its partitions
/// over after its session timeout, every record is consumed, no partition is held by two members
/// at once at a generation's end, and the group's commits are the partitions' ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_three_survives_a_member_killed_mid_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", mmmq_tests::free_port());
    let broker = start(tmp.path(), &kafka).await;
    let (status, body) = broker
        .put("/mmmq/topics/work", &json!({"partitions": 6}))
        .await;
    assert_eq!(status, 200, "{body}");
    let n = 6_000usize;
    for chunk in 0..(n / 500) {
        let batch: Vec<_> = (0..500)
            .map(|i| {
                let v = chunk * 500 + i;
                json!({"topic": "work", "key": format!("k{v}"), "content": v})
            })
            .collect();
        let (status, body) = broker.post("/mmmq/messages/batch", &json!(batch)).await;
        assert_eq!(status, 200, "{body}");
    }
    // Each member takes 2 ms a record: the stream outlasts the kill.
    let members: Vec<Client> = (0..3)
        .map(|_| Client::start(&["member", &kafka, "g3", "work", "2"]))
        .collect();
    eventually(
        Duration::from_secs(60),
        "every member assigned partitions",
        || {
            members
                .iter()
                .all(|m| {
                    m.lines()
                        .iter()
                        .any(|l| l.starts_with("assigned ") && l != "assigned -")
                })
                .then_some(())
        },
    )
    .await;
    eventually(
        Duration::from_secs(60),
        "the first member mid-stream",
        || (members[0].count("rec ") >= 200).then_some(()),
    )
    .await;
    let mut members = members.into_iter();
    let mut victim = members.next().unwrap();
    victim.child.kill().await.unwrap();
    let survivors: Vec<Client> = members.collect();
    // Everything consumed by someone.
    let consumed = |all: &[&Client]| {
        let mut got: BTreeMap<(u32, u64), String> = BTreeMap::new();
        for c in all {
            for l in c.lines() {
                let f: Vec<&str> = l.split(' ').collect();
                // (A member killed mid-line leaves a partial last line.)
                if f[0] == "rec" && f.len() == 4 {
                    got.insert(
                        (f[1].parse().unwrap(), f[2].parse().unwrap()),
                        f[3].to_owned(),
                    );
                }
            }
        }
        got
    };
    eventually(Duration::from_secs(120), "every record consumed", || {
        let all = [&victim, &survivors[0], &survivors[1]];
        (consumed(&all).len() == n).then_some(())
    })
    .await;
    let all = [&victim, &survivors[0], &survivors[1]];
    let got = consumed(&all);
    let values: std::collections::BTreeSet<u64> =
        got.values().map(|v| v.parse().unwrap()).collect();
    assert_eq!(values.len(), n);
    // The survivors rebalanced after the kill: each was assigned again.
    for s in &survivors {
        assert!(
            s.count("assigned ") >= 2,
            "{:?}",
            s.lines()
                .iter()
                .filter(|l| !l.starts_with("rec"))
                .collect::<Vec<_>>()
        );
    }
    // Commits kept: once the survivors are idle, the group's committed offsets are the ends.
    eventually(
        Duration::from_secs(30),
        "commits at every partition's end",
        || {
            let mut ends = 0;
            for p in 0..6u32 {
                let path = if p == 0 {
                    tmp.path()
                        .join("topics/work/checkpoints/groups/g3.checkpoint")
                } else {
                    tmp.path().join(format!(
                        "topics/work/partitions/{p}/checkpoints/groups/g3.checkpoint"
                    ))
                };
                if let Ok(b) = std::fs::read(path)
                    && b.len() >= 8
                {
                    let next = u64::from_be_bytes(b[..8].try_into().unwrap());
                    let count = got.keys().filter(|(q, _)| *q == p).count() as u64;
                    if next == count {
                        ends += 1;
                    }
                }
            }
            (ends == 6).then_some(())
        },
    )
    .await;
    // Kafka's admin API (ListGroups, DescribeGroups) through confluent-kafka's AdminClient: the
    // group stable with its two live members, which own the six partitions between them.
    let admin = Client::start(&["groups", &kafka, "g3"]);
    eventually(Duration::from_secs(30), "the admin client done", || {
        (admin.count("done") == 1).then_some(())
    })
    .await;
    let lines = admin.lines();
    assert!(lines.contains(&"listed g3 STABLE".to_owned()), "{lines:?}");
    assert!(
        lines.contains(&"described g3 STABLE range 2".to_owned()),
        "{lines:?}"
    );
    let mut owned: Vec<u32> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("member "))
        .flat_map(|l| l.rsplit(' ').next().unwrap().split(','))
        .map(|p| p.parse().unwrap())
        .collect();
    owned.sort();
    assert_eq!(owned, [0, 1, 2, 3, 4, 5], "{lines:?}");
    // HTTP's group listing shows the Kafka group: its two live members own the six partitions,
    // each committed at its end.
    let (status, body) = broker.get("/mmmq/groups").await;
    assert_eq!(status, 200, "{body}");
    let listed = body
        .as_array()
        .or(body["groups"].as_array())
        .unwrap_or_else(|| panic!("{body}"));
    let g = listed
        .iter()
        .find(|g| g["group"] == "g3")
        .unwrap_or_else(|| panic!("{body}"))
        .clone();
    assert_eq!(g["protocol"], "kafka", "{g}");
    assert_eq!(g["pattern"], "work", "{g}");
    assert_eq!(g["members"].as_array().unwrap().len(), 2, "{g}");
    let parts = g["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 6, "{g}");
    assert!(
        parts
            .iter()
            .all(|p| p["lag"] == 0 && p["owner"].is_string()),
        "{g}"
    );
    let (status, one) = broker.get("/mmmq/groups/g3").await;
    assert_eq!((status, &one["protocol"]), (200, &json!("kafka")), "{one}");
}

/// kafka-python (its own protocol code, not librdkafka): produce, consume in a group, commit,
/// read the commit back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_python_produces_consumes_and_commits() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", mmmq_tests::free_port());
    let broker = start(tmp.path(), &kafka).await;
    let client = Client::start(&["kafka_python", &kafka, "kp", "100"]);
    let line = eventually(Duration::from_secs(60), "kafka-python done", || {
        client.lines().into_iter().find(|l| l.starts_with("ok "))
    })
    .await;
    assert_eq!(line, "ok 100 100");
    assert_eq!(broker.pull_all("kp").await.len(), 100);
}

/// kafkajs (JavaScript, its own protocol code): CreateTopics, an idempotent producer with keys
/// and headers, a consumer group that commits, the commits and the group list read back; the
/// same records over HTTP at the same offsets, and an HTTP produce with one of the keys lands
/// in the partition kafkajs's (Java's) partitioner chose for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafkajs_produces_consumes_and_commits() {
    use base64::Engine;
    let tmp = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", mmmq_tests::free_port());
    let broker = start(tmp.path(), &kafka).await;
    let n = 700;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("kafka/kafkajs.js");
    let out = tokio::process::Command::new("node")
        .arg(script)
        .args([&kafka, "kjs", &n.to_string()])
        .env(
            "NODE_PATH",
            std::env::var("MMMQ_KAFKAJS_NODE_PATH").unwrap_or_default(),
        )
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .expect("kafkajs done within 2 minutes")
        .expect("node runs (./scripts/test installs kafkajs)");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success() && stdout.ends_with("ok\n"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // (partition, offset) -> (key, value, header), as kafkajs consumed them.
    let mut consumed: BTreeMap<(u64, u64), (String, String, String)> = BTreeMap::new();
    let mut committed: BTreeMap<u64, u64> = BTreeMap::new();
    for line in stdout.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        match f[0] {
            "rec" => {
                let at = (f[1].parse().unwrap(), f[2].parse().unwrap());
                let rec = (f[3].to_owned(), f[4].to_owned(), f[5].to_owned());
                assert!(consumed.insert(at, rec).is_none(), "twice: {line}");
            }
            "committed" => {
                committed.insert(f[1].parse().unwrap(), f[2].parse().unwrap());
            }
            _ => {}
        }
    }
    assert_eq!(consumed.len(), n, "each record once");
    assert!(stdout.contains("group kjs-group\n"), "{stdout}");
    // Each key in one partition, its values in the order sent; the header with its value.
    let mut partition_of_key: HashMap<String, u64> = HashMap::new();
    let mut last_of_key: HashMap<String, u64> = HashMap::new();
    for ((p, _), (key, value, header)) in &consumed {
        assert_eq!(
            *partition_of_key.entry(key.clone()).or_insert(*p),
            *p,
            "{key}"
        );
        let i: u64 = value[1..].parse().unwrap();
        assert_eq!(header, &format!("x{i}"));
        if let Some(before) = last_of_key.insert(key.clone(), i) {
            assert!(before < i, "{key}: v{i} after v{before}");
        }
    }
    // The group committed each partition's end.
    let mut ends: BTreeMap<u64, u64> = BTreeMap::new();
    for (p, offset) in consumed.keys() {
        let end = ends.entry(*p).or_default();
        *end = (*end).max(offset + 1);
    }
    assert_eq!(committed, ends);
    // Over HTTP: the same bytes at the same offsets.
    let engine = base64::engine::general_purpose::STANDARD;
    let mut over_http = 0;
    for p in 0..3u64 {
        let (status, body) = broker
            .get(&format!(
                "/mmmq/topics/kjs/messages?partition={p}&from=0&max=1000"
            ))
            .await;
        assert_eq!(status, 200, "{body}");
        for m in body["messages"].as_array().unwrap() {
            let offset = m["offset"].as_u64().unwrap();
            let (key, value, _) = &consumed[&(p, offset)];
            let stored = engine.decode(m["contentBase64"].as_str().unwrap()).unwrap();
            assert_eq!(
                (m["key"].as_str().unwrap(), &stored[..]),
                (&key[..], value.as_bytes())
            );
            over_http += 1;
        }
    }
    assert_eq!(over_http, n);
    // The key routing is Kafka's on both sides.
    let r: Value = broker
        .post(
            "/mmmq/messages",
            &json!({"topic": "kjs", "key": "k3", "content": 1}),
        )
        .await
        .1;
    assert_eq!(r["partition"].as_u64(), Some(partition_of_key["k3"]), "{r}");
}
