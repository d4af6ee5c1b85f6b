//! Exactly-once processing in `mmmq-client` (docs/delivery.md, "Exactly-once consumers"): with a
//! `DedupeStore`, the push `Consumer` and the `GroupConsumer` run their handling once per message
//! while the broker is SIGKILLed mid-stream again and again and delivers the last messages again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use mmmq_client::{Consumer, DedupeStore, GroupConsumer, Message};
use mmmq_tests::{Broker, eventually, free_port, host_dispatcher, write_dispatchers};
use parking_lot::Mutex;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(120);

/// How many times each message's side effect happened, by its `n`.
type Effects = Arc<Mutex<BTreeMap<u64, u32>>>;

fn count(effects: &Effects) -> usize {
    effects.lock().len()
}

/// Checks every `n` below `total` happened exactly once.
fn exactly_once(who: &str, effects: &Effects, total: u64) {
    let effects = effects.lock();
    let twice: Vec<_> = effects.iter().filter(|&(_, &c)| c > 1).collect();
    assert!(twice.is_empty(), "{who}: handled more than once: {twice:?}");
    let missing: Vec<u64> = (0..total).filter(|n| !effects.contains_key(n)).collect();
    assert!(missing.is_empty(), "{who}: never handled: {missing:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn handlers_run_once_per_message_through_twenty_broker_sigkills() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("broker");
    let addr = format!("127.0.0.1:{}", free_port());
    let url = format!("http://{addr}");

    // A push consumer with 4 lanes per partition: its side effect is a count per message.
    let push_store = DedupeStore::open(tmp.path().join("push.redb")).unwrap();
    let push: Effects = Arc::default();
    let p = push.clone();
    let consumer = Consumer::new()
        .exactly_once(push_store.clone())
        .handle("eo", move |m: Message<Value>| {
            let p = p.clone();
            async move {
                // Slow enough that a kill finds requests in flight.
                tokio::time::sleep(Duration::from_millis(1)).await;
                *p.lock()
                    .entry(m.content["n"].as_u64().unwrap())
                    .or_default() += 1;
                Ok::<_, String>(())
            }
        })
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let consumer_port = listener.local_addr().unwrap().port();
    tokio::spawn(consumer.serve(listener, std::future::pending()));
    let mut d = host_dispatcher("eo-push", "eo", consumer_port);
    d["maxInFlight"] = json!(4);
    write_dispatchers(&root, &json!([d]));

    // A group member pulling the same topic, retrying through the broker's deaths.
    let group_store = DedupeStore::open(tmp.path().join("group.redb")).unwrap();
    let group: Effects = Arc::default();
    let mut member = GroupConsumer::new(&url, "eo-group", "m1", "eo")
        .unwrap()
        .max(50)
        .wait(Duration::from_millis(200))
        .exactly_once(group_store.clone());
    let g = group.clone();
    tokio::spawn(async move {
        loop {
            match member.poll().await {
                Ok(messages) => {
                    for m in messages {
                        // Slow enough that a kill often comes between a poll and its commit.
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        let n: Value = serde_json::from_str(m.content.get()).unwrap();
                        *g.lock().entry(n["n"].as_u64().unwrap()).or_default() += 1;
                    }
                }
                // The broker is down or restarting: poll again (a restarted broker answers the
                // commit of the last batch with 404 until the group polls; the client drops it).
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    });

    let kills = 20;
    let per_cycle = 100u64;
    let mut total = 0u64;
    for cycle in 0..=kills {
        let broker =
            Broker::start_with(&root, &["--listen", &addr, "--default-partitions", "2"]).await;
        let batch: Vec<Value> = (total..total + per_cycle)
            .map(|n| json!({"topic": "eo", "key": format!("k{}", n % 7), "content": {"n": n}}))
            .collect();
        total += per_cycle;
        let (status, b) = broker.post("/mmmq/messages/batch", &json!(batch)).await;
        assert_eq!(status, 200, "{b}");
        if cycle < kills {
            // Mid-stream: both have handled some of this cycle's messages, not all.
            let (a, b) = (count(&push), count(&group));
            eventually(WAIT, "handling under way", || {
                (count(&push) >= a + 20 && count(&group) >= b + 20).then_some(())
            })
            .await;
            broker.kill();
        } else {
            eventually(WAIT, "everything handled", || {
                (count(&push) as u64 == total && count(&group) as u64 == total).then_some(())
            })
            .await;
            broker.dispatcher_when("eo-push", |s| s["lag"] == 0).await;
            assert!(broker.terminate().success());
        }
    }
    exactly_once("push consumer", &push, total);
    exactly_once("group consumer", &group, total);
    // The broker did deliver messages again (or the test proved nothing), and the stores
    // absorbed every one of them.
    eprintln!(
        "exactly-once: {kills} kills, {total} messages; redeliveries skipped: push {}, group {}",
        push_store.duplicates(),
        group_store.duplicates()
    );
    assert!(
        push_store.duplicates() > 0,
        "no redelivery to the push consumer"
    );
    assert!(
        group_store.duplicates() > 0,
        "no redelivery to the group consumer"
    );
}
