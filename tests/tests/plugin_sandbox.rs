//! What a plugin, or a `plugin` entry of `dispatchers.json`, must not reach (docs/plugins.md,
//! "WebAssembly handlers" and "Dispatchers"): a plugin's log text cannot forge or recolour the broker's own log
//! lines, and `plugin.path` cannot name a file outside the root dir.

use std::time::Duration;

use mmmq_tests::{
    Broker, deploy_plugin, eventually, plugin_dispatcher, plugin_wasm, spawn_serve, testbed_root,
    write_dispatchers,
};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

/// A log line with a newline, a carriage return, a tab, an ANSI colour (ESC), C1 controls (CSI,
/// NEL) and a Unicode line separator: one escaped line in the broker's log and in `mmmq plugin
/// logs`, the exact text in `__logs.<consumerId>` (JSON escapes it there).
#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_cannot_forge_broker_log_lines() {
    let text = "said\n2030-01-01T00:00:00.000000Z  INFO mmmq: forged\r\x1b[31mred\u{9b}0m\u{85}nel\ttab\u{2028}end";
    let escaped = r"said\n2030-01-01T00:00:00.000000Z  INFO mmmq: forged\r\u{1b}[31mred\u{9b}0m\u{85}nel\ttab\u{2028}end";
    let tmp = tempfile::tempdir().unwrap();
    testbed_root(tmp.path(), "lg", "said", json!({}));
    let broker = Broker::start(tmp.path()).await;
    broker
        .produce("said", json!({"do": "say", "text": text}))
        .await;

    let lines = broker.pull_until("__logs.lg", 2).await;
    assert_eq!(lines[1]["content"]["message"], text, "{lines:?}");
    let line = eventually(WAIT, "the said line in the broker's log", || {
        broker
            .log
            .lock()
            .lines()
            .find(|l| l.contains("guest_log: said"))
            .map(str::to_owned)
    })
    .await;
    assert!(line.contains(escaped), "{line}");
    assert!(line.contains("consumer_id=\"lg\""), "{line}");
    let log = broker.log.lock().clone();
    assert!(
        !log.lines().any(|l| l.starts_with("2030-01-01")),
        "a forged line: {log}"
    );
    assert!(
        !log.chars()
            .any(|c| c != '\n' && (c.is_control() || c == '\u{2028}')),
        "a control character reached the log: {log:?}"
    );

    let out = broker.cli(["plugin", "logs", "lg"]);
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{printed}");
    assert_eq!(
        printed.lines().nth(1),
        Some(&*format!(
            "INFO  said/0@0 ({}): {escaped}",
            lines[1]["content"]["version"].as_str().unwrap()
        )),
        "{printed}"
    );
}

/// `plugin.path` is relative to the root dir and stays inside it: an absolute path or a `..` is
/// refused naming the entry, at start (the broker does not start) and at a reload (the running
/// configuration stays). A path inside the root dir with `..` in a file name is fine.
#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_path_outside_the_root_dir_is_refused() {
    let outside =
        |path: &str| json!([{"consumerId": "esc", "pattern": "x", "plugin": {"path": path}}]);
    for path in [
        "/etc/hostname",
        "../outside.wasm",
        "plugins/../../outside.wasm",
    ] {
        let tmp = tempfile::tempdir().unwrap();
        write_dispatchers(tmp.path(), &outside(path));
        let (mut child, listening, log) = spawn_serve(tmp.path(), &[]);
        if listening.is_some() {
            child.kill().unwrap();
        }
        let status = child.wait().unwrap();
        let stderr = log.lock().clone();
        assert!(
            listening.is_none() && !status.success(),
            "{path}: serve started: {stderr}"
        );
        assert!(
            stderr.contains(&format!(
                "entry 0 (consumerId \"esc\"): `plugin.path` {path:?} is outside the root dir"
            )),
            "{path}: {stderr}"
        );
    }

    let tmp = tempfile::tempdir().unwrap();
    deploy_plugin(tmp.path(), &plugin_wasm("testbed", None), "a..b.wasm");
    write_dispatchers(
        tmp.path(),
        &json!([plugin_dispatcher("esc", "x", "a..b.wasm", json!({}))]),
    );
    let broker = Broker::start(tmp.path()).await;
    broker.produce("x", json!({"n": 0})).await;
    broker.dispatcher_when("esc", |s| s["delivered"] == 1).await;
    write_dispatchers(tmp.path(), &outside("/etc/hostname"));
    let (status, body) = broker.post("/mmmq/admin/reload", &json!({})).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.to_string()
            .contains(r#"`plugin.path` \"/etc/hostname\" is outside the root dir"#),
        "{body}"
    );
    let s = broker.dispatcher("esc").await;
    assert!(
        s["target"]["path"].as_str().unwrap().ends_with("a..b.wasm"),
        "the running configuration stays: {s}"
    );
}
