//! The Rust clients and the CLI client commands against the real broker.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use mmmq_client::{ClientError, Consumer, Message, Producer, PullConsumer, Record};
use mmmq_tests::{
    Broker, eventually, example_bin, free_port, host_dispatcher, mmmq_bin, write_dispatchers,
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u64,
    amount: f64,
}

#[tokio::test(flavor = "multi_thread")]
async fn producer_receipts_batches_and_typed_content() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    let producer = Producer::new(&broker.url).unwrap();
    let r = producer
        .send("order.created", &Order { id: 1, amount: 2.5 })
        .await
        .unwrap();
    assert_eq!((r.topic.as_str(), r.offset), ("order.created", 0));
    let r = producer
        .send_keyed("order.created", Some("c-1"), &Order { id: 2, amount: 3.0 })
        .await
        .unwrap();
    assert_eq!(r.offset, 1);
    let batch = vec![
        Record::new("order.created", Order { id: 3, amount: 1.0 }),
        Record::new("order.other", Order { id: 4, amount: 1.0 }).with_key("k"),
        Record::new("order.created", Order { id: 5, amount: 1.0 }),
    ];
    let receipts = producer.send_batch(&batch).await.unwrap();
    let got: Vec<(String, u64)> = receipts.into_iter().map(|r| (r.topic, r.offset)).collect();
    assert_eq!(
        got,
        vec![
            ("order.created".into(), 2),
            ("order.other".into(), 0),
            ("order.created".into(), 3)
        ]
    );
    let stored = broker.pull_all("order.created").await;
    let orders: Vec<Order> = stored
        .iter()
        .map(|e| serde_json::from_value(e["content"].clone()).unwrap())
        .collect();
    assert_eq!(
        orders.iter().map(|o| o.id).collect::<Vec<_>>(),
        vec![1, 2, 3, 5]
    );
    assert_eq!(stored[1]["key"], "c-1");
    // A refused request is not retried and says why.
    match producer.send("__dlq.x", &1).await {
        Err(ClientError::Rejected {
            status: 400,
            message,
        }) => assert!(message.contains("internal"), "{message}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn producer_retries_until_a_late_broker_is_up() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let producer = Producer::new(&url).unwrap().retries(8);
    let send = tokio::spawn(async move { producer.send("late", &json!({"n": 1})).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!send.is_finished(), "still retrying while nothing listens");
    let broker = Broker::start_with(tmp.path(), &["--listen", &format!("127.0.0.1:{port}")]).await;
    let receipt = send.await.unwrap().unwrap();
    assert_eq!(receipt.offset, 0);
    assert_eq!(broker.pull_all("late").await.len(), 1);
    // And gives up, with an error that says so, when nobody ever answers.
    let dead = Producer::new(&format!("http://127.0.0.1:{}", free_port()))
        .unwrap()
        .retries(1);
    match dead.send("t", &1).await {
        Err(e @ ClientError::Unavailable { attempts: 2, .. }) => assert!(e.is_transient()),
        other => panic!("{other:?}"),
    }
}

/// The broker answers 503 only when its disk fails, which a test cannot cause on demand; a stand-in
/// that NACKs twice and then stores checks the client's side of that exchange.
#[tokio::test(flavor = "multi_thread")]
async fn producer_retries_a_503_nack() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let app = axum::Router::new().route(
        "/mmmq/messages",
        axum::routing::post(move || {
            let c = c.clone();
            async move {
                if c.fetch_add(1, Ordering::SeqCst) < 2 {
                    (
                        axum::http::StatusCode::SERVICE_UNAVAILABLE,
                        r#"{"ack":"NACK","error":"disk full"}"#,
                    )
                } else {
                    (
                        axum::http::StatusCode::OK,
                        r#"{"ack":"ACK","topic":"t","offset":7}"#,
                    )
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let r = Producer::new(&url).unwrap().send("t", &1).await.unwrap();
    assert_eq!(r.offset, 7);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    calls.store(0, Ordering::SeqCst);
    match Producer::new(&url).unwrap().retries(1).send("t", &1).await {
        Err(ClientError::Nacked {
            attempts: 2,
            message,
        }) => assert!(message.contains("disk full")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn typed_consumer_handlers_by_pattern_with_nack_on_err() {
    let tmp = tempfile::tempdir().unwrap();
    let orders: Arc<Mutex<Vec<(u64, Order)>>> = Arc::default();
    let other: Arc<Mutex<Vec<Value>>> = Arc::default();
    let (o, x) = (orders.clone(), other.clone());
    let consumer = Consumer::new()
        .handle("order.*", move |m: Message<Order>| {
            let o = o.clone();
            async move {
                if m.content.amount < 0.0 {
                    return Err(format!("negative amount in order {}", m.content.id));
                }
                o.lock().push((m.offset, m.content));
                Ok(())
            }
        })
        .unwrap()
        .handle("misc", move |m: Message<Value>| {
            let x = x.clone();
            async move {
                x.lock().push(m.content);
                Ok::<_, String>(())
            }
        })
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let stop = stop_signal();
    let server = tokio::spawn(consumer.serve(listener, stop.1));
    write_dispatchers(tmp.path(), &json!([host_dispatcher("svc", "**", port)]));
    let broker = Broker::start(tmp.path()).await;
    let producer = Producer::new(&broker.url).unwrap();
    for id in 0..10 {
        let amount = if id == 4 { -1.0 } else { id as f64 };
        producer
            .send("order.new", &Order { id, amount })
            .await
            .unwrap();
    }
    producer
        .send("order.new", &json!({"not": "an order"}))
        .await
        .unwrap();
    producer.send("misc", &json!([1, 2])).await.unwrap();
    eventually(WAIT, "everything handled or dead-lettered", || {
        (orders.lock().len() == 9 && other.lock().len() == 1).then_some(())
    })
    .await;
    let ids: Vec<u64> = orders.lock().iter().map(|(_, o)| o.id).collect();
    assert_eq!(
        ids,
        vec![0, 1, 2, 3, 5, 6, 7, 8, 9],
        "in order; the NACKed one skipped"
    );
    let dlq = broker.pull_until("__dlq.svc", 2).await;
    assert_eq!(dlq[0]["content"]["envelope"]["content"]["id"], 4);
    assert_eq!(
        dlq[1]["content"]["envelope"]["offset"], 10,
        "undeserializable content is a NACK"
    );
    let _ = stop.0.send(());
    server.await.unwrap().unwrap();
}

fn stop_signal() -> (
    tokio::sync::oneshot::Sender<()>,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    (tx, async move {
        let _ = rx.await;
    })
}

/// The example consumer runs as its own process; it is killed mid-stream and started again, and
/// between its two lives it has received every message, in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_process_restarted_mid_stream_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    write_dispatchers(tmp.path(), &json!([host_dispatcher("svc", "stream", port)]));
    let broker = Arc::new(Broker::start(tmp.path()).await);
    let received: Arc<Mutex<Vec<u64>>> = Arc::default();
    let start = |received: Arc<Mutex<Vec<u64>>>| {
        let mut child = Command::new(example_bin("consumer"))
            .args([format!("127.0.0.1:{port}"), "stream".into()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let v: Value = serde_json::from_str(&line).unwrap();
                received.lock().push(v["offset"].as_u64().unwrap());
            }
        });
        child
    };
    let mut consumer = start(received.clone());
    let producer = {
        let broker = broker.clone();
        tokio::spawn(async move {
            let p = Producer::new(&broker.url).unwrap();
            for i in 0..200u64 {
                p.send("stream", &json!({"i": i})).await.unwrap();
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    eventually(WAIT, "the first messages", || {
        (received.lock().len() > 20).then_some(())
    })
    .await;
    consumer.kill().unwrap();
    consumer.wait().unwrap();
    let mut consumer = start(received.clone());
    producer.await.unwrap();
    eventually(Duration::from_secs(90), "all 200", || {
        let mut seen = received.lock().clone();
        seen.sort();
        seen.dedup();
        (seen.len() == 200).then_some(())
    })
    .await;
    consumer.kill().unwrap();
    consumer.wait().unwrap();
    let got = received.lock().clone();
    // In order; a message may repeat only where the kill cut an answer off.
    let mut last: Option<u64> = None;
    for &o in &got {
        assert!(
            last.is_none_or(|l| o == l + 1 || o <= l),
            "{o} after {last:?}"
        );
        last = Some(last.map_or(o, |l| l.max(o)));
    }
    assert!(
        got.len() <= 201,
        "at most the message in flight twice: {}",
        got.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn pull_consumer_streams_from_an_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    for i in 0..5 {
        broker.produce("p", json!(i)).await;
    }
    let mut pull = PullConsumer::new(&broker.url, "p")
        .unwrap()
        .from_offset(2)
        .wait(Duration::from_millis(100));
    let first = pull.poll().await.unwrap();
    assert_eq!(
        first.iter().map(|e| e.offset).collect::<Vec<_>>(),
        vec![2, 3, 4]
    );
    assert_eq!(pull.position(), 5);
    let stream = PullConsumer::new(&broker.url, "p")
        .unwrap()
        .from_offset(3)
        .into_stream();
    futures_util::pin_mut!(stream);
    assert_eq!(stream.next().await.unwrap().unwrap().offset, 3);
    assert_eq!(stream.next().await.unwrap().unwrap().offset, 4);
    let next = tokio::spawn({
        let url = broker.url.clone();
        async move {
            let s = PullConsumer::new(&url, "p")
                .unwrap()
                .from_offset(5)
                .into_stream();
            futures_util::pin_mut!(s);
            s.next().await.unwrap().unwrap()
        }
    });
    broker.produce("p", json!("late")).await;
    let e = next.await.unwrap();
    assert_eq!((e.offset, e.content.get()), (5, r#""late""#));
    match PullConsumer::new(&broker.url, "nope").unwrap().poll().await {
        Err(ClientError::NoSuchTopic(t)) => assert_eq!(t, "nope"),
        other => panic!("{other:?}"),
    }
}

fn mmmq(broker: &Broker, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let mut child = Command::new(mmmq_bin())
        .args(args)
        .env("MMMQ_BROKER", &broker.url)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn cli_produce_from_stdin_then_tail_returns_the_same_messages() {
    let tmp = tempfile::tempdir().unwrap();
    let consumer = mmmq_tests::Consumer::start().await;
    write_dispatchers(
        tmp.path(),
        &json!([host_dispatcher("svc", "cli.*", consumer.port)]),
    );
    let broker = Broker::start(tmp.path()).await;
    let lines: Vec<String> = (0..250)
        .map(|i| format!(r#"{{"i":{i},"x":1.50}}"#))
        .collect();
    let input = lines.join("\n") + "\n\n";
    let (ok, out, err) = mmmq(
        &broker,
        &["produce", "--topic", "cli.t", "--key", "k"],
        Some(&input),
    );
    assert!(ok, "{err}");
    assert!(
        err.starts_with("produced 250 messages to cli.t in "),
        "the total ends the input: {err}"
    );
    let receipts: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(receipts.len(), 250);
    assert_eq!(
        receipts[249],
        json!({"topic": "cli.t", "partition": 0, "offset": 249})
    );
    let (ok, out, err) = mmmq(
        &broker,
        &["produce", "--topic", "cli.t", r#"{"one":true}"#],
        None,
    );
    assert!(ok, "{err}");
    assert_eq!(
        out.trim(),
        r#"{"offset":250,"partition":0,"topic":"cli.t"}"#
    );

    let (ok, out, err) = mmmq(&broker, &["tail", "--topic", "cli.t"], None);
    assert!(ok, "{err}");
    let tailed: Vec<&str> = out.lines().collect();
    assert_eq!(tailed.len(), 251);
    for (i, line) in tailed.iter().take(250).enumerate() {
        let env: Value = serde_json::from_str(line).unwrap();
        assert_eq!(env["offset"], i as u64);
        assert_eq!(env["key"], "k");
        assert!(
            line.ends_with(&format!(r#""content":{}}}"#, lines[i])),
            "exact bytes: {line}"
        );
    }
    let (ok, out, _) = mmmq(
        &broker,
        &["tail", "--topic", "cli.t", "--from", "250"],
        None,
    );
    assert!(ok);
    assert_eq!(out.lines().count(), 1);

    // A bad line stops with its number; what came before it is stored (and its receipt
    // printed), nothing after it.
    let (ok, out, err) = mmmq(
        &broker,
        &["produce", "--topic", "cli.bad"],
        Some("1\n{oops\n3\n"),
    );
    assert!(!ok);
    assert!(err.contains("line 2"), "{err}");
    assert_eq!(
        out.trim(),
        r#"{"offset":0,"partition":0,"topic":"cli.bad"}"#
    );
    let (ok, out, err) = mmmq(&broker, &["tail", "--topic", "cli.bad"], None);
    assert!(ok, "{err}");
    let stored: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(stored.len(), 1, "{out}");
    assert_eq!(stored[0]["content"], 1);

    // 250 + 1 on cli.t and the 1 stored on cli.bad.
    consumer.wait_for(252, WAIT).await;
    let (ok, out, err) = mmmq(&broker, &["topics"], None);
    assert!(ok, "{err}");
    let header = out.lines().next().unwrap();
    assert!(
        header.starts_with("TOPIC") && header.contains("NEXT OFFSET") && header.contains("BYTES"),
        "{out}"
    );
    let row = out.lines().find(|l| l.starts_with("cli.t ")).unwrap();
    let at = header.find("PARTITIONS").expect("a partitions column");
    assert_eq!(&row[at..at + 2], "1 ", "aligned:\n{out}");
    assert_eq!(
        row.find("251"),
        header.find("NEXT OFFSET"),
        "aligned:\n{out}"
    );
    let (ok, out, _) = mmmq(&broker, &["topics", "--json"], None);
    assert!(ok);
    let topics: Value = serde_json::from_str(&out).unwrap();
    assert!(
        topics
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "cli.t" && t["nextOffset"] == 251)
    );

    let status = eventually(WAIT, "lag 0", || {
        let (ok, out, _) = mmmq(&broker, &["dispatchers", "--json"], None);
        let v: Value = serde_json::from_str(&out).ok()?;
        (ok && v[0]["lag"] == 0 && v[0]["delivered"] == 252).then_some(v)
    })
    .await;
    assert_eq!(status[0]["consumerId"], "svc");
    let (ok, out, _) = mmmq(&broker, &["dispatchers"], None);
    assert!(ok);
    let header = out.lines().next().unwrap();
    assert!(header.starts_with("CONSUMER"), "{out}");
    assert!(header.contains(" DROPPED "), "{out}");
    assert!(
        out.contains("svc") && out.contains(&format!("127.0.0.1:{}", consumer.port)),
        "{out}"
    );
}

/// `mmmq reload` always says what it did, even when there was nothing to do.
#[tokio::test(flavor = "multi_thread")]
async fn cli_reload_says_what_it_did() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    let said = |broker: &Broker| {
        let (ok, out, err) = mmmq(broker, &["reload"], None);
        assert!(ok, "{err}");
        out.trim().to_owned()
    };
    assert_eq!(said(&broker), "no dispatchers configured");
    write_dispatchers(tmp.path(), &json!([host_dispatcher("svc", "**", 9)]));
    assert_eq!(said(&broker), "added: svc");
    assert_eq!(said(&broker), "unchanged: svc");
}

#[tokio::test(flavor = "multi_thread")]
async fn cli_client_commands_say_when_the_broker_is_unreachable() {
    let (ok, _, err) = {
        let out = Command::new(mmmq_bin())
            .args([
                "topics",
                "--broker",
                &format!("http://127.0.0.1:{}", free_port()),
            ])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert!(!ok);
    assert!(err.contains("unreachable"), "{err}");
}
