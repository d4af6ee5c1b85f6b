//! Retention in a cluster (docs/cluster.md, "Retention in a cluster"; contract §7): real
//! `mmmq serve` processes; each replica deletes whole sealed segments through its partition's
//! Raft purge, the tail and what follows stay the same on every replica, a replica that was down
//! catches up from the snapshot, and a cluster killed after a purge opens again.

use std::sync::Arc;
use std::time::Duration;

use mmmq_tests::checker::{Ack, MsgId, Replica};
use mmmq_tests::cluster::{Cluster, acked_once_leader, check_orders, partition_dir, produce, sent};
use serde_json::{Value, json};

/// Small segments (about ten messages each) and a retention pass every 200 ms.
const ARGS: [&str; 4] = ["--segment-max-bytes", "1024", "--retention-check-ms", "200"];
const WAIT: Duration = Duration::from_secs(30);

/// `orders` partition 0 as broker `id` shows it: (firstOffset, nextOffset, bytes).
async fn shown(c: &Cluster, id: u64) -> (u64, u64, u64) {
    let (code, t) = c.broker(id).get("/mmmq/topics/orders").await;
    assert_eq!(code, 200, "{t}");
    let p = &t["partitions"][0];
    let n = |k: &str| p[k].as_u64().unwrap_or_else(|| panic!("{k} in {t}"));
    (n("firstOffset"), n("nextOffset"), n("bytes"))
}

/// Waits until every running broker's replica satisfies `ok`; answers what each shows.
async fn every_replica(
    c: &Cluster,
    what: &str,
    ok: impl Fn(u64, (u64, u64, u64)) -> bool,
) -> Vec<(u64, u64, u64)> {
    mmmq_tests::eventually_async(WAIT, what, || async {
        let mut all = Vec::new();
        for id in c.running() {
            let s = shown(c, id).await;
            if !ok(id, s) {
                return None;
            }
            all.push(s);
        }
        Some(all)
    })
    .await
}

/// Configures `orders` through `via`, and waits until every running broker applies it (a
/// broker that has not would still run retention by the old configuration).
async fn configure(c: &Cluster, via: u64, config: Value) {
    let (code, body) = c.broker(via).put("/mmmq/topics/orders", &config).await;
    assert_eq!(code, 200, "{body}");
    let want = config.as_object().unwrap();
    mmmq_tests::eventually_async(WAIT, "every broker configured", || async {
        for id in c.running() {
            let (_, t) = c.broker(id).get("/mmmq/topics/orders").await;
            if want.iter().any(|(k, v)| &t["config"][k] != v) {
                return None;
            }
        }
        Some(())
    })
    .await;
}

/// Three brokers, `orders` kept forever and `n` messages of producer 1 on every replica.
async fn with_orders(n: u64) -> (Cluster, Vec<Ack>) {
    let c = Cluster::start(3, &ARGS).await;
    c.meta_leader(1).await;
    configure(&c, 1, json!({"retentionMs": null})).await;
    let acks = produce(&c, 1, "orders", 1, 0..n).await;
    c.caught_up(1).await;
    (c, acks)
}

/// A pull from offset 0 through `via`: the offsets it answers (behind the horizon it answers from
/// the first offset still stored, contract §7).
async fn pulled_offsets(c: &Cluster, via: u64) -> Vec<u64> {
    let (code, page) = c
        .broker(via)
        .get("/mmmq/topics/orders/messages?from=0&max=1000")
        .await;
    assert_eq!(code, 200, "{page}");
    page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["offset"].as_u64().unwrap())
        .collect()
}

/// What a replica's files say once its broker stopped: its first segment's start, and the
/// purge point and snapshot the store and the state machine recorded.
struct OnDisk {
    first_segment: u64,
    purged_next: Option<u64>,
    snapshot_next: Option<u64>,
}

fn on_disk(c: &Cluster, id: u64) -> OnDisk {
    let dir = partition_dir(c.root(id), "orders", 0);
    let first_segment = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".mmm")?.parse::<u64>().ok())
        .min()
        .expect("a segment");
    let json = |name: &str| -> Option<Value> {
        let raw = std::fs::read(dir.join("raft").join(name)).ok()?;
        Some(serde_json::from_slice(&raw).unwrap())
    };
    OnDisk {
        first_segment,
        purged_next: json("purged").map(|p| p["nextOffset"].as_u64().unwrap()),
        snapshot_next: json("snapshot").map(|s| s["data"]["nextOffset"].as_u64().unwrap()),
    }
}

/// Stops every broker and checks what their replicas hold: each dense from its first offset to
/// `end`, and every acknowledged message that every replica's retention kept (from the highest
/// first offset on) on every replica at its offset, nothing divergent or phantom.
async fn stop_and_check(c: Cluster, acks: &[Ack], end: u64) -> Vec<Replica> {
    let sent = sent(acks);
    let replicas = c.stop_and_read("orders", 0).await;
    let from = replicas
        .iter()
        .map(|r| *r.entries.keys().next().unwrap_or(&end))
        .max()
        .unwrap();
    assert!(from < end, "the tail is kept");
    let kept: Vec<Ack> = acks.iter().filter(|a| a.offset >= from).cloned().collect();
    for r in &replicas {
        let first = *r.entries.keys().next().unwrap_or(&end);
        let offsets: Vec<u64> = r.entries.keys().copied().collect();
        assert_eq!(
            offsets,
            (first..end).collect::<Vec<_>>(),
            "broker {} holds a dense log from its first offset",
            r.broker
        );
    }
    let report = check_orders(replicas.clone(), &kept, &sent);
    assert!(report.clean(), "{report}");
    replicas
}

/// Contract §7 on a cluster member: retention by size deletes whole sealed segments of every
/// replica (its first offset moves to a segment's start, where the purge point and the snapshot
/// are), the tail and what follows stay identical on every replica, produce and pull go on; a
/// cluster SIGKILLed after the purge opens with it; retention by time then deletes everything,
/// the expired tail sealed first, and the offsets go on.
#[tokio::test(flavor = "multi_thread")]
async fn retention_deletes_whole_segments_on_every_replica_through_raft() {
    let (mut c, mut acks) = with_orders(300).await;
    for id in 1..=3 {
        let (first, next, bytes) = shown(&c, id).await;
        assert_eq!((first, next), (0, 300), "broker {id} keeps everything");
        assert!(bytes > 20_000, "{bytes}");
    }

    configure(&c, 2, json!({"retentionBytes": 3000})).await;
    let purged = every_replica(
        &c,
        "every replica purged by size",
        |_, (first, next, bytes)| first > 0 && next == 300 && bytes <= 3000,
    )
    .await;
    for (first, next, _) in &purged {
        assert!(*first < *next, "the tail is kept: {purged:?}");
        assert!(*first > 200, "{purged:?}");
    }
    // A pull from 0 answers from the first offset still stored, whichever broker is asked.
    for via in 1..=3 {
        let got = pulled_offsets(&c, via).await;
        let first = got[0];
        assert!(first > 200, "{got:?}");
        assert_eq!(got, (first..300).collect::<Vec<_>>());
    }
    acks.extend(produce(&c, 2, "orders", 2, 0..20).await);
    c.caught_up(1).await;
    let purged = every_replica(&c, "every replica purged again", |_, (_, next, bytes)| {
        next == 320 && bytes <= 3000
    })
    .await;

    // Every broker SIGKILLed just after the purge, and started again.
    let before: Vec<u64> = purged.iter().map(|p| p.0).collect();
    for id in 1..=3 {
        c.kill(id);
    }
    for id in 1..=3 {
        let d = on_disk(&c, id);
        assert_eq!(d.purged_next, Some(d.first_segment), "broker {id}");
        assert_eq!(
            d.snapshot_next,
            Some(d.first_segment),
            "broker {id}: the snapshot is taken at the purge point"
        );
    }
    c.restart_down().await;
    c.meta_leader(1).await;
    let msg = MsgId {
        producer: 3,
        seq: 0,
    };
    acks.push(acked_once_leader(c.broker(3), msg, WAIT).await);
    acks.extend(produce(&c, 3, "orders", 3, 1..20).await);
    let reopened = every_replica(&c, "every replica open", |_, (_, next, _)| next == 340).await;
    for (i, (first, _, _)) in reopened.iter().enumerate() {
        assert!(*first >= before[i], "broker {}: {reopened:?}", i + 1);
    }

    // By time: everything is past the horizon; the tail is sealed and goes too.
    configure(&c, 1, json!({"retentionMs": 1})).await;
    every_replica(
        &c,
        "every replica emptied by time",
        |_, (first, next, bytes)| first == 340 && next == 340 && bytes == 0,
    )
    .await;
    configure(&c, 1, json!({"retentionMs": null, "retentionBytes": null})).await;
    acks.extend(produce(&c, 1, "orders", 4, 0..10).await);
    assert_eq!(acks.last().unwrap().offset, 349);
    c.caught_up(1).await;
    for via in 1..=3 {
        assert_eq!(
            pulled_offsets(&c, via).await,
            (340..350).collect::<Vec<_>>()
        );
    }
    let replicas = stop_and_check(c, &acks, 350).await;
    for r in &replicas {
        assert_eq!(r.entries.len(), 10, "broker {}", r.broker);
    }
}

/// A follower down while the others purge past its log installs the leader's snapshot when it
/// comes back: its log starts at the leader's purge point, holds the same messages after it
/// as the others, and takes produces again.
#[tokio::test(flavor = "multi_thread")]
async fn a_follower_down_during_the_purge_catches_up_from_the_snapshot() {
    let (mut c, mut acks) = with_orders(50).await;
    let leader = c.leader_of(1, "orders", 0).await.expect("a leader");
    let down = (1..=3).find(|b| *b != leader).unwrap();
    let via = (1..=3).find(|b| *b != down).unwrap();
    c.kill(down);
    acks.extend(produce(&c, via, "orders", 2, 0..250).await);
    configure(&c, via, json!({"retentionBytes": 3000})).await;
    let purged = every_replica(
        &c,
        &format!("the others purged past broker {down}"),
        |_, s| s.0 > 50,
    )
    .await;

    c.restart(down).await;
    c.caught_up(via).await;
    let (first, next, _) = every_replica(&c, "the follower caught up", |id, (_, next, _)| {
        id != down || next == 300
    })
    .await[(down - 1) as usize];
    assert_eq!(next, 300);
    let leader = c.leader_of(via, "orders", 0).await.expect("a leader");
    let (leader_first, _, _) = shown(&c, leader).await;
    assert!(
        first > 50,
        "broker {down} starts past what it held: {first}"
    );
    assert_eq!(
        first, leader_first,
        "broker {down} starts at the leader's purge point ({purged:?})"
    );
    // It takes produces again, and purges again by the same policy as the others.
    acks.extend(produce(&c, down, "orders", 3, 0..20).await);
    c.caught_up(via).await;
    every_replica(&c, "every replica holds 320", |_, (_, next, _)| next == 320).await;
    stop_and_check(c, &acks, 320).await;
}

/// `keepUndelivered` in a cluster: while the dispatcher's consumer is down, no replica's
/// retention deletes what it has not delivered — also on a broker restarted meanwhile, which
/// holds everything until it has applied the cluster's dispatchers — and once the consumer is
/// up every message arrives, none skipped; then retention goes on past what was delivered.
#[tokio::test(flavor = "multi_thread")]
async fn keep_undelivered_holds_what_the_dispatcher_has_not_delivered_on_every_replica() {
    let mut c = Cluster::start(3, &ARGS).await;
    c.meta_leader(1).await;
    let up = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acked: Arc<parking_lot::Mutex<std::collections::BTreeSet<u64>>> = Arc::default();
    let (answer, record) = (up.clone(), acked.clone());
    let consumer = mmmq_tests::Consumer::start_on(
        0,
        Arc::new(move |e: &Value| {
            if !answer.load(std::sync::atomic::Ordering::Relaxed) {
                return mmmq_tests::Answer::Error;
            }
            record
                .lock()
                .insert(e["offset"].as_u64().expect("an offset"));
            mmmq_tests::Answer::Ack
        }),
    )
    .await;
    configure(
        &c,
        1,
        json!({"retentionBytes": 2048, "retentionMs": null, "keepUndelivered": true}),
    )
    .await;
    for id in 1..=3 {
        mmmq_tests::write_dispatchers(
            c.root(id),
            &json!([mmmq_tests::host_dispatcher("c1", "orders", consumer.port)]),
        );
    }
    let (code, report) = c.broker(1).post("/mmmq/admin/reload", &json!({})).await;
    assert_eq!(code, 200, "{report}");
    let acks = produce(&c, 1, "orders", 1, 0..100).await;
    c.caught_up(1).await;
    // A broker restarted while the consumer is down, then passes of every broker's retention.
    c.kill(3);
    c.restart(3).await;
    for id in 1..=3 {
        let before = c.broker(id).metric("mmmq_retention_passes_total").await;
        mmmq_tests::eventually_async(Duration::from_secs(20), "retention passes", || async {
            (c.broker(id).metric("mmmq_retention_passes_total").await >= before + 3.0).then_some(())
        })
        .await;
    }
    for id in 1..=3 {
        let dir = partition_dir(c.root(id), "orders", 0);
        let first = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|n| n.strip_suffix(".mmm")?.parse::<u64>().ok())
            .min();
        assert_eq!(first, Some(0), "broker {id} deleted undelivered messages");
    }
    up.store(true, std::sync::atomic::Ordering::Relaxed);
    mmmq_tests::eventually(Duration::from_secs(60), "every message delivered", || {
        (acked.lock().len() == acks.len()).then_some(())
    })
    .await;
    let (_, status) = c.broker(1).get("/mmmq/dispatchers").await;
    assert_eq!(status[0]["topics"][0]["skipped"], 0, "{status}");
}
