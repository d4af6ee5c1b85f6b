//! Configuration in a cluster (contract §13, "Metadata is replicated"; docs/cluster.md,
//! "Configuration in a cluster"): `dispatchers.json` reloaded through any broker reloads every
//! broker, a bad file changes nothing anywhere, a broker that was down or joins later runs the
//! cluster's; a plugin deployed through any broker is current on every broker within 2 s of the
//! deploy's answer, rollbacks and activations likewise, and a broker down during a deploy gets
//! it when it comes back. Real `mmmq serve` processes on 127.0.0.1.

use std::time::{Duration, Instant};

use mmmq_tests::Consumer;
use mmmq_tests::cluster::Cluster;
use mmmq_tests::{eventually_async, host_dispatcher, plugin_wasm, wasm_variant, write_dispatchers};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

/// The consumerIds broker `id` runs, sorted.
async fn configured(c: &Cluster, id: u64) -> Vec<String> {
    let (code, all) = c.broker(id).get("/mmmq/dispatchers").await;
    assert_eq!(code, 200, "{all}");
    let mut ids: Vec<String> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["consumerId"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

/// The consumerIds broker `id`'s own `dispatchers.json` names, sorted.
fn in_file(c: &Cluster, id: u64) -> Vec<String> {
    let file = std::fs::read_to_string(c.root(id).join("dispatchers.json")).unwrap();
    let file: Value = serde_json::from_str(&file).unwrap_or(Value::Null);
    let mut named: Vec<String> = file
        .as_array()
        .map(|a| {
            a.iter()
                .map(|d| d["consumerId"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default();
    named.sort();
    named
}

/// Waits until every running broker runs exactly `ids`, and its own `dispatchers.json` says so.
async fn everywhere(c: &Cluster, ids: &[&str]) {
    for b in c.running() {
        eventually_async(WAIT, &format!("broker {b} running {ids:?}"), || async {
            (configured(c, b).await == ids && in_file(c, b) == ids).then_some(())
        })
        .await;
    }
}

/// A reload through broker 2, whose file alone names the dispatcher, reloads all three: each
/// lists it and delivers with it. A bad file through broker 3 is refused with `400` and changes
/// nothing anywhere; a good one through broker 3 replaces the dispatcher on all.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_through_one_broker_reloads_the_cluster_and_a_bad_file_changes_nothing() {
    let c = Cluster::start(3, &[]).await;
    c.meta_leader(1).await;
    let consumer = Consumer::start().await;
    write_dispatchers(
        c.root(2),
        &json!([host_dispatcher("audit", "orders", consumer.port)]),
    );
    let (code, report) = c.broker(2).post("/mmmq/admin/reload", &json!({})).await;
    assert_eq!(code, 200, "{report}");
    assert_eq!(report["added"], json!(["audit"]), "{report}");
    // Answered once broker 2 runs it.
    assert_eq!(configured(&c, 2).await, ["audit"]);
    everywhere(&c, &["audit"]).await;
    c.broker(1).produce("orders", json!({"n": 1})).await;
    consumer.wait_for(1, WAIT).await;

    let bad = "[{\"consumerId\": \"x\", \"pattern\": \"orders\"";
    std::fs::write(c.root(3).join("dispatchers.json"), bad).unwrap();
    let (code, refused) = c.broker(3).post("/mmmq/admin/reload", &json!({})).await;
    assert_eq!(code, 400, "{refused}");
    assert!(
        mmmq_tests::error_of(&refused).contains("dispatchers.json"),
        "{refused}"
    );
    for b in [1, 2, 3] {
        assert_eq!(configured(&c, b).await, ["audit"], "broker {b}");
    }
    assert_eq!(
        std::fs::read_to_string(c.root(3).join("dispatchers.json")).unwrap(),
        bad,
        "a refused reload writes nothing"
    );

    write_dispatchers(
        c.root(3),
        &json!([host_dispatcher("ledger", "orders", consumer.port)]),
    );
    let (code, report) = c.broker(3).post("/mmmq/admin/reload", &json!({})).await;
    assert_eq!(code, 200, "{report}");
    assert_eq!(report["removed"], json!(["audit"]), "{report}");
    assert_eq!(report["added"], json!(["ledger"]), "{report}");
    everywhere(&c, &["ledger"]).await;
}

/// A broker killed before a reload runs the new configuration once restarted (not the one it
/// had), and a broker added later runs the cluster's, though its own file names none.
#[tokio::test(flavor = "multi_thread")]
async fn a_broker_down_during_a_reload_and_one_added_later_run_the_clusters_dispatchers() {
    let mut c = Cluster::start(3, &[]).await;
    c.meta_leader(1).await;
    let consumer = Consumer::start().await;
    let port = consumer.port;
    write_dispatchers(
        c.root(1),
        &json!([host_dispatcher("before", "orders", port)]),
    );
    let (code, report) = c.broker(1).post("/mmmq/admin/reload", &json!({})).await;
    assert_eq!(code, 200, "{report}");
    everywhere(&c, &["before"]).await;

    c.kill(3);
    write_dispatchers(
        c.root(1),
        &json!([host_dispatcher("after", "orders", port)]),
    );
    let (code, report) = c.broker(1).post("/mmmq/admin/reload", &json!({})).await;
    assert_eq!(code, 200, "{report}");
    assert!(
        std::fs::read_to_string(c.root(3).join("dispatchers.json"))
            .unwrap()
            .contains("before")
    );
    c.restart(3).await;
    everywhere(&c, &["after"]).await;

    let (four, addr) = c.spawn_extra().await;
    c.broker(1)
        .cli_ok(["cluster", "add-broker", &four.to_string(), addr.as_str()]);
    everywhere(&c, &["after"]).await;
}

/// A cluster without a `dispatchers.json` takes the first broker's file that names a dispatcher
/// (here broker 2's, restarted with one), once: a broker restarted later with another file runs
/// the cluster's, and its file is replaced by it.
#[tokio::test(flavor = "multi_thread")]
async fn the_first_file_with_dispatchers_seeds_the_cluster_once() {
    let mut c = Cluster::start(3, &[]).await;
    c.meta_leader(1).await;
    let consumer = Consumer::start().await;
    c.kill(2);
    write_dispatchers(
        c.root(2),
        &json!([host_dispatcher("seeded", "orders", consumer.port)]),
    );
    c.restart(2).await;
    everywhere(&c, &["seeded"]).await;

    c.kill(3);
    write_dispatchers(
        c.root(3),
        &json!([host_dispatcher("other", "orders", consumer.port)]),
    );
    c.restart(3).await;
    c.meta_leader(3).await;
    everywhere(&c, &["seeded"]).await;
}

/// Broker `id`'s current version of plugin `tb` and the version its dispatcher `d` serves.
async fn serving(c: &Cluster, id: u64) -> (Option<String>, Option<String>) {
    let b = c.broker(id);
    let (_, plugins) = b.get("/mmmq/plugins").await;
    let current = plugins.as_array().and_then(|all| {
        let tb = all.iter().find(|p| p["name"] == "tb")?;
        tb["current"].as_str().map(str::to_owned)
    });
    let (_, all) = b.get("/mmmq/dispatchers").await;
    let served = all.as_array().and_then(|a| {
        let d = a.iter().find(|d| d["consumerId"] == "d")?;
        d["target"]["version"].as_str().map(str::to_owned)
    });
    (current, served)
}

/// Waits until every running broker has `version` current and its dispatcher serving it;
/// answers the longest time it took from `since`.
async fn current_everywhere(c: &Cluster, version: &str, since: Instant) -> Duration {
    let waits = c.running().into_iter().map(|b| async move {
        eventually_async(WAIT, &format!("broker {b} serving {version}"), || async {
            let (current, served) = serving(c, b).await;
            (current.as_deref() == Some(version) && served.as_deref() == Some(version))
                .then(|| since.elapsed())
        })
        .await
    });
    futures_util::future::join_all(waits)
        .await
        .into_iter()
        .max()
        .unwrap()
}

/// Contract §13: a deploy through broker 1 is current on all three within 2 s of its answer,
/// the dispatcher that names the plugin switched on each; a deploy through broker 2 and a
/// rollback through broker 3 likewise; a broker down during a deploy gets the version (its
/// bytes from another broker) when it comes back.
#[tokio::test(flavor = "multi_thread")]
async fn a_deploy_through_any_broker_is_current_on_every_broker_within_2_s() {
    let v1 = std::fs::read(plugin_wasm("testbed", None)).unwrap();
    let v2 = wasm_variant(&v1, 2);
    let v3 = wasm_variant(&v1, 3);
    let mut c = Cluster::start(3, &[]).await;
    c.meta_leader(1).await;
    write_dispatchers(
        c.root(1),
        &json!([{"consumerId": "d", "pattern": "dep", "plugin": {"name": "tb"}}]),
    );
    let (code, report) = c.broker(1).post("/mmmq/admin/reload", &json!({})).await;
    assert_eq!(code, 200, "{report}");
    everywhere(&c, &["d"]).await;

    let mut slowest = Duration::ZERO;
    let mut deploy = async |via: u64, bytes: &[u8]| {
        let (code, body) = c.broker(via).deploy_wasm("tb", bytes.to_vec()).await;
        let answered = Instant::now();
        assert_eq!(code, 200, "{body}");
        let version = body["version"].as_str().unwrap().to_owned();
        assert_eq!(
            serving(&c, via).await.1.as_deref(),
            Some(&*version),
            "switched before the answer"
        );
        let took = current_everywhere(&c, &version, answered).await;
        slowest = slowest.max(took);
        version
    };
    let first = deploy(1, &v1).await;
    let second = deploy(2, &v2).await;
    println!("slowest broker after a deploy's answer: {slowest:?}");
    assert!(slowest <= Duration::from_secs(2), "{slowest:?}");

    let (code, back) = c
        .broker(3)
        .post("/mmmq/plugins/tb/rollback", &json!({}))
        .await;
    assert_eq!(code, 200, "{back}");
    assert_eq!(back["version"], first.as_str(), "{back}");
    let took = current_everywhere(&c, &first, Instant::now()).await;
    assert!(took <= Duration::from_secs(2), "{took:?}");
    let path = format!("/mmmq/plugins/tb/versions/{second}/activate");
    let (code, on) = c.broker(1).post(&path, &json!({})).await;
    assert_eq!(code, 200, "{on}");
    current_everywhere(&c, &second, Instant::now()).await;

    c.kill(3);
    let (code, body) = c.broker(2).deploy_wasm("tb", v3.clone()).await;
    assert_eq!(code, 200, "{body}");
    let third = body["version"].as_str().unwrap().to_owned();
    c.restart(3).await;
    current_everywhere(&c, &third, Instant::now()).await;
    let dir = c.root(3).join("plugins").join("tb");
    assert_eq!(std::fs::read(dir.join("current.wasm")).unwrap(), v3);
    assert_eq!(
        std::fs::read(dir.join(format!("{third}.wasm"))).unwrap(),
        v3
    );
    let (_, listed) = c.broker(3).get("/mmmq/plugins").await;
    let kept: Vec<&str> = listed[0]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_str().unwrap())
        .collect();
    assert!(kept.ends_with(&[third.as_str()]), "{listed}");
}
