//! The broker embedded in an application: no HTTP, in-process Rust handlers with the same
//! durability, order, retries and dead letters as remote consumers.

use std::sync::Arc;
use std::time::Duration;

use mmmq::broker::Broker;
use mmmq::config::ServeConfig;
use mmmq_client::Message;
use mmmq_core::{StoredMessage, Topic};
use mmmq_tests::eventually;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

const WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Job {
    n: u64,
}

type Seen = Arc<Mutex<Vec<(String, u64, u64)>>>;

async fn register(broker: &Broker, seen: &Seen, fail_on: Option<u64>) {
    let seen = seen.clone();
    broker
        .handle("app", "jobs.*", move |m: Message<Job>| {
            let seen = seen.clone();
            async move {
                seen.lock()
                    .push((m.topic.to_string(), m.offset, m.content.n));
                if Some(m.content.n) == fail_on {
                    return Err(format!("job {} failed", m.content.n));
                }
                Ok(())
            }
        })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn handlers_receive_in_order_and_resume_from_their_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::open(ServeConfig::new(tmp.path())).await.unwrap();
    let seen: Seen = Arc::default();
    register(&broker, &seen, None).await;
    for n in 0..100 {
        let topic = if n % 2 == 0 { "jobs.even" } else { "jobs.odd" };
        broker.produce_json(topic, None, &Job { n }).await.unwrap();
    }
    eventually(WAIT, "100 handled", || {
        (seen.lock().len() == 100).then_some(())
    })
    .await;
    for topic in ["jobs.even", "jobs.odd"] {
        let offsets: Vec<u64> = seen
            .lock()
            .iter()
            .filter(|s| s.0 == topic)
            .map(|s| s.1)
            .collect();
        assert_eq!(offsets, (0..50).collect::<Vec<_>>(), "{topic} in order");
    }
    // A reload of dispatchers.json does not touch in-process handlers.
    broker.reload().await.unwrap();
    broker
        .produce_json("jobs.even", None, &Job { n: 100 })
        .await
        .unwrap();
    eventually(WAIT, "101 handled", || {
        (seen.lock().len() == 101).then_some(())
    })
    .await;
    broker.shutdown().await;
    drop(broker);

    // A restart: the handler, registered again, resumes from its checkpoint.
    let broker = Broker::open(ServeConfig::new(tmp.path())).await.unwrap();
    let again: Seen = Arc::default();
    register(&broker, &again, None).await;
    for n in [101, 103] {
        broker
            .produce_json("jobs.odd", None, &Job { n })
            .await
            .unwrap();
    }
    // A fence: handled in order, so a redelivery of an old job would come before the last one.
    eventually(WAIT, "the new jobs", || {
        again.lock().iter().any(|j| j.2 == 103).then_some(())
    })
    .await;
    assert_eq!(
        *again.lock(),
        vec![
            ("jobs.odd".to_owned(), 50, 101),
            ("jobs.odd".to_owned(), 51, 103)
        ],
        "nothing handled twice"
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_err_is_retried_then_dead_lettered_and_the_next_job_flows() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::open(ServeConfig::new(tmp.path())).await.unwrap();
    let seen: Seen = Arc::default();
    register(&broker, &seen, Some(1)).await;
    for n in 0..3 {
        broker
            .produce_json("jobs.x", Some("key-1"), &Job { n })
            .await
            .unwrap();
    }
    eventually(WAIT, "all attempts", || {
        (seen.lock().len() == 6).then_some(())
    })
    .await;
    let ns: Vec<u64> = seen.lock().iter().map(|s| s.2).collect();
    assert_eq!(ns, vec![0, 1, 1, 1, 1, 2], "1 + 3 attempts, then the next");
    let dlq = eventually(WAIT, "the dead letter", || {
        broker.registry().get(&Topic::new("__dlq.app").unwrap())
    })
    .await;
    let entry = eventually(WAIT, "a dead letter entry", || {
        dlq.first().log.read(0).ok().flatten()
    })
    .await;
    let letter = StoredMessage::from_payload(&entry).unwrap();
    let content: serde_json::Value = serde_json::from_str(letter.content.get()).unwrap();
    assert_eq!(content["attempts"], 4);
    assert_eq!(content["reason"], "job 1 failed");
    assert_eq!(content["envelope"]["content"], serde_json::json!({"n": 1}));
    assert_eq!(letter.key.as_deref(), Some("key-1"));
    // The count follows the dead letter's commit: wait on it.
    let deadline = std::time::Instant::now() + WAIT;
    let status = loop {
        let status = broker.dispatchers().await;
        if status[0].dead_lettered == 1 {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "{status:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        serde_json::to_value(&status[0].target).unwrap()["type"],
        "in-process"
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn content_that_does_not_fit_is_a_nack_and_names_are_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::open(ServeConfig::new(tmp.path())).await.unwrap();
    let seen: Seen = Arc::default();
    broker
        .handle_with_retries("strict", "jobs.*", 0, {
            let seen = seen.clone();
            move |m: Message<Job>| {
                let seen = seen.clone();
                async move {
                    seen.lock()
                        .push((m.topic.to_string(), m.offset, m.content.n));
                    Ok::<_, String>(())
                }
            }
        })
        .await
        .unwrap();
    broker
        .produce_json("jobs.y", None, &"not a job")
        .await
        .unwrap();
    broker
        .produce_json("jobs.y", None, &Job { n: 9 })
        .await
        .unwrap();
    eventually(WAIT, "the good job", || {
        (seen.lock().len() == 1).then_some(())
    })
    .await;
    let dlq = eventually(WAIT, "the dead letter", || {
        broker.registry().get(&Topic::new("__dlq.strict").unwrap())
    })
    .await;
    eventually(WAIT, "a dead letter entry", || {
        dlq.first().log.read(0).ok().flatten()
    })
    .await;
    assert!(broker.produce_json("../x", None, &1).await.is_err());
    assert!(broker.produce_json("__dlq.strict", None, &1).await.is_err());
    assert!(
        broker
            .handle("bad id!", "x", |_: Message<Job>| async {
                Ok::<_, String>(())
            })
            .await
            .is_err()
    );
    assert!(
        broker
            .handle("strict", "x", |_: Message<Job>| async {
                Ok::<_, String>(())
            })
            .await
            .is_err(),
        "ids are unique"
    );
    broker.shutdown().await;
}

/// An in-process handler with lanes is called concurrently, each key's messages one at a time in
/// offset order, every message once.
#[tokio::test(flavor = "multi_thread")]
async fn an_in_process_handler_with_lanes_runs_keys_in_parallel_each_in_order() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::open(ServeConfig::new(tmp.path())).await.unwrap();
    let seen: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let options = mmmq::broker::HandlerOptions {
        max_in_flight: 8,
        ..Default::default()
    };
    {
        let (seen, now, most) = (seen.clone(), now.clone(), most.clone());
        broker
            .handle_with("par", "par", options, move |m: Message<Job>| {
                let (seen, now, most) = (seen.clone(), now.clone(), most.clone());
                async move {
                    let running = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(running, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    seen.lock().push((m.key.clone().unwrap(), m.content.n));
                    now.fetch_sub(1, Ordering::SeqCst);
                    Ok::<(), String>(())
                }
            })
            .await
            .unwrap();
    }
    for n in 0..200 {
        let key = format!("k{}", n % 20);
        broker
            .produce_json("par", Some(&key), &Job { n })
            .await
            .unwrap();
    }
    eventually(WAIT, "200 handled", || {
        (seen.lock().len() == 200).then_some(())
    })
    .await;
    let mut last: std::collections::HashMap<String, u64> = Default::default();
    for (key, n) in seen.lock().iter() {
        if let Some(&before) = last.get(key) {
            assert!(*n > before, "{key}: {n} after {before}");
        }
        last.insert(key.clone(), *n);
    }
    assert!(most.load(Ordering::SeqCst) > 1, "never concurrent");
    let bad = mmmq::broker::HandlerOptions {
        max_in_flight: 0,
        ..Default::default()
    };
    assert!(
        broker
            .handle_with("bad", "x", bad, |_m: Message<Job>| async {
                Ok::<(), String>(())
            })
            .await
            .is_err()
    );
    broker.shutdown().await;
}

/// A produce with an id whose future is dropped once the id is claimed (a request deadline, a
/// client that went away) still stores its message and resolves the claim: a retry of the id
/// answers `duplicate` at once with the first one's place (it waited out the dedupe window and
/// stored a second copy). The same for a batch.
#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_produce_still_resolves_its_id() {
    use mmmq::broker::ProduceItem;
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::open(ServeConfig::new(tmp.path())).await.unwrap();
    let item = |id: &str, n: u64| {
        let content = serde_json::value::to_raw_value(&Job { n }).unwrap();
        ProduceItem::new("ids", None, content, 1 << 20)
            .unwrap()
            .with_id(Some(id.to_owned()))
            .unwrap()
    };
    let stored = || async {
        let page = broker
            .pull("ids", 0, 0, 100, Duration::ZERO, &Default::default())
            .await
            .unwrap();
        page.messages.len()
    };
    let wait_stored = |n: usize| async move {
        let deadline = std::time::Instant::now() + WAIT;
        while stored().await < n {
            assert!(std::time::Instant::now() < deadline, "never stored");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    // The topic exists (its creation is not what is tested).
    broker
        .produce_json("ids", None, &Job { n: 0 })
        .await
        .unwrap();
    // Polled once (the claim is made, the append waits for its fsync), then dropped; the retry
    // comes once the first message is stored, as a client's retry after its timeout would.
    let _dropped = tokio::time::timeout(Duration::ZERO, broker.produce(item("one", 1))).await;
    wait_stored(2).await;
    let retry = tokio::time::timeout(Duration::from_secs(5), broker.produce(item("one", 1)))
        .await
        .expect("the retry waited for a claim nobody resolves")
        .unwrap();
    assert!(retry.duplicate, "{retry:?}");
    assert_eq!((retry.partition, retry.offset), (0, 1));

    let batch = || vec![item("two", 2), item("three", 3)];
    let _dropped = tokio::time::timeout(Duration::ZERO, broker.produce_batch(batch())).await;
    wait_stored(4).await;
    let retry = tokio::time::timeout(Duration::from_secs(5), broker.produce_batch(batch()))
        .await
        .expect("the retried batch waited for claims nobody resolves")
        .unwrap();
    assert!(retry.iter().all(|p| p.duplicate), "{retry:?}");
    assert_eq!(
        retry.iter().map(|p| p.offset).collect::<Vec<_>>(),
        vec![2, 3]
    );
    assert_eq!(stored().await, 4, "each id stored once");
    broker.shutdown().await;
}

/// Pulls and group polls racing retention (docs/topics-and-groups.md, "Retention": behind the horizon) answer from
/// the first offset still stored; they answered an error (a `500`) when a segment they had found
/// was deleted before they read it.
#[tokio::test(flavor = "multi_thread")]
async fn pulls_and_group_polls_racing_retention_answer_from_the_first_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = ServeConfig::new(tmp.path());
    // One message per segment, and few open files: each read opens the files of segments that
    // are being deleted at that moment.
    config.segment_max_bytes = 1;
    config.max_open_files = Some(2);
    let broker = Arc::new(Broker::open(config).await.unwrap());
    const N: u64 = 400;
    for n in 0..N {
        broker.produce_json("race", None, &Job { n }).await.unwrap();
    }
    let log = broker
        .registry()
        .get(&Topic::new("race").unwrap())
        .unwrap()
        .first()
        .log
        .clone();
    let reader = {
        let (broker, log) = (broker.clone(), log.clone());
        tokio::spawn(async move {
            let stop = Default::default();
            let limits = (10, Duration::ZERO, Duration::from_secs(10));
            let mut reads = 0;
            while log.first_offset() < N - 1 {
                let page = broker
                    .pull("race", 0, 0, 10, Duration::ZERO, &stop)
                    .await
                    .unwrap_or_else(|e| panic!("pull: {e}"));
                if let (Some(a), Some(b)) = (page.messages.first(), page.messages.last()) {
                    assert_eq!(b.offset - a.offset + 1, page.messages.len() as u64);
                }
                broker
                    .groups()
                    .poll("g", "m", "race", limits, &stop)
                    .await
                    .unwrap_or_else(|e| panic!("group poll: {e}"));
                reads += 1;
            }
            reads
        })
    };
    for upto in 1..N {
        let log = log.clone();
        tokio::task::spawn_blocking(move || log.remove_segments_before(upto).unwrap())
            .await
            .unwrap();
        tokio::task::yield_now().await;
    }
    assert!(reader.await.unwrap() > 0);
    broker.shutdown().await;
}
