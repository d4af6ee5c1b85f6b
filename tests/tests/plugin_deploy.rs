//! Deploying plugins (docs/plugins.md, "Deploying plugins by API"): `PUT /mmmq/plugins/{name}`, list, rollback and
//! activate, a dispatcher naming the plugin following its current version under continuous
//! produce (every message handled once, in order, by one version), bad deploys refused with the
//! reason while the current version keeps serving, and at least 10 versions kept.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mmmq_tests::{Broker, eventually, plugin_wasm, wasm_variant, write_dispatchers};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread")]
async fn deploy_rollback_and_activate_switch_versions_under_continuous_produce() {
    let tmp = tempfile::tempdir().unwrap();
    let v1 = std::fs::read(plugin_wasm("testbed", None)).unwrap();
    let v2 = std::fs::read(plugin_wasm("testbed", Some("v2"))).unwrap();
    write_dispatchers(
        tmp.path(),
        &json!([{"consumerId": "d", "pattern": "dep", "plugin": {"name": "tb"}}]),
    );
    let broker = Broker::start(tmp.path()).await;
    // Produced before any deploy: it waits for a version, which is not reported as an error.
    broker.produce("dep", json!({"n": "early"})).await;
    let waiting = broker
        .dispatcher_when("d", |s| s["lastError"].is_string())
        .await;
    assert_eq!(waiting["target"]["awaitingDeploy"], true, "{waiting}");
    assert_eq!(waiting["target"]["loadError"], Value::Null, "{waiting}");
    assert!(
        waiting["lastError"]
            .as_str()
            .unwrap()
            .contains("no deployed version yet (mmmq plugin deploy --name tb)"),
        "{waiting}"
    );
    let (code, reload) = broker.post("/mmmq/admin/reload", &json!({})).await;
    assert_eq!(code, 200, "{reload}");
    assert_eq!(reload["awaitingDeploy"], json!(["d"]), "{reload}");
    assert_eq!(reload["reloadErrors"], json!([]), "{reload}");
    let listed = broker.cli_ok(["dispatchers"]);
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains("(awaiting a first deploy)"),
        "{listed:?}"
    );

    let (code, first) = broker.deploy_wasm("tb", v1.clone()).await;
    assert_eq!(code, 200, "{first}");
    assert_eq!(first["name"], "tb");
    assert_eq!(first["world"], "mmmq:plugin/handler@0.2.0");
    let v1_version = first["version"].as_str().unwrap().to_owned();
    let serving = broker.dispatcher("d").await;
    assert_eq!(
        serving["target"]["awaitingDeploy"],
        Value::Null,
        "{serving}"
    );
    // The message that waited for a version is served by the first deploy at once, not after the
    // dispatcher's retries have backed off.
    let waited = Instant::now();
    broker.dispatcher_when("d", |s| s["delivered"] == 1).await;
    assert!(
        waited.elapsed() < Duration::from_secs(2),
        "the first deploy served after {:?}",
        waited.elapsed()
    );
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (url, stop) = (broker.url.clone(), stop.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let r = http
                    .post(format!("{url}/mmmq/messages"))
                    .json(&json!({"topic": "dep", "content": {"n": n}}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                n += 1;
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            n
        })
    };
    let steps: [(&str, &str); 3] = [("deploy", "v2"), ("rollback", "v1"), ("activate", "v2")];
    let mut switched_at = Vec::new();
    for (what, expect) in steps {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let started = Instant::now();
        let (code, answer) = match what {
            "deploy" => broker.deploy_wasm("tb", v2.clone()).await,
            "rollback" => broker.post("/mmmq/plugins/tb/rollback", &json!({})).await,
            _ => {
                let v2_version = switched_at
                    .first()
                    .map(|(_, v): &(u64, String)| v.clone())
                    .unwrap();
                broker
                    .post(
                        &format!("/mmmq/plugins/tb/versions/{v2_version}/activate"),
                        &json!({}),
                    )
                    .await
            }
        };
        assert_eq!(code, 200, "{what}: {answer}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{what} took {:?}",
            started.elapsed()
        );
        let version = answer["version"].as_str().unwrap().to_owned();
        // The next message produced is handled by the new version.
        let offset = broker.produce("dep", json!({"marker": what})).await;
        let handled = eventually(WAIT, "the marker", || {
            broker
                .handled()
                .into_iter()
                .find(|h| h.topic == "dep" && h.offset == offset)
        })
        .await;
        assert_eq!(
            handled.version, expect,
            "{what}: offset {offset} {handled:?}"
        );
        switched_at.push((offset, version));
    }
    stop.store(true, Ordering::Relaxed);
    let produced = producer.await.unwrap();
    let total = produced + 1 + 3;
    broker
        .dispatcher_when("d", |s| {
            s["delivered"].as_u64() == Some(total) && s["lag"] == 0
        })
        .await;
    // Every message once, in offset order, and the version changes only where the API said.
    let handled: Vec<_> = broker
        .handled()
        .into_iter()
        .filter(|h| h.topic == "dep")
        .collect();
    let offsets: Vec<u64> = handled.iter().map(|h| h.offset).collect();
    assert_eq!(offsets, (0..total).collect::<Vec<_>>());
    let changes: Vec<u64> = handled
        .windows(2)
        .filter(|w| w[0].version != w[1].version)
        .map(|w| w[1].offset)
        .collect();
    assert_eq!(changes.len(), 3, "{changes:?}");
    for (change, (marker, _)) in changes.iter().zip(&switched_at) {
        assert!(
            change <= marker,
            "switched at {change}, after the marker {marker}"
        );
    }

    // The list: the current version, both kept, and who uses it.
    let (code, list) = broker.get("/mmmq/plugins").await;
    assert_eq!(code, 200);
    assert_eq!(list[0]["name"], "tb");
    assert_eq!(list[0]["current"], json!(switched_at[2].1));
    assert_eq!(list[0]["usedBy"], json!(["d"]));
    let kept: Vec<&str> = list[0]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_str().unwrap())
        .collect();
    assert_eq!(kept, [v1_version.as_str(), switched_at[0].1.as_str()]);
    assert_eq!(list[0]["versions"][0]["bytes"], json!(v1.len()));
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_deploys_are_refused_and_ten_versions_are_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let good = std::fs::read(plugin_wasm("testbed", None)).unwrap();
    let not_a_handler = std::fs::read(plugin_wasm("notahandler", None)).unwrap();
    write_dispatchers(
        tmp.path(),
        &json!([{"consumerId": "k", "pattern": "keep", "plugin": {"name": "tb"}}]),
    );
    let broker = Broker::start(tmp.path()).await;
    let (code, _) = broker.deploy_wasm("tb", good.clone()).await;
    assert_eq!(code, 200);
    let current = |list: &Value| list[0]["current"].clone();
    let before = current(&broker.get("/mmmq/plugins").await.1);
    let refusals = [
        (
            broker.deploy_wasm("tb", b"not wasm at all".to_vec()).await,
            "not a WebAssembly component (bad magic)",
        ),
        (
            broker.deploy_wasm("tb", not_a_handler).await,
            "does not implement",
        ),
        (
            broker.deploy_wasm("tb", Vec::new()).await,
            "the body must be the component",
        ),
        (
            broker.deploy_wasm("..x", good.clone()).await,
            "bad plugin name",
        ),
        (
            broker.post("/mmmq/plugins/nope/rollback", &json!({})).await,
            "no plugin named",
        ),
        (
            broker.post("/mmmq/plugins/tb/rollback", &json!({})).await,
            "no version before",
        ),
        (
            broker
                .post(
                    "/mmmq/plugins/tb/versions/0123456789abcdef/activate",
                    &json!({}),
                )
                .await,
            "has no version",
        ),
    ];
    for ((code, body), why) in refusals {
        assert!(code == 400 || code == 404, "{code} {body}");
        assert!(
            body["error"].as_str().unwrap_or("").contains(why),
            "{body} (want {why:?})"
        );
    }
    // A refusal given before the upload was read says the connection closes (hyper closes it
    // after such an answer; a client not told may send its next request on it and lose it), as
    // does a refusal before any route of a request with a body.
    let upload = "x".repeat(300_000);
    for (path, content_type, want) in [
        ("/mmmq/plugins/..x", "application/wasm", 400),
        ("/mmmq/plugins/tb", "text/plain", 415),
    ] {
        let (code, headers, body) = broker
            .send("PUT", path, &[], Some((&upload, Some(content_type))))
            .await;
        assert_eq!(code, want, "{path}: {body}");
        assert_eq!(headers["connection"], "close", "{path}");
    }
    // Too large is 413, as for any body.
    let (code, body) = broker.deploy_wasm("tb", vec![0; (64 << 20) + 1]).await;
    assert_eq!(code, 413, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("67108864"),
        "{body}"
    );
    assert_eq!(current(&broker.get("/mmmq/plugins").await.1), before);
    broker.produce("keep", json!({"n": 1})).await;
    broker.dispatcher_when("k", |s| s["delivered"] == 1).await;

    // Twelve more versions through the CLI: the last ten (the current one among them) are kept.
    let dir = tempfile::tempdir().unwrap();
    for n in 0..12u8 {
        let file = dir.path().join(format!("v{n}.wasm"));
        std::fs::write(&file, wasm_variant(&good, n)).unwrap();
        let out = broker.cli([
            "plugin".as_ref(),
            "deploy".as_ref(),
            file.as_os_str(),
            "--name".as_ref(),
            "tb".as_ref(),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).starts_with("tb is now at "));
    }
    let (_, list) = broker.get("/mmmq/plugins").await;
    let versions = list[0]["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 10, "{list}");
    assert_eq!(versions[9]["version"], list[0]["current"]);
    let files = std::fs::read_dir(tmp.path().join("plugins/tb"))
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name().into_string().unwrap();
            name.ends_with(".wasm") && name != "current.wasm"
        })
        .count();
    assert_eq!(files, 10);
    let out = broker.cli(["plugin", "rollback", "tb"]);
    assert!(out.status.success());
    let (_, after) = broker.get("/mmmq/plugins").await;
    assert_eq!(after[0]["current"], versions[8]["version"]);
    let out = broker.cli(["plugin", "list"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("*{}", versions[8]["version"].as_str().unwrap())),
        "{text}"
    );
    // A restart keeps the current version.
    drop(broker);
    let broker = Broker::start(tmp.path()).await;
    let (_, again) = broker.get("/mmmq/plugins").await;
    assert_eq!(again[0]["current"], versions[8]["version"]);
    broker.produce("keep", json!({"n": 2})).await;
    let s = broker
        .dispatcher_when("k", |s| s["delivered"] == 1 && s["lag"] == 0)
        .await;
    assert_eq!(s["target"]["version"], versions[8]["version"], "{s}");
}

/// A shadow version runs after the current one on every message: its verdicts are compared and
/// counted, its emits never appear, its faults do not touch the message, and the first
/// disagreements are logged with their offsets.
#[tokio::test(flavor = "multi_thread")]
async fn a_shadow_version_is_compared_and_has_no_side_effects() {
    let tmp = tempfile::tempdir().unwrap();
    let calm = std::fs::read(plugin_wasm("testbed", Some("calm"))).unwrap();
    let strict = std::fs::read(plugin_wasm("testbed", None)).unwrap();
    write_dispatchers(tmp.path(), &json!([]));
    let broker = Broker::start(tmp.path()).await;
    let (_, shadow) = broker.deploy_wasm("tb", strict).await;
    let (code, _) = broker.deploy_wasm("tb", calm).await;
    assert_eq!(code, 200);
    let shadow_version = shadow["version"].as_str().unwrap().to_owned();
    write_dispatchers(
        tmp.path(),
        &json!([{"consumerId": "s", "pattern": "shadowed", "maxNackRetries": 0,
                 "plugin": {"name": "tb", "shadow": shadow_version}}]),
    );
    let (code, body) = broker.post("/mmmq/admin/reload", &json!({})).await;
    assert_eq!(code, 200, "{body}");
    for m in [
        json!({"n": 1}),
        json!({"do": "nack"}),
        json!({"n": 2}),
        json!({"do": "emit", "to": "shadow-out"}),
        json!({"do": "panic"}),
        json!({"n": 3}),
    ] {
        broker.produce("shadowed", m).await;
    }
    let s = broker
        .dispatcher_when("s", |s| {
            s["target"]["shadow"]["compared"] == 6 && s["lag"] == 0 && s["delivered"] == 6
        })
        .await;
    assert_eq!(s["delivered"], 6, "the current version decides: {s}");
    assert_eq!(s["deadLettered"], 0, "{s}");
    assert_eq!(
        s["target"]["shadow"],
        json!({"version": shadow_version, "compared": 6, "agreed": 4, "disagreed": 1, "faults": 1}),
        "{s}"
    );
    assert_eq!(s["target"]["name"], "tb");
    let (code, _) = broker.get("/mmmq/topics/shadow-out/messages").await;
    assert_eq!(code, 404, "the shadow's emit was appended");
    let line = eventually(WAIT, "the disagreement", || {
        broker
            .log
            .lock()
            .lines()
            .find(|l| l.contains("the shadow version disagrees"))
            .map(str::to_owned)
    })
    .await;
    assert!(line.contains("offset=1"), "{line}");
}
