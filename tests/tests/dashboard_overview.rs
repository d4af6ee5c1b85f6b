//! The dashboard's overview (docs/operations.md, "Dashboard"), the view it opens on, in a real
//! browser ([`mmmq_tests::browser`]: headless Chromium through chromedriver) against the real
//! broker. The other views are `dashboard.rs`'s.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mmmq_tests::browser::{Browser, WAIT};
use mmmq_tests::{Answer, Broker, Consumer, free_port, host_dispatcher, write_dispatchers};
use serde_json::{Value, json};

/// The rows of the overview's "Dispatchers and groups by lag": kind, name, lag, state.
const BY_LAG: &str = "return [...document.querySelectorAll('#by-lag tr[data-name]')].map((r) => \
    [r.dataset.kind, r.dataset.name, r.querySelector('.lag').textContent, r.querySelector('.pill').textContent])";
/// The rows of the overview's "Busiest topics": topic, messages per second, bytes per second.
const BUSIEST: &str = "return [...document.querySelectorAll('#busiest tr[data-topic]')].map((r) => \
    [r.dataset.topic, Number(r.querySelector('.msgs').textContent), r.querySelector('.bytes').textContent])";
/// The text of the newest row of the overview's "Recent errors".
const NEWEST_ERROR: &str = "return document.querySelector('#recent-errors tr')?.textContent ?? ''";
/// The text of the element `id` once it shows something (not `…`).
async fn shown(b: &Browser, id: &str) -> Value {
    let script = format!("return document.getElementById('{id}').textContent");
    b.until(&script, WAIT, |v| v != "…").await
}

/// Longer than the dispatcher's backoff (1 s doubling to 60 s) takes to try again after a few
/// failures.
const RETRY_WAIT: Duration = Duration::from_secs(90);

/// The overview (docs/operations.md, "Dashboard"): this broker (version, connections, open
/// segment files; "single broker" when it serves no cluster view), the busiest topic with a rate
/// while a producer runs and 0 once it stops, dispatchers and groups worst lag first with their
/// state, and recent errors newest first, resolved once the consumer answers again.
#[tokio::test(flavor = "multi_thread")]
async fn the_overview_shows_this_broker_the_busiest_topics_lag_and_recent_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let fine = Consumer::start().await;
    let flaky_port = free_port(); // nobody answers there yet
    write_dispatchers(
        root,
        &json!([
            host_dispatcher("flaky", "orders", flaky_port),
            host_dispatcher("fine", "orders", fine.port)
        ]),
    );
    let broker = Broker::start(root).await;
    for n in 0..3 {
        broker.produce("orders", json!({"n": n})).await;
    }
    broker.produce("cold", json!({"n": 0})).await;
    let (code, body) = broker
        .get("/mmmq/groups/readers/messages?member=m1&pattern=cold&max=1&sessionTimeoutMs=600000")
        .await;
    assert_eq!(code, 200, "{body}");
    broker.dispatcher_when("fine", |s| s["lag"] == 0).await;
    broker
        .dispatcher_when("flaky", |s| s["lag"] == 3 && s["lastError"].is_string())
        .await;

    let b = Browser::start().await;
    b.client.goto(&format!("{}/", broker.url)).await.unwrap();
    // This broker, alone: its address and health, version, connections, open segment files.
    b.text("#cluster-summary", "single broker (not clustered)")
        .await;
    let row = b.text("#brokers tr[data-broker=self]", "ok").await;
    assert!(row.contains(broker.addr()), "{row}");
    let (_, api) = broker.get("/mmmq/openapi.json").await;
    let version = api["info"]["version"].as_str().unwrap();
    assert_eq!(b.text("#version", version).await, version);
    let connections: u64 = shown(&b, "connections")
        .await
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(connections >= 1, "the page's own connection: {connections}");
    let files: u64 = shown(&b, "open-files")
        .await
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(files >= 1, "orders and cold are open: {files}");
    let cap = broker.metric("mmmq_max_open_segment_files").await;
    b.text("#open-files-cap", &format!("of {cap}")).await;

    // Worst lag first: the dispatcher whose consumer is down, the group that has not committed,
    // the dispatcher that keeps up. The newest error is the refused connection.
    b.until(BY_LAG, WAIT, |v| {
        v == &json!([
            ["dispatcher", "flaky", "3", "failing (backing off)"],
            ["group", "readers", "1", "1 member"],
            ["dispatcher", "fine", "0", "caught up"]
        ])
    })
    .await;
    let newest = b
        .until(NEWEST_ERROR, WAIT, |v| {
            v.as_str().unwrap().contains("Connection refused")
        })
        .await;
    assert!(
        newest.as_str().unwrap().contains("dispatcher flaky"),
        "{newest}"
    );

    // The consumer comes back answering 500 (then ACK, once `ack` is set).
    let ack = Arc::new(AtomicBool::new(false));
    let answers = ack.clone();
    let consumer = Consumer::start_on(
        flaky_port,
        Arc::new(move |_| {
            if answers.load(Ordering::SeqCst) {
                Answer::Ack
            } else {
                Answer::Error
            }
        }),
    )
    .await;

    // The busiest topic: the one being produced to, with its rate (the others were last
    // produced before the page's first look), down to 0 once its producer stops.
    let stop = AtomicBool::new(false);
    let produce = async {
        while !stop.load(Ordering::SeqCst) {
            broker.produce("hot", json!({"pad": "x".repeat(100)})).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let watch = async {
        let rows = b
            .until(BUSIEST, WAIT, |v| {
                v[0][0] == "hot" && v[0][1].as_f64() > Some(0.0)
            })
            .await;
        stop.store(true, Ordering::SeqCst);
        rows
    };
    let (_, rows) = tokio::join!(produce, watch);
    assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
    assert!(!rows[0][2].as_str().unwrap().starts_with("0 B"), "{rows}");
    b.screenshot("overview").await;
    b.until(BUSIEST, WAIT, |v| v[0][0] == "hot" && v[0][1] == 0.0)
        .await;

    // The 500 is the newest error; once the consumer ACKs, it is resolved and the lag is gone.
    let newest = b
        .until(NEWEST_ERROR, RETRY_WAIT, |v| {
            v.as_str().unwrap().contains("answered HTTP 500")
        })
        .await;
    assert!(!newest.as_str().unwrap().contains("(resolved)"), "{newest}");
    ack.store(true, Ordering::SeqCst);
    b.until(NEWEST_ERROR, RETRY_WAIT, |v| {
        let text = v.as_str().unwrap();
        text.contains("answered HTTP 500") && text.contains("(resolved)")
    })
    .await;
    b.until(BY_LAG, WAIT, |v| {
        v == &json!([
            ["group", "readers", "1", "1 member"],
            ["dispatcher", "fine", "0", "caught up"],
            ["dispatcher", "flaky", "0", "caught up"]
        ])
    })
    .await;
    // Offset 0 was answered 500 (at least once) before the three were ACKed in order.
    let got = consumer.offsets();
    assert!(got.len() > 3 && got.ends_with(&[0, 1, 2]), "{got:?}");
    b.close().await;
}

/// The overview's cluster panel, from `GET /mmmq/cluster`'s shape (contract §13): every broker
/// with its health and how many partitions it leads and holds, and the partitions without a
/// leader first, then the most lagging. The page's `fetch` of that one path answers a canned
/// view (everything else is the real broker, which is not clustered); back to "single broker"
/// when the view says `"clustered": false`.
#[tokio::test(flavor = "multi_thread")]
async fn the_overview_shows_every_broker_of_a_cluster_and_its_lagging_partitions() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    let b = Browser::start().await;
    b.client.goto(&format!("{}/", broker.url)).await.unwrap();
    b.text("#cluster-summary", "single broker").await;
    let lag = |l: [u64; 3]| json!({"1": l[0], "2": l[1], "3": l[2]});
    let part = |topic: &str, partition: u32, replicas: [u64; 3], leader: Value, lag: Value| {
        json!({"topic": topic, "partition": partition, "replicas": replicas, "leader": leader,
               "term": if leader.is_null() { Value::Null } else { json!(partition + 1) }, "lag": lag})
    };
    let view = json!({
        "clustered": true, "nodeId": 1,
        "meta": {"leader": 1, "term": 2, "voters": [1, 2, 3]},
        "brokers": [
            {"id": 2, "addr": "127.0.0.1:8082", "alive": false},
            {"id": 1, "addr": "127.0.0.1:8081", "alive": true},
            {"id": 3, "addr": "127.0.0.1:8083", "alive": null}
        ],
        "partitions": [
            part("t", 0, [1, 2, 3], json!(1), lag([0, 0, 4])),
            part("t", 1, [2, 3, 1], json!(3), Value::Null),
            part("t", 2, [3, 1, 2], json!(1), lag([0, 9, 0])),
            part("u", 0, [1, 2, 3], Value::Null, Value::Null),
            part("v", 0, [1, 2, 3], json!(1), lag([0, 0, 0])),
        ]
    });
    b.client
        .execute(
            "window.cannedCluster = arguments[0]; const real = window.fetch; \
             window.fetch = (path, init) => path === '/mmmq/cluster' \
               ? Promise.resolve(new Response(JSON.stringify(window.cannedCluster), \
                   {status: 200, headers: {'content-type': 'application/json'}})) \
               : real(path, init);",
            vec![view],
        )
        .await
        .unwrap();
    let summary = b.text("#cluster-summary", "3 brokers").await;
    assert_eq!(
        summary,
        "3 brokers, 1 alive · metadata leader 1, term 2, voters 1, 2, 3 · 5 partitions, \
         1 without a leader, 2 lagging"
    );
    let brokers: Value = b
        .client
        .execute(
            "return [...document.querySelectorAll('#brokers tr')].map((r) => [...r.cells].map((c) => c.textContent.trim()))",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        brokers,
        json!([
            ["1 (this broker)", "127.0.0.1:8081", "alive", "3", "5"],
            ["2", "127.0.0.1:8082", "down", "0", "5"],
            ["3", "127.0.0.1:8083", "unknown", "1", "5"]
        ])
    );
    let partitions: Value = b
        .client
        .execute(
            "return [...document.querySelectorAll('#cluster-partitions tbody tr')].map((r) => \
             [r.dataset.partition, ...[...r.cells].slice(2).map((c) => c.textContent.trim())])",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        partitions,
        json!([
            ["u/0", "none", "1, 2, 3", "", "unknown"],
            ["t/2", "1", "3 (0), 1 (0), 2 (9)", "3", "9"],
            ["t/0", "1", "1 (0), 2 (0), 3 (4)", "1", "4"],
            ["t/1", "3", "2, 3, 1", "2", "unknown"],
            ["v/0", "1", "1 (0), 2 (0), 3 (0)", "1", "0"]
        ])
    );
    b.screenshot("cluster").await;
    b.client
        .execute("window.cannedCluster = {clustered: false}", vec![])
        .await
        .unwrap();
    b.text("#cluster-summary", "single broker (not clustered)")
        .await;
    let left: Value = b
        .client
        .execute(
            "return document.getElementById('cluster-partitions').textContent",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(left, json!(""));
    b.close().await;
}

/// A hidden tab asks the broker nothing (no refresh while `document.hidden`), and refreshes at
/// once when it is shown again. The page's `fetch` is counted; visibility is set by the test.
#[tokio::test(flavor = "multi_thread")]
async fn a_hidden_dashboard_asks_the_broker_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    let b = Browser::start().await;
    b.client.goto(&format!("{}/", broker.url)).await.unwrap();
    b.text("#health", "ok").await;
    let set_hidden = |hidden: bool| {
        format!(
            "Object.defineProperty(document, 'hidden', {{configurable: true, get: () => {hidden}}}); \
             document.dispatchEvent(new Event('visibilitychange'));"
        )
    };
    let fetches = "return window.fetches";
    b.client
        .execute(
            "window.fetches = 0; const real = window.fetch; \
             window.fetch = (...args) => { window.fetches++; return real(...args); };",
            vec![],
        )
        .await
        .unwrap();
    // Refreshing: every 2 s.
    b.until(fetches, WAIT, |v| v.as_u64() > Some(0)).await;
    b.client.execute(&set_hidden(true), vec![]).await.unwrap();
    // A refresh under way when the tab was hidden ends (the page's `polling`); none starts
    // after it. That nothing happens can only be seen by waiting: 2.5 times the period.
    let quiet = b
        .until(
            "return polling ? null : window.fetches",
            WAIT,
            Value::is_u64,
        )
        .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let later: Value = b.client.execute(fetches, vec![]).await.unwrap();
    assert_eq!(later, quiet, "the hidden page kept asking");
    let quiet = quiet.as_u64().unwrap();
    b.client.execute(&set_hidden(false), vec![]).await.unwrap();
    b.until(fetches, Duration::from_secs(1), |v| {
        v.as_u64() > Some(quiet)
    })
    .await;
    b.close().await;
}
