//! Membership of a cluster (contract §13; docs/cluster.md, "Membership"): adding a broker,
//! moving a partition's replicas while it takes produces, removing a broker, and the requests
//! refused. Real `mmmq serve` processes on 127.0.0.1.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mmmq_tests::checker::check;
use mmmq_tests::cluster::{Cluster, partition_dir, produce, produce_until_stopped};
use mmmq_tests::{Broker, error_of, eventually_async};
use serde_json::{Value, json};

/// Each partition's replicas as broker `via` sees them.
async fn placement(c: &Cluster, via: u64, topic: &str) -> Vec<Vec<u64>> {
    let (_, view) = c.broker(via).get("/mmmq/cluster").await;
    let mut parts: Vec<(u64, Vec<u64>)> = view["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["topic"] == topic)
        .map(|p| {
            let replicas = p["replicas"].as_array().unwrap();
            let replicas = replicas.iter().map(|r| r.as_u64().unwrap()).collect();
            (p["partition"].as_u64().unwrap(), replicas)
        })
        .collect();
    parts.sort();
    parts.into_iter().map(|(_, r)| r).collect()
}

/// Waits until broker `via` sees the metadata name exactly `ids`.
async fn brokers_are(c: &Cluster, via: u64, ids: &[u64]) -> Value {
    let b = c.broker(via);
    eventually_async(Duration::from_secs(10), "the brokers listed", || async {
        let (_, view) = b.get("/mmmq/cluster").await;
        let listed: Vec<u64> = view["brokers"]
            .as_array()?
            .iter()
            .filter_map(|b| b["id"].as_u64())
            .collect();
        (listed == ids).then_some(view)
    })
    .await
}

/// Contract §13: a broker not in the first `--peers` is added with `mmmq cluster add-broker`,
/// then a partition moves from {1,2,3} to {1,2,4} with `mmmq cluster reassign` while a producer
/// keeps sending: no acknowledgement waits longer than a failover, nothing is lost, divergent or
/// phantom on the new replicas, broker 4 holds every message at the same offsets as the others,
/// and broker 3 no longer holds the partition's files.
#[tokio::test(flavor = "multi_thread")]
async fn a_partition_moves_to_an_added_broker_while_it_takes_produces() {
    let mut c = Cluster::start(3, &[]).await;
    c.meta_leader(1).await;
    let mut acks = produce(&c, 1, "orders", 1, 0..20).await;
    assert_eq!(placement(&c, 1, "orders").await[0].len(), 3);
    let (four, addr) = c.spawn_extra().await;
    assert_eq!(four, 4);
    let out = c
        .broker(2)
        .cli_ok(["cluster", "add-broker", "4", addr.as_str()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("broker 4 added"), "{text}");
    brokers_are(&c, 4, &[1, 2, 3, 4]).await;
    c.meta_leader(4).await;

    let stop = Arc::new(AtomicBool::new(false));
    let producer = produce_until_stopped(c.broker(1), "orders", 2, stop.clone());
    // Produces under way before the move starts.
    eventually_async(Duration::from_secs(5), "produces going", || async {
        let (_, v) = c.broker(2).get("/mmmq/topics/orders").await;
        (v["partitions"][0]["nextOffset"].as_u64().unwrap_or(0) > 30).then_some(())
    })
    .await;
    let out = c
        .broker(3)
        .cli_ok(["cluster", "reassign", "orders", "0", "--replicas", "1,2,4"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("moved"), "{text}");
    assert_eq!(placement(&c, 2, "orders").await, [vec![1, 2, 4]]);
    // Produces after the move: the new replicas take them.
    let moved_at = c.broker(1).get("/mmmq/topics/orders").await.1["partitions"][0]["nextOffset"]
        .as_u64()
        .unwrap();
    eventually_async(
        Duration::from_secs(5),
        "produces after the move",
        || async {
            let (_, v) = c.broker(1).get("/mmmq/topics/orders").await;
            (v["partitions"][0]["nextOffset"].as_u64()? > moved_at + 20).then_some(())
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let run = producer.await.unwrap();
    assert!(
        run.longest_wait < Duration::from_secs(5),
        "a produce waited {:?} during the move",
        run.longest_wait
    );
    acks.extend(run.acks);
    c.caught_up(4).await;
    // Broker 3 let the partition go: its messages and its Raft files.
    let raft = partition_dir(c.root(3), "orders", 0).join("raft");
    eventually_async(Duration::from_secs(10), "broker 3's files gone", || async {
        (!raft.exists()).then_some(())
    })
    .await;
    let mut sent: std::collections::BTreeSet<_> = mmmq_tests::cluster::sent(&acks);
    sent.extend(run.sent);
    let mut replicas = c.stop_and_read("orders", 0).await;
    let gone = replicas.remove(2);
    assert_eq!(gone.broker, 3);
    assert!(gone.entries.is_empty(), "broker 3 keeps {:?}", gone.entries);
    assert_eq!(replicas[2].broker, 4);
    assert_eq!(
        replicas[2].entries, replicas[0].entries,
        "broker 4 holds what broker 1 holds, offset for offset"
    );
    let report = check(
        &BTreeMap::from([(("orders".to_owned(), 0), replicas)]),
        &acks,
        &sent,
    );
    assert!(report.clean(), "{report}");
}

/// `mmmq cluster remove-broker` moves the broker's replicas to the others first, then the
/// broker leaves: it is gone from `GET /mmmq/cluster` and from the metadata group's voters (the
/// added broker takes its vote), every message is still read through the others, and its id is
/// never given out again.
#[tokio::test(flavor = "multi_thread")]
async fn a_removed_brokers_replicas_move_to_the_others_first() {
    let mut c = Cluster::start(3, &[]).await;
    c.meta_leader(1).await;
    let (four, addr) = c.spawn_extra().await;
    let (code, body) = c
        .broker(1)
        .post(
            "/mmmq/cluster/brokers",
            &json!({"id": four, "address": addr}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    brokers_are(&c, 4, &[1, 2, 3, 4]).await;
    // A new topic places replicas on the new broker too.
    let (code, body) = c
        .broker(4)
        .put("/mmmq/topics/spread", &json!({"partitions": 4}))
        .await;
    assert_eq!(code, 200, "{body}");
    let before = placement(&c, 1, "spread").await;
    assert!(before.iter().all(|r| r.len() == 3), "{before:?}");
    assert!(before.iter().flatten().any(|b| *b == 4), "{before:?}");
    assert!(before.iter().flatten().any(|b| *b == 3), "{before:?}");
    for p in 0..4u64 {
        for s in 0..5u64 {
            // A new topic's groups may still be electing (`503`): sent again, its id making the
            // retry store nothing twice.
            let msg = json!({"topic": "spread", "partition": p, "id": format!("{p}-{s}"), "content": {"p": p, "s": s}});
            mmmq_tests::eventually_async(Duration::from_secs(20), "a produce", || async {
                let (code, body) = c.broker(2).post("/mmmq/messages", &msg).await;
                match code {
                    200 => Some(()),
                    503 => None,
                    other => panic!("HTTP {other} {body}"),
                }
            })
            .await;
        }
    }
    let out = c.broker(1).cli_ok(["cluster", "remove-broker", "3"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("broker 3 removed"), "{text}");
    let view = brokers_are(&c, 2, &[1, 2, 4]).await;
    let mut voters: Vec<u64> = view["meta"]["voters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    voters.sort();
    assert_eq!(voters, [1, 2, 4], "{view}");
    let after = placement(&c, 2, "spread").await;
    assert!(
        after.iter().all(|r| r.len() == 3 && !r.contains(&3)),
        "{after:?}"
    );
    for p in 0..4u32 {
        let raft = partition_dir(c.root(3), "spread", p).join("raft");
        eventually_async(Duration::from_secs(10), "broker 3's files gone", || async {
            (!raft.exists()).then_some(())
        })
        .await;
        // A replica that just took over applies what it holds once it commits in its term.
        let b = c.broker(1);
        let path = format!("/mmmq/topics/spread/messages?partition={p}&from=0");
        eventually_async(Duration::from_secs(10), "every message read", || async {
            let (code, page) = b.get(&path).await;
            (code == 200 && page["messages"].as_array()?.len() == 5).then_some(())
        })
        .await;
    }
    let (code, body) = c
        .broker(1)
        .post(
            "/mmmq/cluster/brokers",
            &json!({"id": 3, "address": "127.0.0.1:1"}),
        )
        .await;
    assert_eq!(code, 400, "{body}");
    assert!(error_of(&body).contains("never reused"), "{body}");
}

/// Requests a cluster refuses, with `{"error"}` and the status that says why; nothing changes.
#[tokio::test(flavor = "multi_thread")]
async fn membership_requests_that_cannot_be_done_are_refused() {
    let c = Cluster::start(3, &[]).await;
    c.meta_leader(1).await;
    produce(&c, 1, "orders", 1, 0..3).await;
    let b = c.broker(2);
    let put = |path: &'static str, replicas: Value| async move {
        b.put(path, &json!({ "replicas": replicas })).await
    };
    for (replicas, says) in [
        (json!([1, 1, 2]), "distinct"),
        (json!([1, 2, 9]), "no broker 9"),
        (json!([1, 2]), "replicationFactor 3"),
    ] {
        let (code, body) = put("/mmmq/cluster/partitions/orders/0", replicas).await;
        assert_eq!(code, 400, "{body}");
        assert!(error_of(&body).contains(says), "{body}");
    }
    let (code, body) = put("/mmmq/cluster/partitions/orders/0", json!("1,2,3")).await;
    assert_eq!(code, 400, "{body}");
    let (code, body) = put("/mmmq/cluster/partitions/nope/0", json!([1, 2, 3])).await;
    assert_eq!(code, 404, "{body}");
    assert!(error_of(&body).contains("no topic"), "{body}");
    let (code, body) = put("/mmmq/cluster/partitions/orders/5", json!([1, 2, 3])).await;
    assert_eq!(code, 404, "{body}");
    assert!(error_of(&body).contains("no partition 5"), "{body}");
    let (code, body) = b.delete("/mmmq/cluster/brokers/9").await;
    assert_eq!(code, 404, "{body}");
    // Three brokers, replicationFactor 3: removing one would leave the topic too few.
    let (code, body) = b.delete("/mmmq/cluster/brokers/2").await;
    assert_eq!(code, 400, "{body}");
    assert!(error_of(&body).contains("replicationFactor 3"), "{body}");
    for bad in [json!({"id": 0, "address": "127.0.0.1:1"}), json!({"id": 5})] {
        let (code, body) = b.post("/mmmq/cluster/brokers", &bad).await;
        assert_eq!(code, 400, "{bad}: {body}");
    }
    // The CLI says why and fails.
    let out = b.cli(["cluster", "reassign", "orders", "0", "--replicas", "1,2"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("replicationFactor 3"), "{err}");
    assert_eq!(placement(&c, 1, "orders").await[0].len(), 3);
    brokers_are(&c, 1, &[1, 2, 3]).await;
}

/// A single broker refuses membership commands: it is no cluster member.
#[tokio::test]
async fn a_single_broker_refuses_membership_commands() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    let (code, body) = broker
        .post(
            "/mmmq/cluster/brokers",
            &json!({"id": 2, "address": "127.0.0.1:1"}),
        )
        .await;
    assert_eq!(code, 400, "{body}");
    assert!(error_of(&body).contains("not a cluster member"), "{body}");
}

/// Waits until broker `b` knows its cluster's id (`GET /mmmq/cluster`'s `clusterId`).
async fn cluster_id_of(b: &Broker) -> String {
    eventually_async(Duration::from_secs(10), "the cluster's id", || async {
        let (_, view) = b.get("/mmmq/cluster").await;
        view["clusterId"].as_str().map(str::to_owned)
    })
    .await
}

/// How many lines of broker `b`'s log contain `text`.
fn logged(b: &Broker, text: &str) -> usize {
    b.log.lock().matches(text).count()
}

/// Waits until broker `b` logged `text`.
async fn logs(b: &Broker, text: &str) {
    eventually_async(Duration::from_secs(10), text, || async {
        (logged(b, text) > 0).then_some(())
    })
    .await
}

/// docs/cluster.md, "The cluster's id": a broker of another cluster, added with `add-broker` or
/// started with `--peers` naming this cluster's brokers, has its messages refused and refuses
/// this cluster's (each side logs it once); a member whose id file names another cluster does
/// not rejoin. Cluster A's messages stay where they were, on every replica.
#[tokio::test(flavor = "multi_thread")]
async fn a_broker_of_another_cluster_is_refused() {
    let mut c = Cluster::start(3, &[]).await;
    c.meta_leader(1).await;
    let a = cluster_id_of(c.broker(1)).await;
    for id in 1..=3 {
        assert_eq!(cluster_id_of(c.broker(id)).await, a);
        let kept = std::fs::read_to_string(c.root(id).join("cluster").join("id")).unwrap();
        assert_eq!(kept.trim(), a, "broker {id} keeps the id");
    }
    let text =
        String::from_utf8_lossy(&c.broker(2).cli_ok(["cluster", "status"]).stdout).into_owned();
    assert!(text.contains(&format!("cluster id: {a}")), "{text}");
    let mut acks = produce(&c, 1, "orders", 1, 0..10).await;

    // Cluster B: one broker, formed on its own, with a topic of its own.
    let b_root = tempfile::tempdir().unwrap();
    let b_addr = format!("127.0.0.1:{}", mmmq_tests::free_port());
    let start_b = |peers: String| {
        let (root, addr) = (b_root.path().to_owned(), b_addr.clone());
        async move {
            let args = ["--listen", &addr, "--node-id", "4", "--peers", &peers];
            Broker::start_with(&root, &args).await
        }
    };
    let b = start_b(format!("4={b_addr}")).await;
    let b_id = cluster_id_of(&b).await;
    assert_ne!(b_id, a);
    let (code, body) = b
        .post(
            "/mmmq/messages",
            &json!({"topic": "own", "content": {"b": 1}}),
        )
        .await;
    assert_eq!(code, 200, "{body}");

    // Added to A: refused at once, saying why; neither cluster changes.
    let out = c
        .broker(2)
        .cli(["cluster", "add-broker", "4", b_addr.as_str()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let b_refuses_a = format!("this broker belongs to cluster {b_id}, the message to cluster {a}");
    assert!(err.contains(&b_refuses_a), "{err}");
    let view = brokers_are(&c, 1, &[1, 2, 3]).await;
    assert_eq!(view["meta"]["voters"], json!([1, 2, 3]), "{view}");
    logs(&b, "refusing the Raft messages of another cluster").await;

    // Started again with --peers naming A's brokers: they refuse its pings, and it logs each
    // refusal once however often it pings (every 100 ms).
    assert!(b.terminate().success());
    let b = start_b(format!("{},4={b_addr}", c.peers())).await;
    let a_refuses_b = format!("this broker belongs to cluster {a}, the message to cluster {b_id}");
    for id in 1..=3 {
        logs(
            &b,
            &format!("broker {id} refuses this broker's messages: {a_refuses_b}"),
        )
        .await;
        logs(c.broker(id), &a_refuses_b).await;
    }
    // Ten pings to each later, still one line per refusing broker.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(logged(&b, &a_refuses_b), 3, "{}", b.log.lock());
    for id in 1..=3 {
        assert_eq!(logged(c.broker(id), &a_refuses_b), 1);
    }
    assert_eq!(cluster_id_of(&b).await, b_id);
    let (code, page) = b.get("/mmmq/topics/own/messages?from=0").await;
    assert_eq!(code, 200, "{page}");
    assert_eq!(page["messages"].as_array().unwrap().len(), 1, "{page}");
    assert!(b.terminate().success());

    // A member whose id file names another cluster does not rejoin: its peers' messages are
    // refused, and it takes none of their metadata. A goes on with the two others.
    let three = c.brokers[2].take().unwrap();
    assert!(three.terminate().success());
    let id_file = c.root(3).join("cluster").join("id");
    std::fs::write(&id_file, "0123456789abcdef\n").unwrap();
    c.restart(3).await;
    let three_refuses =
        format!("this broker belongs to cluster 0123456789abcdef, the message to cluster {a}");
    logs(
        c.broker(1),
        &format!("broker 3 refuses this broker's messages: {three_refuses}"),
    )
    .await;
    assert_eq!(cluster_id_of(c.broker(3)).await, "0123456789abcdef");
    acks.extend(produce(&c, 2, "orders", 1, 10..20).await);

    // Its own id back, it catches up; every replica of A holds every message.
    let three = c.brokers[2].take().unwrap();
    assert!(three.terminate().success());
    std::fs::write(&id_file, format!("{a}\n")).unwrap();
    c.restart(3).await;
    assert_eq!(cluster_id_of(c.broker(3)).await, a);
    c.caught_up(3).await;
    let (code, page) = c.broker(3).get("/mmmq/topics/orders/messages?from=0").await;
    assert_eq!(code, 200, "{page}");
    assert_eq!(page["messages"].as_array().unwrap().len(), 20, "{page}");
    let sent = mmmq_tests::cluster::sent(&acks);
    let replicas = c.stop_and_read("orders", 0).await;
    mmmq_tests::cluster::assert_each_holds(&replicas, 20);
    let report = check(
        &BTreeMap::from([(("orders".to_owned(), 0), replicas)]),
        &acks,
        &sent,
    );
    assert!(report.clean(), "{report}");
}
