//! Replay (docs/plugins.md, "Replay"): `mmmq plugin replay` runs the version of a plugin that handled a
//! stored message on it, offline, with the dispatcher's config, and prints the verdict, the emits,
//! the log lines and a fault's WebAssembly backtrace — the version found from the record the
//! dispatcher keeps, across a deploy and a restart, while the broker runs on the same directory,
//! and run from the plugin store or, for a `plugin.path` dispatcher, from the versions it kept as
//! it loaded them.

use std::time::Duration;

use mmmq_tests::{Broker, deploy_plugin, eventually, plugin_wasm, testbed_root, write_dispatchers};
use serde_json::{Value, json};

async fn deploy(broker: &Broker, bytes: Vec<u8>) -> String {
    let (code, body) = broker.deploy_wasm("tb", bytes).await;
    assert_eq!(code, 200, "{body}");
    body["version"].as_str().unwrap().to_owned()
}

/// Runs `mmmq plugin replay` on `root` with `args`: exit code and stdout (stderr on failure).
fn replay(broker: &Broker, root: &std::path::Path, args: &[&str]) -> (i32, String) {
    let mut all = vec!["plugin", "replay", "--root-dir", root.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = broker.cli(all);
    let code = out.status.code().unwrap_or(-1);
    let text = if code == 2 {
        String::from_utf8_lossy(&out.stderr).into_owned()
    } else {
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    (code, text)
}

#[tokio::test(flavor = "multi_thread")]
async fn replay_runs_the_version_that_handled_a_message_and_reproduces_a_trap() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let v1 = std::fs::read(plugin_wasm("testbed", None)).unwrap();
    let v2 = std::fs::read(plugin_wasm("testbed", Some("v2"))).unwrap();
    write_dispatchers(
        root,
        &json!([{"consumerId": "r", "pattern": "rep", "maxNackRetries": 0, "maxInFlight": 2,
                 "plugin": {"name": "tb", "config": {"k": "from-config"}}}]),
    );
    let broker = Broker::start(root).await;
    let v1_version = deploy(&broker, v1).await;
    broker.produce("rep", json!({"n": 0})).await;
    broker.produce("rep", json!({"do": "panic"})).await;
    broker
        .dispatcher_when("r", |s| s["delivered"] == 1 && s["deadLettered"] == 1)
        .await;
    let v2_version = deploy(&broker, v2).await;
    broker
        .produce("rep", json!({"do": "emit", "to": "out", "n": 2}))
        .await;
    broker
        .produce("rep", json!({"do": "config", "key": "k"}))
        .await;
    broker
        .dispatcher_when("r", |s| s["delivered"] == 3 && s["lag"] == 0)
        .await;
    let ck = &["--consumer", "r", "--topic", "rep", "--offset"];
    let at = |offset: &'static str| {
        let mut a = ck.to_vec();
        a.push(offset);
        a
    };

    // The trap, on the version that handled it (v1, though v2 is current), with its backtrace.
    let (code, out) = replay(&broker, root, &at("1"));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "version  {v1_version} (the version that handled it"
        )),
        "{out}"
    );
    assert!(out.contains("testbed was told to panic"), "{out}");
    assert!(out.contains("wasm backtrace"), "{out}");
    assert!(
        out.contains("testbed::"),
        "names the guest's functions: {out}"
    );
    assert!(out.contains("testbed version=v1 "), "{out}");

    // The same message on another version, asked for.
    let (code, out) = replay(
        &broker,
        root,
        &[at("1"), vec!["--version", &v2_version]].concat(),
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("version  {v2_version} (asked for")),
        "{out}"
    );
    assert!(out.contains("testbed version=v2 "), "{out}");

    // A handled message: its verdict and emits (shown, not appended) and the dispatcher's config.
    let (code, out) = replay(&broker, root, &at("2"));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&format!("version  {v2_version}")), "{out}");
    assert!(out.contains("verdict  ack"), "{out}");
    assert!(out.contains("emits    2"), "{out}");
    assert!(out.contains(r#"-> out key=none {"from":2,"i":1}"#), "{out}");
    let (_, out) = replay(&broker, root, &at("3"));
    assert!(out.contains(r#"config k=Some("from-config")"#), "{out}");
    let (code, json_out) = replay(&broker, root, &[at("0"), vec!["--json"]].concat());
    assert_eq!(code, 0, "{json_out}");
    let j: Value = serde_json::from_str(&json_out).unwrap();
    assert_eq!(j["version"], v1_version.as_str());
    assert_eq!(j["versionFrom"], "recorded");
    assert_eq!(j["verdict"], "ack");
    // Nothing was appended by the replays: `out` has the two emits of the dispatcher's run.
    assert_eq!(broker.pull_all("out").await.len(), 2);

    // Bad requests say what is wrong.
    let (code, err) = replay(&broker, root, &at("9"));
    assert_eq!(code, 2);
    assert!(
        err.contains("no message at offset 9 of rep partition 0: it holds offsets 0 to 3"),
        "{err}"
    );
    let (code, err) = replay(
        &broker,
        root,
        &["--consumer", "nobody", "--topic", "rep", "--offset", "0"],
    );
    assert_eq!(code, 2);
    assert!(err.contains(r#"no dispatcher "nobody""#), "{err}");
    let (code, err) = replay(
        &broker,
        root,
        &[at("0"), vec!["--version", "0123456789abcdef"]].concat(),
    );
    assert_eq!(code, 2);
    assert!(
        err.contains("does not keep version 0123456789abcdef"),
        "{err}"
    );
    assert!(err.contains(&v1_version), "lists the kept versions: {err}");

    // After a restart (v2 current), a message handled before it is still v1's, a new one v2's.
    broker.terminate();
    let broker = Broker::start(root).await;
    broker.produce("rep", json!({"n": 4})).await;
    broker
        .dispatcher_when("r", |s| s["delivered"] == 1 && s["lag"] == 0)
        .await;
    let (_, out) = replay(&broker, root, &at("0"));
    assert!(out.contains(&format!("version  {v1_version}")), "{out}");
    let (_, out) = replay(&broker, root, &at("4"));
    assert!(out.contains(&format!("version  {v2_version}")), "{out}");
    let record = eventually(Duration::from_secs(5), "the record", || {
        std::fs::read_to_string(root.join("topics/rep/checkpoints/r.handlers")).ok()
    })
    .await;
    assert_eq!(
        record.lines().filter(|l| l.contains("\"session\"")).count(),
        2,
        "one session per start: {record}"
    );
}

/// A `plugin.path` dispatcher keeps every version it loads before the version handles anything
/// (docs/plugins.md, "Replay"): once its file is replaced (a hot reload), a message the old file handled is
/// still replayed on the old version, from `plugins/.path/{consumerId}/`.
#[tokio::test(flavor = "multi_thread")]
async fn replay_of_a_path_plugin_runs_the_old_version_after_the_file_was_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    testbed_root(root, "r", "rep", json!({}));
    let broker = Broker::start(root).await;
    let version = |s: &Value| s["target"]["version"].as_str().unwrap().to_owned();
    broker.produce("rep", json!({"n": 0})).await;
    let v1 = version(&broker.dispatcher_when("r", |s| s["delivered"] == 1).await);
    deploy_plugin(root, &plugin_wasm("testbed", Some("v2")), "testbed.wasm");
    let v2 = version(
        &broker
            .dispatcher_when("r", |s| s["target"]["version"].as_str() != Some(&v1))
            .await,
    );
    broker.produce("rep", json!({"n": 1})).await;
    broker.dispatcher_when("r", |s| s["delivered"] == 2).await;
    let at = |offset: &'static str| ["--consumer", "r", "--topic", "rep", "--offset", offset];

    let (code, out) = replay(&broker, root, &at("0"));
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("version  {v1} (the version that handled it")),
        "{out}"
    );
    assert!(
        out.contains("testbed version=v1 topic=rep offset=0 "),
        "{out}"
    );
    let (code, out) = replay(&broker, root, &at("1"));
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("version  {v2} (the version")),
        "{out}"
    );
    assert!(
        out.contains("testbed version=v2 topic=rep offset=1 "),
        "{out}"
    );

    // Content-addressed, where docs/plugins.md ("Replay") says.
    let kept = root.join("plugins/.path/r");
    assert_eq!(
        std::fs::read(kept.join(format!("{v1}.wasm"))).unwrap(),
        std::fs::read(plugin_wasm("testbed", None)).unwrap()
    );
    assert!(kept.join(format!("{v2}.wasm")).is_file());
    // A version it never loaded: what it keeps is listed.
    let (code, err) = replay(
        &broker,
        root,
        &[&at("0")[..], &["--version", "0123456789abcdef"]].concat(),
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(r#"dispatcher "r" does not keep version 0123456789abcdef (kept: "#),
        "{err}"
    );
    assert!(err.contains(&v1) && err.contains(&v2), "{err}");
}
