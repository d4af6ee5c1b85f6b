//! Kafka's protocol on a cluster of three brokers (docs/kafka.md, "In a cluster"), with clients
//! nobody here wrote: kcat's metadata names each partition's Raft leader, an idempotent
//! confluent-kafka producer follows the leaders across a SIGKILL of one and stores each record
//! once, and a consumer group carries on across a SIGKILL of its coordinator with its commits
//! kept in the replicated metadata.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use mmmq_tests::cluster::Cluster;
use mmmq_tests::eventually;
use mmmq_tests::eventually_async;
use mmmq_tests::kafka::{Client, kcat};
use serde_json::{Value, json};

/// A cluster whose brokers listen for Kafka on ports of their own; once every broker announced
/// its Kafka address and `topic` (with `partitions`) has a leader for each partition.
async fn cluster_with(topic: &str, partitions: u32) -> Cluster {
    let c = Cluster::start(3, &["--kafka-listen", "127.0.0.1:0"]).await;
    c.meta_leader(1).await;
    let (status, body) = c
        .broker(1)
        .put(
            &format!("/mmmq/topics/{topic}"),
            &json!({"partitions": partitions}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    c.caught_up(1).await;
    c
}

/// Every running broker's Kafka address, as `GET /mmmq/cluster` shows them, by broker id.
async fn kafka_addresses(c: &Cluster) -> BTreeMap<u64, String> {
    let via = c.running()[0];
    eventually_async(Duration::from_secs(20), "Kafka addresses", || async {
        let (_, v) = c.broker(via).get("/mmmq/cluster").await;
        let found: BTreeMap<u64, String> = v["brokers"]
            .as_array()?
            .iter()
            .filter_map(|b| Some((b["id"].as_u64()?, b["kafka"].as_str()?.to_owned())))
            .filter(|(id, _)| c.running().contains(id))
            .collect();
        (found.len() == c.running().len()).then_some(found)
    })
    .await
}

/// The leader of each partition of `topic`, as `GET /mmmq/cluster` shows it.
async fn leaders(c: &Cluster, topic: &str) -> BTreeMap<u32, u64> {
    let (_, v) = c.broker(c.running()[0]).get("/mmmq/cluster").await;
    v["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["topic"] == topic)
        .filter_map(|p| Some((p["partition"].as_u64()? as u32, p["leader"].as_u64()?)))
        .collect()
}

/// Reads every record of `topic` with kcat: `(partition, offset, key, value)`.
fn consume_all(bootstrap: &str, topic: &str) -> Vec<(u32, u64, String, String)> {
    let out = kcat(
        &[
            "-b",
            bootstrap,
            "-C",
            "-t",
            topic,
            "-o",
            "beginning",
            "-e",
            "-q",
            "-f",
            "%p %o %k %s\n",
        ],
        b"",
    );
    String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].to_owned(),
                f[3].to_owned(),
            )
        })
        .collect()
}

/// kcat's metadata, from any broker, lists the three brokers at their Kafka addresses and
/// names each partition's Raft leader; records produced through one bootstrap are read back
/// through another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_names_each_partitions_leader() {
    let c = cluster_with("kc", 6).await;
    let addrs = kafka_addresses(&c).await;
    let leaders = leaders(&c, "kc").await;
    assert_eq!(leaders.len(), 6, "{leaders:?}");
    for (id, addr) in &addrs {
        let listing = String::from_utf8(kcat(&["-b", addr, "-L", "-t", "kc"], b"")).expect("utf-8");
        assert!(listing.contains(" 3 brokers:"), "via {id}: {listing}");
        for (b, a) in &addrs {
            assert!(
                listing.contains(&format!("broker {b} at {a}")),
                "via {id}: {listing}"
            );
        }
        for (p, l) in &leaders {
            assert!(
                listing.contains(&format!("partition {p}, leader {l}, replicas: ")),
                "via {id}, partition {p} led by {l}: {listing}"
            );
        }
    }
    let input: String = (0..3000).map(|i| format!("k{}:v{i}\n", i % 40)).collect();
    kcat(
        &["-b", &addrs[&1], "-P", "-t", "kc", "-K:", "-X", "acks=all"],
        input.as_bytes(),
    );
    let got = consume_all(&addrs[&2], "kc");
    assert_eq!(got.len(), 3000);
    // Every replica holds the same records: each broker's HTTP view of the topic agrees.
    c.caught_up(1).await;
    let mut ends = Vec::new();
    for id in 1..=3 {
        let (_, t) = c.broker(id).get("/mmmq/topics/kc").await;
        let total: u64 = t["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["nextOffset"].as_u64().unwrap())
            .sum();
        ends.push(total);
    }
    assert_eq!(ends, vec![3000, 3000, 3000]);
}

/// An idempotent confluent-kafka producer (acks=all) while the leader of partition 0 is
/// SIGKILLed: every record is acknowledged, and each is stored exactly once, in order per key,
/// at dense offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_producer_follows_the_leaders_across_a_sigkill() {
    let mut c = cluster_with("idem", 6).await;
    let addrs = kafka_addresses(&c).await;
    let bootstrap = addrs.values().cloned().collect::<Vec<_>>().join(",");
    let n = 20_000;
    let producer = Client::start(&["idempotent", &bootstrap, "idem", &n.to_string()]);
    eventually(
        Duration::from_secs(60),
        "3,000 records acknowledged",
        || (producer.count("acked ") >= 3_000).then_some(()),
    )
    .await;
    let victim = leaders(&c, "idem").await[&0];
    c.kill(victim);
    producer.produced_all(Duration::from_secs(150), n).await;
    let old = addrs[&victim].clone();
    c.restart(victim).await;
    c.caught_up(c.running()[0]).await;
    // Read through the broker started again, once it announced its new port (0 picks one).
    let at = eventually_async(Duration::from_secs(20), "the new Kafka address", || async {
        Some(kafka_addresses(&c).await[&victim].clone()).filter(|a| *a != old)
    })
    .await;
    let records = consume_all(&at, "idem");
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut per_partition: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut per_key: HashMap<&str, Vec<u64>> = HashMap::new();
    for (p, o, k, v) in &records {
        *seen.entry(v.as_str()).or_default() += 1;
        per_partition.entry(*p).or_default().push(*o);
        per_key
            .entry(k.as_str())
            .or_default()
            .push(v.parse().unwrap());
    }
    let twice: Vec<_> = seen.iter().filter(|(_, c)| **c > 1).take(5).collect();
    assert!(twice.is_empty(), "stored more than once: {twice:?}");
    assert_eq!(seen.len(), n, "every record stored");
    for (p, offsets) in &per_partition {
        let dense: Vec<u64> = (0..offsets.len() as u64).collect();
        assert_eq!(offsets, &dense, "partition {p}'s offsets");
    }
    for (k, values) in &per_key {
        assert!(
            values.windows(2).all(|w| w[0] < w[1]),
            "key {k} out of order"
        );
    }
}

/// Two confluent-kafka members of a group while the broker coordinating it (the metadata
/// group's leader) is SIGKILLed: they find the new coordinator, every record is consumed, and
/// the commits they make land in the replicated metadata, shown by `GET /mmmq/groups` through
/// any broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_group_carries_on_across_a_coordinator_failover() {
    let mut c = cluster_with("work", 6).await;
    let addrs = kafka_addresses(&c).await;
    let bootstrap = addrs.values().cloned().collect::<Vec<_>>().join(",");
    let n = 6000;
    let input: String = (0..n).map(|i| format!("k{}:{i}\n", i % 50)).collect();
    kcat(
        &[
            "-b", &bootstrap, "-P", "-t", "work", "-K:", "-X", "acks=all",
        ],
        input.as_bytes(),
    );
    let members: Vec<Client> = (0..2)
        .map(|_| Client::start(&["member", &bootstrap, "cg", "work", "2"]))
        .collect();
    let consumed = |members: &[Client]| -> HashMap<String, usize> {
        let mut seen = HashMap::new();
        for m in members {
            for l in m.lines() {
                if let Some(rest) = l.strip_prefix("rec ") {
                    let v = rest.rsplit(' ').next().unwrap().to_owned();
                    *seen.entry(v).or_default() += 1;
                }
            }
        }
        seen
    };
    eventually(Duration::from_secs(60), "1,000 records consumed", || {
        (consumed(&members).len() >= 1000).then_some(())
    })
    .await;
    let coordinator = c.meta_leader(1).await;
    // What the group committed before the failover, and how often each member was assigned.
    let (_, g) = c.broker(coordinator).get("/mmmq/groups/cg").await;
    let committed_before: HashMap<u64, u64> = g["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let committed = p["committed"].as_u64().unwrap_or(0);
            (p["partition"].as_u64().unwrap(), committed)
        })
        .collect();
    assert!(committed_before.values().any(|c| *c > 0), "{g}");
    let assigned_before: Vec<usize> = members.iter().map(|m| m.count("assigned ")).collect();
    c.kill(coordinator);
    eventually(Duration::from_secs(120), "every record consumed", || {
        (consumed(&members).len() == n).then_some(())
    })
    .await;
    // The new coordinator knew none of the members: each joined again, and resumed where the
    // group had committed, never before (with no commits read back it would start again at
    // the partitions' beginnings: `auto.offset.reset=earliest`).
    let mut resumed = 0;
    for (m, before) in members.iter().zip(assigned_before) {
        assert!(
            m.count("assigned ") > before,
            "no rebalance after the failover"
        );
        let lines = m.lines();
        let last = lines
            .iter()
            .rposition(|l| l.starts_with("assigned "))
            .unwrap();
        for l in &lines[last..] {
            let Some(rest) = l.strip_prefix("rec ") else {
                continue;
            };
            let mut fields = rest.split(' ');
            let p: u64 = fields.next().unwrap().parse().unwrap();
            let offset: u64 = fields.next().unwrap().parse().unwrap();
            assert!(
                offset >= committed_before[&p],
                "partition {p} read again from {offset}, below its commit {}",
                committed_before[&p]
            );
            resumed += 1;
        }
    }
    assert!(resumed > 0, "no record consumed after the rebalance");
    // The members commit when idle: the group's commits reach every partition's end, in the
    // metadata every broker holds.
    let via = c.running()[0];
    let group: Value = eventually_async(Duration::from_secs(60), "commits at the ends", || async {
        let (status, g) = c.broker(via).get("/mmmq/groups/cg").await;
        let parts = g["partitions"].as_array()?;
        (status == 200
            && parts.len() == 6
            && parts
                .iter()
                .all(|p| p["committed"] == p["nextOffset"] && p["lag"] == 0))
        .then_some(g)
    })
    .await;
    assert_eq!(group["protocol"], "kafka", "{group}");
    let ends: u64 = group["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["committed"].as_u64().unwrap())
        .sum();
    assert_eq!(ends, n as u64);
    drop(members);
    c.restart(coordinator).await;
}

/// A commit's metadata string and a group id that is not a consumer id (librdkafka 0099 and
/// 0132) are kept in the replicated metadata: the next coordinator answers both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_metadata_and_any_group_id_survive_a_coordinator_failover() {
    use kafka_protocol::messages::{ApiKey, OffsetCommitResponse};
    use mmmq_tests::kafka_wire::{Conn, commit, fetched};
    let mut c = cluster_with("meta", 1).await;
    let coordinator = c.meta_leader(1).await;
    let kafka = kafka_addresses(&c).await;
    let mut conn = Conn::open(&kafka[&coordinator]).await;
    let r: OffsetCommitResponse = conn
        .call(
            ApiKey::OffsetCommit,
            8,
            &commit("a,b", "meta", 5, Some("M")),
        )
        .await;
    assert_eq!(r.topics[0].partitions[0].error_code, 0);
    assert_eq!(fetched(&mut conn, "a,b", "meta").await, (0, 5, "M".into()));
    drop(conn);
    c.kill(coordinator);
    let via = c.running()[0];
    let next = eventually_async(Duration::from_secs(20), "a new metadata leader", || async {
        let l = c.meta_leader(via).await;
        (l != coordinator).then_some(l)
    })
    .await;
    let at = kafka[&next].clone();
    // The new coordinator answers once it serves the metadata's new term.
    let read = eventually_async(Duration::from_secs(20), "the next coordinator", || {
        let at = at.clone();
        async move {
            let mut conn = Conn::open(&at).await;
            let r = fetched(&mut conn, "a,b", "meta").await;
            (r.0 == 0 && r.1 >= 0).then_some(r)
        }
    })
    .await;
    assert_eq!(read, (0, 5, "M".into()));
}
