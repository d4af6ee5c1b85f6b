//! Emits across the life of a dispatcher and of its source topic (docs/plugins.md,
//! "WebAssembly handlers"): emits the disk refuses are retried while the checkpoint waits; a stop while they are
//! refused is bounded and stores each once after the restart; a clean stop under load repeats
//! and loses nothing; a deleted source topic's emit state goes with it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mmmq_tests::{Broker, testbed_root};
use serde_json::json;

fn checkpoint(root: &std::path::Path, topic: &str, id: &str) -> u64 {
    std::fs::read(root.join(format!("topics/{topic}/checkpoints/{id}.checkpoint")))
        .ok()
        .and_then(|b| {
            b.get(..8)
                .map(|b| u64::from_be_bytes(b.try_into().unwrap()))
        })
        .unwrap_or(0)
}

/// Emits the disk (here: the topic limit) refuses are tried again until they are stored, without
/// calling the plugin again, while the checkpoint waits for them; status says why meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn refused_emits_are_retried_and_the_checkpoint_waits_for_them() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    testbed_root(root, "x", "in", json!({}));
    // `in` and `out-a` fit; `out-b` is one topic too many until `out-a` is deleted.
    let broker = Broker::start_with(root, &["--max-topics", "2"]).await;
    broker
        .produce("in", json!({"do": "emit", "to": "out-a"}))
        .await;
    broker
        .produce("in", json!({"do": "emit", "to": "out-b"}))
        .await;
    let s = broker
        .dispatcher_when("x", |s| s["target"]["emitError"].is_string())
        .await;
    assert!(
        s["target"]["emitError"]
            .as_str()
            .unwrap()
            .contains("--max-topics"),
        "{s}"
    );
    // The plugin goes on (a message without emits is handled) but the checkpoint stays before
    // the message whose emit is not stored.
    broker.produce("in", json!({"n": 2})).await;
    broker.dispatcher_when("x", |s| s["delivered"] == 3).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        checkpoint(root, "in", "x") <= 1,
        "the checkpoint moved past an unstored emit"
    );
    let (code, body) = broker.delete("/mmmq/topics/out-a").await;
    assert_eq!(code, 200, "{body}");
    let s = broker
        .dispatcher_when("x", |s| s["target"]["emitError"].is_null())
        .await;
    assert_eq!(s["delivered"], 3, "{s}");
    let out = broker.pull_all("out-b").await;
    assert_eq!(out.len(), 1, "stored once: {out:?}");
    assert_eq!(out[0]["origin"]["offset"], 1);
    // Handled once: the plugin logged offset 1 one time.
    let log = broker.log.lock().clone();
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("testbed version=v1 topic=in offset=1 "))
            .count(),
        1,
        "{log}"
    );
    mmmq_tests::eventually(
        Duration::from_secs(10),
        "the checkpoint past the emit",
        || (checkpoint(root, "in", "x") == 3).then_some(()),
    )
    .await;
}

/// A stop (a reload that replaces the dispatcher, then SIGTERM) while the disk refuses a plugin's
/// emits (here: the topic limit) finishes within its bounds — the emit pipeline's retries and the
/// checkpoint's wait for them ignored the stop and hung it forever — and the new target does not
/// race the old pipeline: once the emits can be stored (a restart with a higher limit), each is
/// stored once.
#[tokio::test(flavor = "multi_thread")]
async fn a_stop_while_emits_are_refused_is_bounded_and_stores_each_emit_once() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    testbed_root(root, "x", "in", json!({}));
    // `in` and `out-a` fit; `out-b` is one topic too many.
    let broker = Broker::start_with(root, &["--max-topics", "2"]).await;
    broker
        .produce("in", json!({"do": "emit", "to": "out-a"}))
        .await;
    for _ in 0..4 {
        broker
            .produce("in", json!({"do": "emit", "to": "out-b"}))
            .await;
    }
    broker
        .dispatcher_when("x", |s| s["target"]["emitError"].is_string())
        .await;
    // A changed dispatcher: the old one stops while its emits are refused.
    testbed_root(root, "x", "in", json!({"maxNackRetries": 5}));
    let reload = broker
        .http
        .post(format!("{}/mmmq/admin/reload", broker.url))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("the reload hung while the emits were refused");
    assert_eq!(reload.status(), 200);
    broker
        .dispatcher_when("x", |s| s["target"]["emitError"].is_string())
        .await;
    let stopped = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::task::spawn_blocking(move || broker.terminate()),
    )
    .await
    .expect("SIGTERM hung while the emits were refused")
    .unwrap();
    assert!(stopped.success(), "{stopped:?}");
    let broker = Broker::start_with(root, &["--max-topics", "3"]).await;
    let out = broker.pull_until("out-b", 4).await;
    let mut from: Vec<u64> = out
        .iter()
        .map(|m| m["content"]["from"].as_u64().unwrap())
        .collect();
    from.sort();
    assert_eq!(from, [1, 2, 3, 4], "each emit once: {out:?}");
    broker
        .dispatcher_when("x", |s| {
            s["target"]["emitError"].is_null() && s["topics"][0]["lag"] == 0
        })
        .await;
    assert_eq!(broker.pull_all("out-b").await.len(), 4, "stored again");
}

/// A source topic deleted while a plugin emitted from it is freed: the plugin's emit state for
/// it (its commit task, which held the partition) goes, so the deleted files are closed and their
/// space is given back. It was kept for as long as the dispatcher ran: a `**` router over
/// short-lived topics held every topic it ever read.
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_source_topics_files_are_closed() {
    let tmp = tempfile::tempdir().unwrap();
    testbed_root(tmp.path(), "x", "src", json!({}));
    let broker = Broker::start(tmp.path()).await;
    for _ in 0..3 {
        broker
            .produce("src", json!({"do": "emit", "to": "out"}))
            .await;
    }
    broker.pull_until("out", 3).await;
    let deleted_open = || {
        std::fs::read_dir(format!("/proc/{}/fd", broker.pid()))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .map(|l| l.display().to_string())
            .filter(|l| l.contains("/src.") && l.ends_with("(deleted)"))
            .collect::<Vec<_>>()
    };
    let (code, body) = broker.delete("/mmmq/topics/src").await;
    assert_eq!(code, 200, "{body}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let open = deleted_open();
        if open.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the deleted topic's files are still open: {open:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A clean stop (SIGTERM) while a plugin emits under load loses nothing and repeats nothing: the
/// runs in flight at the stop finish, their emits are stored, and after the restart no message is
/// handled again and each emit is there once.
#[tokio::test(flavor = "multi_thread")]
async fn a_clean_stop_while_a_plugin_emits_repeats_and_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    testbed_root(root, "x", "in", json!({}));
    let broker = Broker::start(root).await;
    let (url, stop) = (broker.url.clone(), Arc::new(AtomicBool::new(false)));
    let producer = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut acked = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let item = json!({"topic": "in", "content": {"do": "emit", "to": "out"}});
                match http
                    .post(format!("{url}/mmmq/messages"))
                    .json(&item)
                    .send()
                    .await
                {
                    Ok(r) if r.status() == 200 => acked += 1,
                    _ => break,
                }
                // Below the plugin log's rate limit, so that every handling is logged.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            acked
        })
    };
    broker.pull_until("out", 100).await;
    let first_log = broker.log.clone();
    let stopped = tokio::task::spawn_blocking(move || broker.terminate())
        .await
        .unwrap();
    assert!(stopped.success(), "{stopped:?}");
    stop.store(true, Ordering::Relaxed);
    let acked = producer.await.unwrap();
    let broker = Broker::start(root).await;
    let stored = broker.pull_all("in").await.len() as u64;
    assert!(stored >= acked, "{stored} stored, {acked} acknowledged");
    let out = broker.pull_until("out", stored as usize).await;
    let mut from: Vec<u64> = out
        .iter()
        .map(|m| m["content"]["from"].as_u64().unwrap())
        .collect();
    from.sort();
    assert_eq!(
        from,
        (0..stored).collect::<Vec<_>>(),
        "each input's emit once"
    );
    broker
        .dispatcher_when("x", |s| s["topics"][0]["lag"] == 0)
        .await;
    let handled = |log: &str| {
        log.lines()
            .filter(|l| l.contains("testbed version=v1 topic=in offset="))
            .count() as u64
    };
    let (before, after) = (handled(&first_log.lock()), handled(&broker.log.lock()));
    assert_eq!(
        before + after,
        stored,
        "a message was handled twice across the clean stop ({before} before it, {after} after)"
    );
}
