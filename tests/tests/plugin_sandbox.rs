//! What a `plugin` entry of `dispatchers.json` must not reach (README, "Dispatchers"):
//! `plugin.path` cannot name a file outside the root dir.

use mmmq_tests::{
    Broker, deploy_plugin, plugin_dispatcher, plugin_wasm, spawn_serve, write_dispatchers,
};
use serde_json::json;

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
