//! A cluster under operational faults (docs/cluster.md, "A disk that refuses writes",
//! "Liveness and elections", "Metrics"): real `mmmq serve` processes on 127.0.0.1, faults set through
//! `--fault-injection`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use mmmq_tests::Broker;
use mmmq_tests::checker::{Ack, MsgId};
use mmmq_tests::cluster::{
    Cluster, acked_once_leader, assert_each_holds, check_orders, produce, sent,
};
use serde_json::json;

/// Contract §13 with a leader whose disk refuses writes (EIO): it never acknowledges what a
/// majority does not hold durably, the two others elect a leader and take produces within a few
/// seconds, and once the disk works again its replica catches up without a restart of the
/// broker (its partition group is opened again from its files). The checker finds nothing lost,
/// divergent or phantom.
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_whose_disk_refuses_writes_is_replaced_and_rejoins_without_a_restart() {
    let (cluster, mut acks, leader, others) = Cluster::faulty_with_orders(10).await;
    let c = &cluster;
    let pid = c.broker(leader).pid();
    let mut sent = sent(&acks);
    c.disk(leader, Some("eio")).await;
    let failed = Instant::now();
    // A produce the failing leader takes: acknowledged only if the two others hold it durably
    // (contract §13's majority), which the checker verifies.
    let attempted = MsgId {
        producer: 9,
        seq: 0,
    };
    sent.insert(attempted);
    let (code, body) = c
        .broker(leader)
        .post(
            "/mmmq/messages",
            &json!({"topic": "orders", "content": attempted.content()}),
        )
        .await;
    if code == 200 {
        acks.push(Ack {
            partition: ("orders".to_owned(), 0),
            offset: body["offset"].as_u64().unwrap(),
            msg: attempted,
        });
    }
    // The others elect a leader and take produces.
    let next = MsgId {
        producer: 2,
        seq: 0,
    };
    let b = c.broker(others[0]);
    acks.push(acked_once_leader(b, next, Duration::from_secs(10)).await);
    let failover = failed.elapsed();
    assert!(
        failover < Duration::from_secs(5),
        "failover took {failover:?}"
    );
    let new_leader = c.leader_of(others[0], "orders", 0).await;
    assert!(
        new_leader.is_some_and(|l| l != leader),
        "leader {new_leader:?}"
    );
    acks.extend(produce(c, others[1], "orders", 2, 1..10).await);
    let log = |b: u64| c.broker(b).log.lock().clone();
    assert!(
        log(leader).contains("partition group stopped"),
        "{}",
        log(leader)
    );
    // The disk works again: the replica rejoins and catches up, the broker never restarted.
    c.disk(leader, None).await;
    c.caught_up(others[0]).await;
    assert_eq!(c.broker(leader).pid(), pid);
    assert!(log(leader).contains("partition group running again"));
    // The broker answers for the cluster again (its produce goes to the new leader).
    acks.extend(produce(c, leader, "orders", 3, 0..5).await);
    c.caught_up(others[0]).await;
    sent.extend(acks.iter().map(|a| a.msg));
    let replicas = cluster.stop_and_read("orders", 0).await;
    let report = check_orders(replicas, &acks, &sent);
    assert!(report.clean(), "{report}");
}

/// A follower whose disk is full (ENOSPC) does not stop the majority: every produce is
/// acknowledged at once, through the leader and through the failing broker itself, and the
/// follower catches up once its disk takes writes again.
#[tokio::test(flavor = "multi_thread")]
async fn a_follower_whose_disk_refuses_writes_does_not_stop_the_majority() {
    let cluster = Cluster::start(3, &["--fault-injection"]).await;
    let c = &cluster;
    c.meta_leader(1).await;
    let mut acks = produce(c, 1, "orders", 1, 0..5).await;
    c.caught_up(1).await;
    let leader = c.leader_of(1, "orders", 0).await.expect("a leader");
    let follower = (1..=3).find(|b| *b != leader).unwrap();
    c.disk(follower, Some("enospc")).await;
    acks.extend(produce(c, leader, "orders", 2, 0..20).await);
    acks.extend(produce(c, follower, "orders", 3, 0..5).await);
    assert_eq!(c.leader_of(leader, "orders", 0).await, Some(leader));
    c.disk(follower, None).await;
    c.caught_up(leader).await;
    let sent = sent(&acks);
    let replicas = cluster.stop_and_read("orders", 0).await;
    assert_each_holds(&replicas, 30);
    let report = check_orders(replicas, &acks, &sent);
    assert!(report.clean() && report.duplicates == 0, "{report}");
}

/// A leader whose links to its followers fail one way only (it hears them, they do not hear
/// it) still answers their pings; once a write finds it cannot renew its lease it stops
/// claiming the group, the followers elect one of theirs, and produces through them are
/// acknowledged again (docs/cluster.md, "Liveness and elections"). The checker finds nothing
/// lost, divergent or phantom once the links heal.
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_the_others_cannot_hear_is_replaced() {
    let (cluster, mut acks, leader, others) = Cluster::faulty_with_orders(5).await;
    let c = &cluster;
    let cut = json!({ others[0].to_string(): "drop", others[1].to_string(): "drop" });
    c.faults(leader, &cut).await;
    let cut_at = Instant::now();
    // Through a follower (the cut-off leader reaches nobody, not even to forward): the first
    // produce may still be taken by the old leader and wait out its 10 s for a majority.
    for seq in 0..2 {
        let msg = MsgId { producer: 2, seq };
        acks.push(acked_once_leader(c.broker(others[0]), msg, Duration::from_secs(40)).await);
    }
    let took = cut_at.elapsed();
    assert_ne!(c.leader_of(others[0], "orders", 0).await, Some(leader));
    c.heal().await;
    c.caught_up(others[0]).await;
    let sent = sent(&acks);
    let replicas = cluster.stop_and_read("orders", 0).await;
    let report = check_orders(replicas, &acks, &sent);
    assert!(report.clean(), "{report}");
    // Produces were refused for a write's wait, a lease renewal and an election; not forever.
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

/// The value of the series `name` whose labels include every one of `labels`, in a
/// Prometheus text exposition.
fn series(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?;
        let (set, value) = match rest.strip_prefix('{') {
            Some(r) => r.split_once("} ")?,
            None => ("", rest.strip_prefix(' ')?),
        };
        labels
            .iter()
            .all(|(k, v)| set.split(',').any(|kv| kv == format!("{k}=\"{v}\"")))
            .then(|| value.trim().parse().ok())
            .flatten()
    })
}

const ORDERS: &[(&str, &str)] = &[("topic", "orders"), ("partition", "0")];

async fn metrics(b: &Broker) -> String {
    b.get_text("/metrics").await
}

/// Contract §13: leader changes and replication lag are metrics. Every broker exports, per
/// partition it replicates and for the metadata group, the term, whether it leads, the leader
/// changes it saw, and on the leader each replica's lag in entries; after the leader is killed
/// a survivor counts one more leader change and exactly one survivor leads.
#[tokio::test(flavor = "multi_thread")]
async fn terms_leaders_leader_changes_and_lag_are_metrics() {
    let mut c = Cluster::start(3, &[]).await;
    c.meta_leader(1).await;
    let mut acks = produce(&c, 1, "orders", 1, 0..5).await;
    c.caught_up(1).await;
    let leader = c.leader_of(1, "orders", 0).await.expect("a leader");
    let wait = Duration::from_secs(10);
    let texts = mmmq_tests::eventually_async(wait, "one leader in the metrics", || async {
        let mut texts = BTreeMap::new();
        for b in 1..=3 {
            texts.insert(b, metrics(c.broker(b)).await);
        }
        let leads: Vec<u64> = texts
            .iter()
            .filter(|(_, t)| series(t, "mmmq_cluster_partition_is_leader", ORDERS) == Some(1.0))
            .map(|(b, _)| *b)
            .collect();
        let meta_leaders = texts
            .values()
            .filter(|t| series(t, "mmmq_cluster_meta_is_leader", &[]) == Some(1.0))
            .count();
        let lag_zero = (1..=3).all(|r| {
            let r = r.to_string();
            let labels = [ORDERS, &[("replica", r.as_str())]].concat();
            series(
                &texts[&leader],
                "mmmq_cluster_partition_replication_lag",
                &labels,
            ) == Some(0.0)
        });
        (leads == [leader] && meta_leaders == 1 && lag_zero).then_some(texts)
    })
    .await;
    let mut changes = BTreeMap::new();
    for (b, t) in &texts {
        let term = series(t, "mmmq_cluster_partition_term", ORDERS).unwrap();
        assert!(term >= 1.0, "broker {b}: term {term}\n{t}");
        let meta_term = series(t, "mmmq_cluster_meta_term", &[]).unwrap();
        assert!(meta_term >= 1.0, "broker {b}: metadata term {meta_term}");
        let seen = series(t, "mmmq_cluster_partition_leader_changes_total", ORDERS).unwrap();
        assert!(seen >= 1.0, "broker {b} saw no leader");
        changes.insert(*b, seen);
        if *b != leader {
            assert_eq!(
                series(t, "mmmq_cluster_partition_replication_lag", ORDERS),
                None,
                "a follower exports no lag"
            );
        }
    }
    // The leader dies: a survivor takes over; each survivor counts the change.
    c.kill(leader);
    let survivors = c.running();
    let b = c.broker(survivors[0]);
    let msg = MsgId {
        producer: 2,
        seq: 0,
    };
    acks.push(acked_once_leader(b, msg, wait).await);
    let c = &c;
    let changes = &changes;
    mmmq_tests::eventually_async(wait, "the change counted", || async move {
        let mut leads = 0;
        for s in c.running() {
            let t = metrics(c.broker(s)).await;
            let seen = series(&t, "mmmq_cluster_partition_leader_changes_total", ORDERS)?;
            if seen <= changes[&s] {
                return None;
            }
            if series(&t, "mmmq_cluster_partition_is_leader", ORDERS)? == 1.0 {
                leads += 1;
            }
        }
        (leads == 1).then_some(())
    })
    .await;
    let unique: BTreeSet<u64> = acks.iter().map(|a| a.offset).collect();
    assert_eq!(unique.len(), acks.len());
}

/// A topic that fails to open on one broker (a file stands where its directory goes) does not
/// stop that broker following the others: its replica of a later topic runs and catches up, and
/// once the obstacle is gone the failed topic is opened on a later try.
#[tokio::test(flavor = "multi_thread")]
async fn a_topic_that_fails_on_one_broker_does_not_hold_up_the_others() {
    let c = Cluster::start(3, &[]).await;
    c.meta_leader(1).await;
    let topics = c.broker(3).root.join("topics");
    std::fs::create_dir_all(&topics).unwrap();
    let blocker = topics.join("bad");
    std::fs::write(&blocker, b"not a directory").unwrap();
    for t in ["bad", "good"] {
        let (code, body) = c
            .broker(1)
            .put(&format!("/mmmq/topics/{t}"), &json!({}))
            .await;
        assert_eq!(code, 200, "{body}");
    }
    produce(&c, 1, "good", 1, 0..5).await;
    let lag_of_3 = |topic: &'static str| {
        let c = &c;
        async move {
            let (_, view) = c.broker(1).get("/mmmq/cluster").await;
            view["partitions"]
                .as_array()?
                .iter()
                .find(|p| p["topic"] == topic)?["lag"]["3"]
                .as_u64()
        }
    };
    let wait = Duration::from_secs(10);
    mmmq_tests::eventually_async(wait, "broker 3 replicating `good`", || async {
        (lag_of_3("good").await == Some(0)).then_some(())
    })
    .await;
    assert_ne!(
        lag_of_3("bad").await,
        Some(0),
        "`bad` cannot run on broker 3"
    );
    let log = c.broker(3).log.lock().clone();
    assert!(
        log.contains("trying again later") && log.contains("bad"),
        "{log}"
    );
    std::fs::remove_file(&blocker).unwrap();
    mmmq_tests::eventually_async(
        Duration::from_secs(20),
        "`bad` opened on a later try",
        || async { (lag_of_3("bad").await == Some(0)).then_some(()) },
    )
    .await;
    c.caught_up(1).await;
}
