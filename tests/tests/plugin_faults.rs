//! Guests that misbehave (loop, eat memory, overflow the stack, panic, flood the log, cannot be
//! instantiated) against the real binary: each is a plugin fault, NACKed with its reason and
//! dead-lettered, and nothing else is affected.

use std::time::{Duration, Instant};

use mmmq_tests::{
    Broker, Consumer, Handled, deploy_plugin, eventually, host_dispatcher, plugin_dispatcher,
    plugin_wasm, write_dispatchers,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

/// A misbehaving guest on a topic that an HTTP consumer also receives: its message is NACKed with
/// the right reason and dead-lettered, the HTTP consumer gets everything, the broker stays healthy,
/// and the plugin handles the next message.
async fn misbehaving_guest(action: &str, want_reason: &str) {
    let tmp = tempfile::tempdir().unwrap();
    deploy_plugin(tmp.path(), &plugin_wasm("testbed", None), "testbed.wasm");
    let http = Consumer::start().await;
    write_dispatchers(
        tmp.path(),
        &json!([
            plugin_dispatcher(
                "tb",
                "bad",
                "testbed.wasm",
                json!({"maxNackRetries": 0, "plugin": {"timeoutMs": 300, "maxMemoryBytes": 33554432}})
            ),
            host_dispatcher("http", "bad", http.port),
        ]),
    );
    let broker = Broker::start(tmp.path()).await;
    broker.produce("bad", json!({"do": action})).await;
    broker.produce("bad", json!({"after": true})).await;
    let dlq = broker.pull_until("__dlq.tb", 1).await;
    let reason = dlq[0]["content"]["reason"].as_str().unwrap().to_owned();
    assert!(reason.contains(want_reason), "{action}: reason {reason:?}");
    http.wait_for(2, WAIT).await;
    eventually(WAIT, "the next message handled", || {
        broker.handled().iter().any(|h| h.offset == 1).then_some(())
    })
    .await;
    let (status, _) = broker.get("/healthz").await;
    assert_eq!(status, 200);
    // The plugin logs before its answer is counted: wait on the count.
    let s = broker.dispatcher_when("tb", |s| s["delivered"] == 1).await;
    assert_eq!(s["deadLettered"], json!(1), "{s}");
    assert!(
        s["lastError"].as_str().unwrap().contains(want_reason),
        "{s}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_infinite_loop_times_out() {
    misbehaving_guest("loop", "timed out after 300 ms").await;
}

/// A guest that waits in the host (`std::thread::sleep` of an hour: a clock pollable, where the
/// WebAssembly time limit cannot reach it) is cut off at its `timeoutMs` too. The next message is
/// handled only once the call's thread is free, so its delivery shows that no thread is left
/// blocked in the sleep.
#[tokio::test(flavor = "multi_thread")]
async fn a_sleep_in_the_host_times_out() {
    misbehaving_guest("sleep", "timed out after 300 ms").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_memory_bomb_hits_the_memory_limit() {
    misbehaving_guest("alloc", "memory limit of 33554432 bytes exceeded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stack_overflow_traps() {
    misbehaving_guest("stack", "trapped").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_panic_traps() {
    misbehaving_guest("panic", "trapped").await;
}

/// An instance that cannot even be created (here: the component's initial memory is over
/// `maxMemoryBytes`) is a plugin fault like a trap: NACKed with the reason, retried
/// `maxNackRetries` times, dead-lettered, and the next message gets its turn (it used to be retried
/// forever as if a consumer were down).
#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_that_cannot_be_instantiated_dead_letters_instead_of_retrying_forever() {
    let tmp = tempfile::tempdir().unwrap();
    deploy_plugin(tmp.path(), &plugin_wasm("testbed", None), "testbed.wasm");
    write_dispatchers(
        tmp.path(),
        &json!([plugin_dispatcher(
            "tb",
            "tiny",
            "testbed.wasm",
            json!({"maxNackRetries": 1, "plugin": {"maxMemoryBytes": 65536}})
        )]),
    );
    let broker = Broker::start(tmp.path()).await;
    broker.produce("tiny", json!({"n": 0})).await;
    broker.produce("tiny", json!({"n": 1})).await;
    let dlq = broker.pull_until("__dlq.tb", 2).await;
    for (offset, d) in dlq.iter().enumerate() {
        let reason = d["content"]["reason"].as_str().unwrap();
        assert!(
            reason.contains("cannot be instantiated") && reason.contains("memory limit of 65536"),
            "{reason}"
        );
        assert_eq!(d["content"]["attempts"], 2, "{d}");
        assert_eq!(d["content"]["envelope"]["offset"], offset as u64, "{d}");
    }
    let s = broker
        .dispatcher_when("tb", |s| s["deadLettered"] == 2)
        .await;
    assert_eq!(s["topics"][0]["retries"], 0, "no backoff retries: {s}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_log_flood_is_rate_limited_and_the_message_still_handled() {
    let tmp = tempfile::tempdir().unwrap();
    deploy_plugin(tmp.path(), &plugin_wasm("testbed", None), "testbed.wasm");
    write_dispatchers(
        tmp.path(),
        &json!([plugin_dispatcher("tb", "f", "testbed.wasm", json!({}))]),
    );
    let broker = Broker::start(tmp.path()).await;
    broker.produce("f", json!({"do": "flood"})).await;
    broker.produce("f", json!({"after": 1})).await;
    // The next message's own log line may itself be dropped: the budget is spent. Status tells.
    let deadline = Instant::now() + WAIT;
    while broker.dispatcher("tb").await["delivered"] != 2 {
        assert!(Instant::now() < deadline, "both messages handled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = broker.log.lock().clone();
    let kept = log
        .lines()
        .filter(|l| l.contains("flood line") && l.contains("consumer_id=\"tb\""))
        .count();
    assert!(
        kept > 100 && kept < 10_000,
        "{kept} of 10,000 flood lines reached the log"
    );
    assert!(
        log.contains("plugin logged too fast; lines were dropped"),
        "the drop is reported"
    );
}

/// The misbehaving-guest table under load: producers keep writing while one plugin's messages
/// loop, sleep in the host, exhaust memory, overflow the stack, panic, flood the log and pass an
/// 8 MiB string to a host call. That plugin NACKs exactly its traps (and dead-letters them with
/// the right reason); an HTTP consumer and a well-behaved plugin on the same topic get every
/// message in order; the broker stays healthy.
#[tokio::test(flavor = "multi_thread")]
async fn the_misbehaving_guest_table_under_load_affects_only_that_plugin() {
    let tmp = tempfile::tempdir().unwrap();
    deploy_plugin(tmp.path(), &plugin_wasm("testbed", None), "testbed.wasm");
    deploy_plugin(
        tmp.path(),
        &plugin_wasm("testbed", Some("calm")),
        "calm.wasm",
    );
    let http = Consumer::start().await;
    write_dispatchers(
        tmp.path(),
        &json!([
            plugin_dispatcher(
                "bad",
                "load.*",
                "testbed.wasm",
                json!({"maxNackRetries": 0, "plugin": {"timeoutMs": 300, "maxMemoryBytes": 33554432}})
            ),
            plugin_dispatcher("good", "load.*", "calm.wasm", json!({})),
            host_dispatcher("http", "load.*", http.port),
        ]),
    );
    let broker = Broker::start(tmp.path()).await;
    let table = [
        ("loop", Some("timed out after 300 ms")),
        ("sleep", Some("timed out after 300 ms")),
        ("alloc", Some("memory limit of 33554432 bytes exceeded")),
        ("stack", Some("trapped")),
        ("panic", Some("trapped")),
        ("flood", None),
        ("biglog", None),
    ];
    // Four producers, 60 messages each over two topics; every tenth message misbehaves.
    let mut producers = Vec::new();
    for p in 0..4u64 {
        let url = broker.url.clone();
        producers.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut sent = Vec::new();
            for i in 0..60u64 {
                let topic = if i % 2 == 0 { "load.a" } else { "load.b" };
                let content = if i % 10 == 9 {
                    json!({"do": table[((p + i / 10) % 7) as usize].0, "p": p, "i": i})
                } else {
                    json!({"p": p, "i": i})
                };
                let r = http
                    .post(format!("{url}/mmmq/messages"))
                    .json(&json!({"topic": topic, "content": content}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                sent.push(content);
            }
            sent
        }));
    }
    let mut sent = Vec::new();
    for p in producers {
        sent.extend(p.await.unwrap());
    }
    let traps: Vec<&Value> = sent
        .iter()
        .filter(|c| {
            c["do"]
                .as_str()
                .is_some_and(|d| table.iter().any(|(a, r)| *a == d && r.is_some()))
        })
        .collect();
    // The HTTP consumer: everything, in order per topic.
    http.wait_for(240, WAIT).await;
    for topic in ["load.a", "load.b"] {
        let offsets: Vec<u64> = http
            .of_topic(topic)
            .iter()
            .map(|e| e["offset"].as_u64().unwrap())
            .collect();
        assert_eq!(offsets, (0..120).collect::<Vec<_>>(), "{topic}");
    }
    // The misbehaving plugin dead-letters exactly its traps, each with its reason.
    let dlq = broker.pull_until("__dlq.bad", traps.len()).await;
    assert_eq!(dlq.len(), traps.len());
    for d in &dlq {
        let content = &d["content"]["envelope"]["content"];
        let action = content["do"].as_str().unwrap();
        let want = table.iter().find(|(a, _)| *a == action).unwrap().1;
        let reason = d["content"]["reason"].as_str().unwrap();
        assert!(
            want.is_some_and(|w| reason.to_lowercase().contains(w)),
            "{action}: {reason}"
        );
    }
    // Both plugins get to the end of both topics.
    for id in ["bad", "good"] {
        eventually(WAIT, "both plugins at the end", || {
            ["load.a", "load.b"]
                .iter()
                .all(|t| {
                    std::fs::read(
                        tmp.path()
                            .join(format!("topics/{t}/checkpoints/{id}.checkpoint")),
                    )
                    .is_ok_and(|raw| raw == 120u64.to_be_bytes())
                })
                .then_some(())
        })
        .await;
    }
    let good = broker.dispatcher("good").await;
    assert_eq!(good["delivered"], json!(240), "{good}");
    assert_eq!(good["deadLettered"], json!(0), "{good}");
    // The well-behaved plugin saw each topic whole and in order (its instance NACKs any message
    // that does not follow the one before, which would have dead-lettered it).
    let (status, _) = broker.get("/mmmq/topics/__dlq.good/messages").await;
    assert_eq!(status, 404, "no dead letters for the good plugin");
    let calm = eventually(WAIT, "the good plugin's log lines", || {
        let calm: Vec<Handled> = broker
            .handled()
            .into_iter()
            .filter(|h| h.version == "calm")
            .collect();
        (calm.len() >= 240).then_some(calm)
    })
    .await;
    for topic in ["load.a", "load.b"] {
        let offsets: Vec<u64> = calm
            .iter()
            .filter(|h| h.topic == topic)
            .map(|h| h.offset)
            .collect();
        assert_eq!(offsets, (0..120).collect::<Vec<_>>(), "{topic}");
    }
    let bad = broker.dispatcher("bad").await;
    assert_eq!(bad["deadLettered"], json!(traps.len()), "{bad}");
    assert_eq!(broker.get("/healthz").await.0, 200);
    // The 8 MiB log line was cut, not printed.
    assert!(
        broker.log.lock().lines().all(|l| l.len() < 64 * 1024),
        "a huge guest log line reached the broker's log"
    );
}
