//! The `mmmq:plugin@0.2.0` world end to end (docs/plugins.md, "WebAssembly handlers"): a 0.1.0 component
//! keeps working next to a 0.2.0 one; `retry-after` and `dead-letter` verdicts; the message's
//! attempt; `plugin.config` through `get-config`.

use std::time::{Duration, Instant};

use mmmq_tests::{
    Broker, deploy_plugin, eventually, plugin_dispatcher, plugin_wasm, write_dispatchers,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

/// A component built against the 0.1.0 WIT (not with the SDK, which builds 0.2.0) and the 0.2.0
/// testbed on the same topic: both handle every message, and status names each one's world.
#[tokio::test(flavor = "multi_thread")]
async fn a_0_1_0_plugin_keeps_working_next_to_a_0_2_0_one() {
    let tmp = tempfile::tempdir().unwrap();
    deploy_plugin(tmp.path(), &plugin_wasm("legacy-v1", None), "legacy.wasm");
    deploy_plugin(tmp.path(), &plugin_wasm("testbed", None), "testbed.wasm");
    write_dispatchers(
        tmp.path(),
        &json!([
            plugin_dispatcher("old", "both", "legacy.wasm", json!({})),
            plugin_dispatcher("new", "both", "testbed.wasm", json!({}))
        ]),
    );
    let broker = Broker::start(tmp.path()).await;
    for n in 0..5 {
        broker.produce("both", json!({"n": n})).await;
    }
    broker.produce("both", json!({"nack": true})).await;
    let old = broker
        .dispatcher_when("old", |s| s["deadLettered"] == 1 && s["lag"] == 0)
        .await;
    assert_eq!(old["delivered"], 5, "{old}");
    assert_eq!(old["target"]["world"], "mmmq:plugin/handler@0.1.0", "{old}");
    let new = broker.dispatcher_when("new", |s| s["delivered"] == 6).await;
    assert_eq!(new["target"]["world"], "mmmq:plugin/handler@0.2.0", "{new}");
    let lines = eventually(WAIT, "the legacy plugin's lines", || {
        let log = broker.log.lock().clone();
        let n = log.matches("legacy topic=both offset=").count();
        (n >= 6).then_some(n)
    })
    .await;
    // Five ACKed once each; the NACKed one sent 1 + maxNackRetries (3) times.
    assert_eq!(lines, 5 + 4);
}

/// `retry-after(ms)` resends after the wait with the attempt counted, and is not a NACK;
/// `dead-letter(reason)` goes straight to the dead-letter topic, sent once.
#[tokio::test(flavor = "multi_thread")]
async fn retry_after_waits_and_counts_attempts_and_dead_letter_goes_straight() {
    let tmp = tempfile::tempdir().unwrap();
    deploy_plugin(tmp.path(), &plugin_wasm("testbed", None), "testbed.wasm");
    write_dispatchers(
        tmp.path(),
        &json!([plugin_dispatcher(
            "v",
            "verdicts",
            "testbed.wasm",
            json!({"maxNackRetries": 1})
        )]),
    );
    let broker = Broker::start(tmp.path()).await;
    let started = Instant::now();
    broker
        .produce("verdicts", json!({"do": "retry", "ms": 300, "until": 4}))
        .await;
    broker
        .produce(
            "verdicts",
            json!({"do": "deadletter", "reason": "not for us"}),
        )
        .await;
    let s = broker
        .dispatcher_when("v", |s| s["delivered"] == 1 && s["deadLettered"] == 1)
        .await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "three waits of 300 ms, done in {took:?}"
    );
    assert_eq!(
        (&s["nacked"], &s["topics"][0]["retries"]),
        (&json!(0), &json!(0)),
        "{s}"
    );
    let attempts: Vec<(u64, u32)> = broker
        .handled()
        .iter()
        .map(|h| (h.offset, h.attempt))
        .collect();
    assert_eq!(attempts, [(0, 1), (0, 2), (0, 3), (0, 4), (1, 1)]);
    let dlq = broker.pull_all("__dlq.v").await;
    assert_eq!(dlq.len(), 1);
    assert_eq!(dlq[0]["content"]["reason"], "not for us");
    assert_eq!(dlq[0]["content"]["attempts"], 1);
    assert_eq!(dlq[0]["content"]["envelope"]["offset"], 1);
}

/// `plugin.config` is what `get-config` reads; a key it does not have is `none`. A config of the
/// wrong shape refuses the file naming the field.
#[tokio::test(flavor = "multi_thread")]
async fn get_config_reads_the_dispatchers_plugin_config() {
    let tmp = tempfile::tempdir().unwrap();
    deploy_plugin(tmp.path(), &plugin_wasm("testbed", None), "testbed.wasm");
    let with_config = |config: Value| {
        json!([plugin_dispatcher(
            "c",
            "cfg",
            "testbed.wasm",
            json!({"plugin": {"config": config}})
        )])
    };
    write_dispatchers(
        tmp.path(),
        &with_config(json!({"greeting": "hello", "n": "7"})),
    );
    let broker = Broker::start(tmp.path()).await;
    broker
        .produce("cfg", json!({"do": "config", "key": "greeting"}))
        .await;
    broker
        .produce("cfg", json!({"do": "config", "key": "missing"}))
        .await;
    broker.dispatcher_when("c", |s| s["delivered"] == 2).await;
    eventually(WAIT, "the config lines", || {
        let log = broker.log.lock().clone();
        (log.contains(r#"config greeting=Some("hello")"#) && log.contains("config missing=None"))
            .then_some(())
    })
    .await;
    write_dispatchers(tmp.path(), &with_config(json!({"n": 7})));
    let (code, body) = broker.post("/mmmq/admin/reload", &json!({})).await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("plugin.config.n: invalid type: integer `7`, expected a string"),
        "{body}"
    );
    let s = broker.dispatcher("c").await;
    assert_eq!(s["delivered"], 2, "the old configuration stays: {s}");
}

/// What a plugin logs also goes to `__logs.<consumerId>`, each line with its level and the
/// message it was handling (topic, partition, offset) and the plugin version.
#[tokio::test(flavor = "multi_thread")]
async fn log_lines_go_to_the_logs_topic_with_their_message() {
    let tmp = tempfile::tempdir().unwrap();
    deploy_plugin(tmp.path(), &plugin_wasm("testbed", None), "testbed.wasm");
    write_dispatchers(
        tmp.path(),
        &json!([plugin_dispatcher("lg", "logged", "testbed.wasm", json!({}))]),
    );
    let broker = Broker::start(tmp.path()).await;
    for n in 0..3 {
        broker.produce("logged", json!({"n": n})).await;
    }
    let s = broker.dispatcher_when("lg", |s| s["delivered"] == 3).await;
    let version = s["target"]["version"].as_str().unwrap().to_owned();
    let lines = broker.pull_until("__logs.lg", 3).await;
    for (i, line) in lines.iter().enumerate() {
        let c = &line["content"];
        assert_eq!(
            (
                &c["level"],
                &c["topic"],
                &c["partition"],
                &c["offset"],
                &c["version"]
            ),
            (
                &json!("info"),
                &json!("logged"),
                &json!(0),
                &json!(i),
                &json!(version)
            ),
            "{line}"
        );
        assert!(
            c["message"]
                .as_str()
                .unwrap()
                .starts_with(&format!("testbed version=v1 topic=logged offset={i} ")),
            "{line}"
        );
    }
    // `mmmq plugin logs` prints them for people.
    let out = broker.cli(["plugin", "logs", "lg"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let first = text.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(&format!("INFO  logged/0@0 ({version}): testbed version=v1")),
        "{text}"
    );
    let out = broker.cli(["plugin", "logs", "nobody"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("has logged nothing yet"));
}

/// Only an `ack`ed call's emits are appended, each with its origin; a call that panics, NACKs or
/// times out after emitting leaves nothing behind, however often it is tried. An emit to a `__`
/// topic, to a bad name or of content that is not JSON is refused with the reason, which the
/// guest sees (the testbed logs it), and nothing is appended.
#[tokio::test(flavor = "multi_thread")]
async fn only_acked_calls_emit_and_bad_emits_are_refused_to_the_guest() {
    let tmp = tempfile::tempdir().unwrap();
    deploy_plugin(tmp.path(), &plugin_wasm("testbed", None), "testbed.wasm");
    write_dispatchers(
        tmp.path(),
        &json!([plugin_dispatcher(
            "em",
            "src",
            "testbed.wasm",
            json!({"maxNackRetries": 1, "plugin": {"timeoutMs": 300}})
        )]),
    );
    let broker = Broker::start(tmp.path()).await;
    let sends = [
        json!({"do": "emit", "to": "out", "n": 3}),
        json!({"do": "emit", "to": "out", "n": 2, "then": "panic"}),
        json!({"do": "emit", "to": "out", "then": "nack"}),
        json!({"do": "emit", "to": "out", "then": "loop"}),
        json!({"do": "emit", "to": "__dlq.em"}),
        json!({"do": "emit", "to": "no spaces"}),
        json!({"do": "emit", "to": "out", "raw": "{nope"}),
        json!({"do": "emit", "to": "out", "n": 1}),
    ];
    for m in &sends {
        broker.produce("src", m.clone()).await;
    }
    let s = broker
        .dispatcher_when("em", |s| s["lag"] == 0 && s["deadLettered"] == 3)
        .await;
    assert_eq!(s["delivered"], 5, "{s}");
    let out = broker.pull_all("out").await;
    let got: Vec<(u64, u64)> = out
        .iter()
        .map(|m| {
            (
                m["content"]["from"].as_u64().unwrap(),
                m["content"]["i"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, [(0, 0), (0, 1), (0, 2), (7, 0)], "{out:?}");
    let (_, src) = broker.get("/mmmq/topics/src").await;
    assert_eq!(
        out[1]["origin"],
        json!({"consumerId": "em", "topic": "src", "partition": 0, "offset": 0, "index": 1,
            "topicId": src["topicId"]})
    );
    let dlq = broker.pull_all("__dlq.em").await;
    assert_eq!(dlq.len(), 3, "only the dead letters: {dlq:?}");
    let refusals = eventually(WAIT, "the three refusals", || {
        let log = broker.log.lock().clone();
        let lines: Vec<String> = log
            .lines()
            .filter(|l| l.contains("emit refused: "))
            .map(str::to_owned)
            .collect();
        (lines.len() >= 3).then_some(lines)
    })
    .await;
    for (line, why) in refusals.iter().zip([
        "\"__dlq.em\" is internal",
        "no spaces",
        "content is not JSON",
    ]) {
        assert!(line.contains(why), "{line} (want {why:?})");
    }
    assert_eq!(broker.metric("mmmq_messages_emitted_total").await, 4.0);
}
