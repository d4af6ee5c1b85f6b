//! WebAssembly handlers end to end: the real binary running real components built from source.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mmmq_tests::{
    Broker, Consumer, deploy_plugin, eventually, host_dispatcher, plugin_dispatcher, plugin_wasm,
    write_dispatchers,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_receives_every_message_in_order_with_content_and_key() {
    let tmp = tempfile::tempdir().unwrap();
    deploy_plugin(tmp.path(), &plugin_wasm("testbed", None), "testbed.wasm");
    write_dispatchers(
        tmp.path(),
        &json!([plugin_dispatcher("tb", "p.*", "testbed.wasm", json!({}))]),
    );
    let broker = Broker::start(tmp.path()).await;
    for i in 0..20 {
        let key = if i % 2 == 0 {
            json!(format!("k{i}"))
        } else {
            Value::Null
        };
        let (status, _) = broker
            .post(
                "/mmmq/messages",
                &json!({"topic": "p.a", "key": key, "content": {"i": i, "s": "é\"x"}}),
            )
            .await;
        assert_eq!(status, 200);
    }
    let handled = eventually(WAIT, "20 handled", || {
        let h = broker.handled();
        (h.len() >= 20).then_some(h)
    })
    .await;
    for (i, h) in handled.iter().enumerate() {
        assert_eq!((h.topic.as_str(), h.offset), ("p.a", i as u64));
        let key = if i % 2 == 0 {
            format!("Some(\"k{i}\")")
        } else {
            "None".into()
        };
        assert!(
            h.rest
                .starts_with(&format!("key={key} content={{\"i\":{i},\"s\":\"é\\\"x\"}}")),
            "{h:?}"
        );
    }
    let status = broker.dispatcher_when("tb", |s| s["delivered"] == 20).await;
    assert_eq!(status["target"]["type"], "plugin");
    assert_eq!(
        status["target"]["version"].as_str().unwrap().len(),
        16,
        "{status}"
    );
    assert_eq!(status["target"]["loadError"], Value::Null);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_nack_is_retried_then_dead_lettered_and_the_next_flows() {
    let tmp = tempfile::tempdir().unwrap();
    deploy_plugin(tmp.path(), &plugin_wasm("testbed", None), "testbed.wasm");
    write_dispatchers(
        tmp.path(),
        &json!([plugin_dispatcher("tb", "n", "testbed.wasm", json!({}))]),
    );
    let broker = Broker::start(tmp.path()).await;
    broker.produce("n", json!({"do": "nack"})).await;
    broker.produce("n", json!({"ok": 1})).await;
    let dlq = broker.pull_until("__dlq.tb", 1).await;
    assert_eq!(dlq[0]["content"]["attempts"], 4);
    assert!(
        dlq[0]["content"]["reason"]
            .as_str()
            .unwrap()
            .contains("nack"),
        "{dlq:?}"
    );
    eventually(WAIT, "the next message", || {
        broker.handled().iter().any(|h| h.offset == 1).then_some(())
    })
    .await;
    let offsets: Vec<u64> = broker.handled().iter().map(|h| h.offset).collect();
    assert_eq!(
        offsets,
        vec![0, 0, 0, 0, 1],
        "1 + 3 attempts, then the next"
    );
}

/// A dispatcher whose plugin directory does not exist at start: the message waits (with the
/// reason in status), and once the directory and a good file appear the plugin runs, without an
/// admin reload (the directory used to be never watched).
#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_directory_created_after_start_is_picked_up() {
    let tmp = tempfile::tempdir().unwrap();
    write_dispatchers(
        tmp.path(),
        &json!([plugin_dispatcher(
            "tb",
            "late",
            "later/deeper/testbed.wasm",
            json!({})
        )]),
    );
    let broker = Broker::start(tmp.path()).await;
    broker.produce("late", json!({"n": 0})).await;
    let s = broker.dispatcher("tb").await;
    assert!(
        s["target"]["loadError"]
            .as_str()
            .is_some_and(|e| e.contains("cannot read")),
        "{s}"
    );
    // The directories appear one level at a time, then the file.
    let deeper = tmp.path().join("plugins/later/deeper");
    for dir in deeper
        .ancestors()
        .take(3)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
    {
        std::fs::create_dir(dir).unwrap();
    }
    let aside = deeper.join(".testbed.wasm.tmp");
    std::fs::copy(plugin_wasm("testbed", None), &aside).unwrap();
    std::fs::rename(&aside, deeper.join("testbed.wasm")).unwrap();
    // The plugin logs before its answer is counted: wait on the count.
    let s = broker.dispatcher_when("tb", |s| s["delivered"] == 1).await;
    assert_eq!(s["target"]["loadError"], Value::Null, "{s}");
    // The log line travels through the broker's stdout, read by another thread than the status
    // request: wait for it rather than assume it arrived first.
    eventually(WAIT, "the plugin's line for `late`", || {
        broker
            .handled()
            .iter()
            .any(|h| h.topic == "late")
            .then_some(())
    })
    .await;
}

/// Each (dispatcher, topic) has an instance of its own, so state a plugin keeps between calls
/// (key-rate-limit's windows) sees exactly its topic's messages: the testbed's per-instance count
/// is the offset plus one for every message of every topic.
#[tokio::test(flavor = "multi_thread")]
async fn each_topic_has_its_own_instance() {
    let tmp = tempfile::tempdir().unwrap();
    deploy_plugin(tmp.path(), &plugin_wasm("testbed", None), "testbed.wasm");
    write_dispatchers(
        tmp.path(),
        &json!([plugin_dispatcher("tb", "inst.*", "testbed.wasm", json!({}))]),
    );
    let broker = Broker::start(tmp.path()).await;
    let topics = ["inst.a", "inst.b", "inst.c"];
    for round in 0..5 {
        let items: Vec<Value> = (0..60)
            .map(|i| json!({"topic": topics[i % 3], "content": {"round": round, "i": i}}))
            .collect();
        let (status, body) = broker
            .post("/mmmq/messages/batch", &Value::Array(items))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let handled = eventually(WAIT, "300 handled", || {
        let h = broker.handled();
        (h.len() >= 300).then_some(h)
    })
    .await;
    for t in topics {
        let seen: Vec<(u64, u64)> = handled
            .iter()
            .filter(|h| h.topic == t)
            .map(|h| (h.offset, h.seen))
            .collect();
        let want: Vec<(u64, u64)> = (0..100).map(|o| (o, o + 1)).collect();
        assert_eq!(seen, want, "{t}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn files_that_are_not_handlers_are_refused_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("plugins");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("garbage.wasm"), b"this is not wasm").unwrap();
    // The smallest core module: a module, not a component.
    std::fs::write(dir.join("core.wasm"), b"\0asm\x01\0\0\0").unwrap();
    deploy_plugin(
        tmp.path(),
        &plugin_wasm("notahandler", None),
        "command.wasm",
    );
    let http = Consumer::start().await;
    write_dispatchers(
        tmp.path(),
        &json!([
            plugin_dispatcher("garbage", "w", "garbage.wasm", json!({})),
            plugin_dispatcher("core", "w", "core.wasm", json!({})),
            plugin_dispatcher("command", "w", "command.wasm", json!({})),
            plugin_dispatcher("missing", "w", "missing.wasm", json!({})),
            host_dispatcher("http", "w", http.port),
        ]),
    );
    let broker = Broker::start(tmp.path()).await;
    broker.produce("w", json!(1)).await;
    http.wait_for(1, WAIT).await;
    for (id, want) in [
        // The reason names the problem, never the file's bytes (a path that is not a plugin
        // would show what it holds).
        ("garbage", "not a WebAssembly component (bad magic)"),
        ("core", "core WebAssembly module, not a component"),
        (
            "command",
            "does not implement the mmmq:plugin handler world",
        ),
        ("missing", "cannot read"),
    ] {
        let s = broker.dispatcher(id).await;
        let err = s["target"]["loadError"].as_str().unwrap_or_default();
        assert!(err.contains(want), "{id}: {s}");
        assert!(!err.contains("not wasm"), "{id}: {s}");
        assert_eq!(s["target"]["version"], Value::Null);
        assert_eq!(s["delivered"], 0);
    }
    // Nothing was dead-lettered: the messages wait for a good file.
    let (status, _) = broker.get("/mmmq/topics/__dlq.garbage/messages").await;
    assert_eq!(status, 404);
    // The same verdicts from the command line.
    for (file, want, ok) in [
        (
            "garbage.wasm",
            "not a WebAssembly component (bad magic)",
            false,
        ),
        ("command.wasm", "does not implement", false),
    ] {
        let out = std::process::Command::new(mmmq_tests::mmmq_bin())
            .args(["plugin", "check"])
            .arg(dir.join(file))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.success(), ok, "{text}");
        assert!(text.contains(want), "{text}");
        assert!(!text.contains("not wasm"), "{text}");
    }
    // A good file at a waiting dispatcher's path: it loads and the waiting message flows.
    deploy_plugin(tmp.path(), &plugin_wasm("testbed", None), "missing.wasm");
    eventually(WAIT, "the fixed plugin to deliver", || {
        broker
            .handled()
            .iter()
            .any(|h| h.topic == "w")
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn hot_reload_under_load_switches_versions_between_messages() {
    let tmp = tempfile::tempdir().unwrap();
    let v1 = plugin_wasm("testbed", None); // the default build is v1

    let v2 = plugin_wasm("testbed", Some("v2"));
    deploy_plugin(tmp.path(), &v1, "live.wasm");
    write_dispatchers(
        tmp.path(),
        &json!([plugin_dispatcher("live", "live", "live.wasm", json!({}))]),
    );
    let broker = Arc::new(Broker::start(tmp.path()).await);
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let broker = broker.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                broker.produce("live", json!({"n": n})).await;
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            n
        })
    };
    eventually(WAIT, "v1 at work", || {
        (broker.handled().len() > 20).then_some(())
    })
    .await;
    let swapped = Instant::now();
    deploy_plugin(tmp.path(), &v2, "live.wasm");
    eventually(WAIT, "v2 at work", || {
        broker
            .handled()
            .iter()
            .any(|h| h.version == "v2")
            .then_some(())
    })
    .await;
    let switch_time = swapped.elapsed();
    assert!(
        switch_time < Duration::from_secs(2),
        "the new version took {switch_time:?}"
    );
    // Back to v1 by writing the file in place (same inode, truncated and rewritten), as `cp`
    // does: the watcher sees it, a half-written file never serves.
    let v2_seen = broker.handled().len();
    let swapped = Instant::now();
    std::fs::write(
        tmp.path().join("plugins/live.wasm"),
        std::fs::read(&v1).unwrap(),
    )
    .unwrap();
    eventually(WAIT, "v1 at work again", || {
        broker.handled()[v2_seen..]
            .iter()
            .any(|h| h.version == "v1")
            .then_some(())
    })
    .await;
    let switch_time = swapped.elapsed();
    assert!(
        switch_time < Duration::from_secs(2),
        "the in-place write took {switch_time:?}"
    );
    let v1_again = broker.handled().len();

    // A broken replacement: the old version keeps serving and the error is shown.
    std::fs::write(tmp.path().join("plugins/live.wasm"), b"\0asm broken").unwrap();
    // Waited for in the status, not the log: the in-place write above may already have logged a
    // failed reload of a half-written file (then loaded the whole one).
    let deadline = std::time::Instant::now() + WAIT;
    let s = loop {
        let s = broker.dispatcher("live").await;
        // A reload may first catch the file half written (then "bad magic") before the whole
        // broken file's error: wait for that one.
        if s["target"]["loadError"]
            .as_str()
            .is_some_and(|e| e.contains("not a valid"))
        {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no load error of the broken file: {s}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        broker
            .log
            .lock()
            .contains("plugin reload failed; the old version keeps serving")
    );
    assert!(
        s["target"]["loadError"]
            .as_str()
            .unwrap()
            .contains("not a valid"),
        "{s}"
    );
    assert_eq!(s["target"]["version"].as_str().unwrap().len(), 16);
    // v1 keeps serving after the broken file: a fence of ten more messages handled.
    eventually(WAIT, "ten messages after the broken file", || {
        (broker.handled().len() > v1_again + 10).then_some(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let produced = producer.await.unwrap();
    let handled = eventually(WAIT, "everything handled", || {
        let h = broker.handled();
        (h.len() as u64 >= produced).then_some(h)
    })
    .await;
    assert_eq!(handled.len() as u64, produced, "none handled twice");
    let first_v2 = handled.iter().position(|h| h.version == "v2").unwrap();
    let back_to_v1 = first_v2
        + handled[first_v2..]
            .iter()
            .position(|h| h.version == "v1")
            .unwrap();
    for (i, h) in handled.iter().enumerate() {
        assert_eq!(h.offset, i as u64, "in order, none lost");
        let want = if (first_v2..back_to_v1).contains(&i) {
            "v2"
        } else {
            "v1"
        };
        assert_eq!(h.version, want, "offset {i}: v1, then v2, then v1");
        assert!(h.rest.ends_with(&format!("content={{\"n\":{i}}}")), "{h:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_keeps_plugin_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    deploy_plugin(tmp.path(), &plugin_wasm("testbed", None), "testbed.wasm");
    write_dispatchers(
        tmp.path(),
        &json!([plugin_dispatcher("tb", "r", "testbed.wasm", json!({}))]),
    );
    let broker = Broker::start(tmp.path()).await;
    for i in 0..5 {
        broker.produce("r", json!(i)).await;
    }
    eventually(WAIT, "5 handled", || {
        (broker.handled().len() == 5).then_some(())
    })
    .await;
    assert!(broker.terminate().success());
    let broker = Broker::start(tmp.path()).await;
    broker.produce("r", json!(5)).await;
    broker.produce("r", json!(6)).await;
    // A fence: the plugin handles in order, so a redelivery of 0-4 would come before 6.
    eventually(WAIT, "the new messages", || {
        broker.handled().iter().any(|h| h.offset == 6).then_some(())
    })
    .await;
    let offsets: Vec<u64> = broker.handled().iter().map(|h| h.offset).collect();
    assert_eq!(
        offsets,
        vec![5, 6],
        "nothing handled twice across the restart"
    );
}

/// A plugin with `maxInFlight` lanes: an instance per lane, so each instance sees its keys'
/// messages in offset order (the testbed's `lanes` build NACKs, and so dead-letters, a message of
/// a key that steps back behind the last one its instance saw), and every message of every
/// partition is handled once.
#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_with_lanes_gets_an_instance_per_lane_each_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    // The `lanes` build checks order per key: a lane's instance sees only its keys.
    deploy_plugin(
        tmp.path(),
        &plugin_wasm("testbed", Some("lanes")),
        "testbed.wasm",
    );
    write_dispatchers(
        tmp.path(),
        &json!([plugin_dispatcher(
            "lanes",
            "pl.*",
            "testbed.wasm",
            json!({"maxInFlight": 8})
        )]),
    );
    let broker = Broker::start_with(tmp.path(), &["--default-partitions", "2"]).await;
    let batch: Vec<Value> = (0..400)
        .map(|i| json!({"topic": "pl.a", "key": format!("k{}", i % 40), "content": {"i": i}}))
        .collect();
    let (status, b) = broker.post("/mmmq/messages/batch", &json!(batch)).await;
    assert_eq!(status, 200, "{b}");
    let status = broker
        .dispatcher_when("lanes", |s| s["delivered"] == 400)
        .await;
    assert_eq!(status["deadLettered"], 0, "{status}");
    assert_eq!(status["nacked"], 0, "{status}");
    let handled = eventually(WAIT, "400 log lines", || {
        let h = broker.handled();
        (h.len() >= 400).then_some(h)
    })
    .await;
    assert_eq!(handled.len(), 400);
    // Several instances took part (one per lane and partition that had messages).
    let firsts = handled.iter().filter(|h| h.seen == 1).count();
    assert!(firsts > 2, "{firsts} instances");
}
