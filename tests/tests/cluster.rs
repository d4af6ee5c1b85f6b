//! A cluster of brokers (docs/cluster.md): real `mmmq serve` processes on 127.0.0.1.

use mmmq_tests::Broker;

/// A broker started without cluster flags says so, over HTTP and in `mmmq cluster status`.
#[tokio::test]
async fn a_single_broker_says_it_is_not_clustered() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    let (code, view) = broker.get("/mmmq/cluster").await;
    assert_eq!(code, 200);
    assert_eq!(view["clustered"], false, "{view}");
    assert_eq!(view["brokers"], serde_json::json!([]));
    let out = broker.cli_ok(["cluster", "status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("single broker"), "{text}");
    let out = broker.cli_ok(["cluster", "status", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["clustered"], false);
}
