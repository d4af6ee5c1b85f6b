//! Produce ids in a cluster (contract §9 and §13; docs/cluster.md, "Produce ids in a cluster"):
//! the dedupe window lives with each partition's replicated log, so a retry through any broker —
//! after the leader that stored the message was killed, and after the whole cluster restarted —
//! is answered `duplicate` with the first one's position and never stored again.

use std::collections::BTreeMap;
use std::time::Duration;

use mmmq_tests::cluster::Cluster;
use serde_json::{Value, json};

const TOPIC: &str = "ids";
const PARTITIONS: u32 = 3;
const MESSAGES: u64 = 30;

/// Produces `body` through broker `via` until it is answered `200` (a `503` while a partition
/// elects is retried: safe, the body has an id); the answer.
async fn produce_ok(c: &Cluster, via: u64, body: &Value) -> Value {
    mmmq_tests::eventually_async(
        Duration::from_secs(20),
        "a produce answered 200",
        || async {
            let (code, answer) = c.broker(via).post("/mmmq/messages", body).await;
            match code {
                200 => Some(answer),
                503 => None,
                other => panic!("produce through {via}: HTTP {other} {answer}"),
            }
        },
    )
    .await
}

fn message(n: u64) -> Value {
    json!({"topic": TOPIC, "id": format!("order-{n}"), "content": {"n": n}})
}

/// Every id of `first` sent again through `via`: each answered `duplicate` where it was stored.
async fn all_duplicates(c: &Cluster, via: u64, first: &BTreeMap<u64, (u64, u64)>) {
    for (n, (partition, offset)) in first {
        let again = produce_ok(c, via, &message(*n)).await;
        assert_eq!(again["duplicate"], true, "order-{n} through {via}: {again}");
        assert_eq!(
            (again["partition"].as_u64(), again["offset"].as_u64()),
            (Some(*partition), Some(*offset)),
            "order-{n} through {via}: {again}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_produce_id_stays_deduplicated_across_a_failover_and_a_restart() {
    let mut c = Cluster::start(3, &[]).await;
    c.meta_leader(1).await;
    let (code, created) = c
        .broker(1)
        .put(
            &format!("/mmmq/topics/{TOPIC}"),
            &json!({"partitions": PARTITIONS}),
        )
        .await;
    assert_eq!(code, 200, "{created}");
    // Keyless messages with ids, through every broker: each goes where its id's hash sends it,
    // so a retry through any broker reaches the same partition.
    let mut first = BTreeMap::new();
    for n in 0..MESSAGES {
        let via = n % 3 + 1;
        let a = produce_ok(&c, via, &message(n)).await;
        assert_eq!(a["duplicate"].as_bool(), None, "{a}");
        let partition = a["partition"].as_u64().unwrap();
        assert_eq!(
            partition,
            u64::from(mmmq_core::partition_for_key(
                &format!("order-{n}"),
                PARTITIONS
            )),
            "{a}"
        );
        first.insert(n, (partition, a["offset"].as_u64().unwrap()));
    }
    let used: std::collections::BTreeSet<u64> = first.values().map(|(p, _)| *p).collect();
    assert_eq!(
        used.len(),
        PARTITIONS as usize,
        "ids spread over every partition"
    );
    // Within one batch, a repeated id is stored once.
    let (code, batch) = c
        .broker(2)
        .post(
            "/mmmq/messages/batch",
            &json!([message(MESSAGES), message(MESSAGES), message(0)]),
        )
        .await;
    assert_eq!(code, 200, "{batch}");
    let results = batch["results"].as_array().expect("results");
    assert_eq!(results[0]["duplicate"].as_bool(), None, "{batch}");
    assert_eq!(results[1]["duplicate"], true, "{batch}");
    assert_eq!(results[1]["offset"], results[0]["offset"], "{batch}");
    assert_eq!(results[2]["duplicate"], true, "{batch}");
    assert_eq!(
        (
            results[2]["partition"].as_u64(),
            results[2]["offset"].as_u64()
        ),
        (Some(first[&0].0), Some(first[&0].1)),
        "{batch}"
    );
    first.insert(
        MESSAGES,
        (
            results[0]["partition"].as_u64().unwrap(),
            results[0]["offset"].as_u64().unwrap(),
        ),
    );

    // The leader of order-0's partition dies; every id retried through each survivor is a
    // duplicate (the new leader's log knows them), and a new id is stored.
    let (p0, _) = first[&0];
    let leader = c.leader_of(1, TOPIC, p0 as u32).await.expect("a leader");
    c.kill(leader);
    for via in (1..=3).filter(|b| *b != leader) {
        all_duplicates(&c, via, &first).await;
    }
    let survivor = (1..=3).find(|b| *b != leader).unwrap();
    let fresh = produce_ok(&c, survivor, &message(MESSAGES + 1)).await;
    assert_eq!(fresh["duplicate"].as_bool(), None, "{fresh}");
    first.insert(
        MESSAGES + 1,
        (
            fresh["partition"].as_u64().unwrap(),
            fresh["offset"].as_u64().unwrap(),
        ),
    );

    // The whole cluster is killed and restarted: the ids are rebuilt from the logs.
    for b in 1..=3 {
        c.kill(b);
    }
    c.restart_down().await;
    c.meta_leader(1).await;
    all_duplicates(&c, leader, &first).await;

    // Each message is stored once, on every replica.
    let stored = c.stop_and_read_partitions(TOPIC, PARTITIONS).await;
    for ((_, p), replicas) in stored {
        let expected = first
            .values()
            .filter(|(q, _)| u32::try_from(*q) == Ok(p))
            .count();
        for r in replicas {
            assert_eq!(
                r.entries.len(),
                expected,
                "partition {p} on broker {}: {:?}",
                r.broker,
                r.entries
            );
        }
    }
}
