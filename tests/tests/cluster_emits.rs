//! A plugin's emits in a cluster (contract §13, "plugin emits stay exactly once"; docs/cluster.md,
//! "Delivery in a cluster"): the router example moves every message of `orders` to
//! `routed.<type>` while the partition's leader is SIGKILLed mid-stream. Its dispatcher
//! checkpoints only every 20 s, so the new leader runs again messages whose emits the old one
//! stored; each input is in its routed topic exactly once.

use std::collections::BTreeMap;
use std::time::Duration;

use mmmq_tests::cluster::Cluster;
use mmmq_tests::{deploy_plugin, plugin_dispatcher, plugin_wasm, write_dispatchers};
use serde_json::{Value, json};

const TYPES: [&str; 3] = ["a", "b", "c"];
const BEFORE: u64 = 200;
const AFTER: u64 = 100;

fn input(seq: u64) -> Value {
    json!({
        "topic": "orders",
        "key": format!("k{}", seq % 7),
        "id": format!("m-{seq}"),
        "content": {"type": TYPES[(seq % 3) as usize], "seq": seq},
    })
}

/// Produces inputs `from..to` through broker `via` in batches, each until acknowledged.
async fn produce(c: &Cluster, via: u64, from: u64, to: u64) {
    for start in (from..to).step_by(50) {
        let batch: Vec<Value> = (start..(start + 50).min(to)).map(input).collect();
        mmmq_tests::eventually_async(Duration::from_secs(20), "a batch answered", || async {
            let (code, answer) = c
                .broker(via)
                .post("/mmmq/messages/batch", &json!(batch))
                .await;
            match code {
                200 => Some(()),
                503 => None,
                other => panic!("produce through {via}: HTTP {other} {answer}"),
            }
        })
        .await;
    }
}

/// Every routed message's `seq`, with the topics holding it, read through broker `via` (a
/// topic not created yet holds none); `None` while a partition cannot be read (its leader is
/// being elected).
async fn routed(c: &Cluster, via: u64) -> Option<BTreeMap<u64, Vec<String>>> {
    let mut seen: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for t in TYPES {
        let topic = format!("routed.{t}");
        let mut from = 0;
        loop {
            let (code, page) = c
                .broker(via)
                .get(&format!(
                    "/mmmq/topics/{topic}/messages?from={from}&max=1000"
                ))
                .await;
            match code {
                200 => {}
                404 => break,
                503 => return None,
                other => panic!("pull of {topic} through {via}: HTTP {other} {page}"),
            }
            let next = page["next"].as_u64().unwrap();
            if next == from {
                break;
            }
            for m in page["messages"].as_array().unwrap() {
                assert_eq!(m["content"]["type"], t, "{m}");
                assert_eq!(m["origin"]["consumerId"], "router", "{m}");
                let seq = m["content"]["seq"].as_u64().unwrap();
                seen.entry(seq).or_default().push(topic.clone());
            }
            from = next;
        }
    }
    Some(seen)
}

/// Waits until every input is routed (read through `via`), and checks none is there twice.
async fn routed_once(c: &Cluster, via: u64) {
    let seen =
        mmmq_tests::eventually_async(Duration::from_secs(60), "every input routed", || async {
            let seen = routed(c, via).await?;
            (seen.len() as u64 == BEFORE + AFTER).then_some(seen)
        })
        .await;
    let twice: Vec<_> = seen.iter().filter(|(_, t)| t.len() > 1).collect();
    assert!(twice.is_empty(), "emitted twice: {twice:?}");
}

/// Three brokers, `orders` on all three and the router plugin dispatching it, its checkpoint
/// every 20 s.
async fn router_cluster() -> Cluster {
    let wasm = plugin_wasm("router", None);
    let c = Cluster::start(3, &[]).await;
    c.meta_leader(1).await;
    let (code, created) = c
        .broker(1)
        .put("/mmmq/topics/orders", &json!({"partitions": 1}))
        .await;
    assert_eq!(code, 200, "{created}");
    for id in 1..=3 {
        deploy_plugin(c.root(id), &wasm, "router.wasm");
    }
    let dispatcher = plugin_dispatcher(
        "router",
        "orders",
        "router.wasm",
        json!({"checkpointIntervalMs": 20000}),
    );
    write_dispatchers(c.root(1), &json!([dispatcher]));
    let (code, report) = c.broker(1).post("/mmmq/admin/reload", &json!({})).await;
    assert_eq!(code, 200, "{report}");
    c
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plugins_emits_are_stored_once_across_the_leaders_kill() {
    let mut c = router_cluster().await;
    produce(&c, 2, 0, BEFORE).await;
    let leader = c.leader_of(1, "orders", 0).await.expect("a leader");
    let via = (1..=3).find(|b| *b != leader).unwrap();
    let before = mmmq_tests::eventually_async(
        Duration::from_secs(60),
        "a third of the inputs routed",
        || async {
            let seen = routed(&c, via).await?;
            (seen.len() as u64 >= BEFORE / 3).then_some(seen.len() as u64)
        },
    )
    .await;
    c.kill(leader);
    produce(&c, via, BEFORE, BEFORE + AFTER).await;
    routed_once(&c, via).await;
    // The new leader ran again messages whose emits were stored before the kill (its
    // checkpoint lagged): the dedupe was exercised, not just the happy path.
    let new_leader = c.leader_of(via, "orders", 0).await.expect("a new leader");
    let (_, status) = c.broker(new_leader).get("/mmmq/dispatchers").await;
    let delivered = status[0]["delivered"].as_u64().unwrap();
    assert!(
        delivered > BEFORE + AFTER - before,
        "the new leader handled {delivered} inputs, {before} were routed before the kill: no input ran twice"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn emits_are_stored_once_when_a_destinations_leader_dies() {
    // The broker killed leads a destination (`routed.*`) partition but neither the source
    // partition nor the metadata group: the router's emits to that destination go through its
    // new leader (any under way at the kill are sent again under their produce ids), and each
    // input is routed exactly once.
    let mut c = router_cluster().await;
    produce(&c, 2, 0, BEFORE).await;
    let meta = c.meta_leader(1).await;
    let source = c.leader_of(meta, "orders", 0).await.expect("a leader");
    let leaders = mmmq_tests::eventually_async(Duration::from_secs(30), "destinations", || async {
        let mut leaders = Vec::new();
        for t in TYPES {
            leaders.push(c.leader_of(meta, &format!("routed.{t}"), 0).await?);
        }
        Some(leaders)
    })
    .await;
    let Some(victim) = leaders.iter().copied().find(|b| *b != meta && *b != source) else {
        eprintln!("every destination is led by the source's or the metadata's leader: {leaders:?}");
        return;
    };
    eprintln!("destination leaders {leaders:?}: killing {victim}");
    c.kill(victim);
    let via = (1..=3).find(|b| *b != victim).unwrap();
    produce(&c, via, BEFORE, BEFORE + AFTER).await;
    routed_once(&c, via).await;
}
