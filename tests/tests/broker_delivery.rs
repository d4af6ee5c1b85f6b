//! The broker end to end: the real binary, real HTTP producers and real HTTP consumers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mmmq_tests::{
    Answer, Broker, Consumer, eventually, free_port, host_dispatcher, write_dispatchers,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread")]
async fn eight_producers_four_topics_each_message_once_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let consumer = Consumer::start().await;
    write_dispatchers(
        tmp.path(),
        &json!([host_dispatcher("all", "orders.*", consumer.port)]),
    );
    let broker = Arc::new(Broker::start(tmp.path()).await);
    let topics = ["orders.a", "orders.b", "orders.c", "orders.d"];
    const PER_CLIENT: usize = 60;
    let mut clients = Vec::new();
    for c in 0..8 {
        let broker = broker.clone();
        clients.push(tokio::spawn(async move {
            let mut acks = Vec::new();
            for i in 0..PER_CLIENT {
                let topic = topics[(c + i) % 4];
                let content =
                    json!({"client": c, "seq": i, "text": format!("m-{c}-{i}"), "n": 1.50});
                let offset = broker.produce(topic, content.clone()).await;
                acks.push((topic.to_owned(), offset, content));
            }
            acks
        }));
    }
    let mut acked: BTreeMap<String, BTreeMap<u64, Value>> = BTreeMap::new();
    for c in clients {
        for (topic, offset, content) in c.await.unwrap() {
            assert!(
                acked
                    .entry(topic)
                    .or_default()
                    .insert(offset, content)
                    .is_none()
            );
        }
    }
    for (topic, by_offset) in &acked {
        let offsets: Vec<u64> = by_offset.keys().copied().collect();
        assert_eq!(
            offsets,
            (0..by_offset.len() as u64).collect::<Vec<_>>(),
            "{topic}: consecutive"
        );
    }
    consumer.wait_for(8 * PER_CLIENT, WAIT).await;
    for (topic, by_offset) in &acked {
        let got = consumer.of_topic(topic);
        assert_eq!(
            got.len(),
            by_offset.len(),
            "{topic}: each message exactly once"
        );
        for (i, env) in got.iter().enumerate() {
            assert_eq!(env["offset"], i as u64, "{topic}: in offset order");
            assert_eq!(
                env["content"],
                by_offset[&(i as u64)],
                "{topic}: exact content"
            );
            assert!(env["timestamp"].as_u64().unwrap() > 1_700_000_000_000);
            assert_eq!(env["key"], Value::Null);
        }
    }
    // The content's bytes are kept as produced: numbers are not reformatted.
    let content = r#"{"n":1.50,"big":18446744073709551616,"e":1e3}"#;
    let (status, body) = broker
        .post_raw(
            "/mmmq/messages",
            format!(r#"{{"topic":"raw","content":{content}}}"#),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let raw = broker.get_text("/mmmq/topics/raw/messages").await;
    assert!(raw.contains(&format!(r#""content":{content}"#)), "{raw}");
    // Status shows the work.
    let s = broker
        .dispatcher_when("all", |s| s["delivered"] == 8 * PER_CLIENT as u64)
        .await;
    assert_eq!(s["lag"], 0);
    assert_eq!(s["target"]["type"], "host");
    // Metrics say the same, in Prometheus text.
    let r = broker
        .http
        .get(format!("{}/metrics", broker.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let metrics = r.text().await.unwrap();
    for line in [
        "mmmq_messages_in_total{topic=\"orders.a\"} 120".to_owned(),
        format!(
            "mmmq_messages_delivered_total{{consumer=\"all\",topic=\"orders.a\",partition=\"0\"}} {}",
            2 * PER_CLIENT
        ),
        "mmmq_dispatcher_lag{consumer=\"all\",topic=\"orders.a\",partition=\"0\"} 0".to_owned(),
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "missing {line:?} in\n{metrics}"
        );
    }
    for name in [
        "mmmq_fsync_batches_total",
        "mmmq_fsync_batch_size_bucket",
        "mmmq_bytes_in_total",
        "mmmq_delivery_latency_seconds_bucket",
    ] {
        assert!(metrics.contains(name), "missing {name}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn batch_produce_is_all_or_nothing_and_keeps_request_order() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    let (status, body) = broker
        .post(
            "/mmmq/messages/batch",
            &json!([{"topic": "a", "content": 1}, {"topic": "b", "content": 2}, {"topic": "../etc", "content": 3}]),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("element 2"),
        "{body}"
    );
    let (_, topics) = broker.get("/mmmq/topics").await;
    assert_eq!(topics, json!([]), "nothing appended, no topic created");

    let (status, body) = broker
        .post(
            "/mmmq/messages/batch",
            &json!([{"topic": "a", "content": "a0"}, {"topic": "b", "content": "b0", "key": "k"}, {"topic": "a", "content": "a1"}]),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"ack": "ACK", "results": [{"topic": "a", "partition": 0, "offset": 0}, {"topic": "b", "partition": 0, "offset": 0}, {"topic": "a", "partition": 0, "offset": 1}]})
    );
    let a = broker.pull_all("a").await;
    assert_eq!(
        a.iter().map(|e| e["content"].clone()).collect::<Vec<_>>(),
        vec![json!("a0"), json!("a1")]
    );
    assert_eq!(broker.pull_all("b").await[0]["key"], "k");
}

#[tokio::test(flavor = "multi_thread")]
async fn pull_long_polls_until_a_message_arrives() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Arc::new(Broker::start(tmp.path()).await);
    broker.produce("t", json!("first")).await;
    let poller = {
        let broker = broker.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            let r = broker
                .get("/mmmq/topics/t/messages?from=1&waitMs=20000")
                .await;
            (r, start.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !poller.is_finished(),
        "the poll waits while there is nothing"
    );
    broker.produce("t", json!("second")).await;
    let ((status, body), elapsed) = poller.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(body["messages"][0]["content"], "second");
    assert_eq!(body["messages"][0]["offset"], 1);
    assert_eq!(body["next"], 2);
    assert!(
        elapsed < Duration::from_secs(15),
        "returned as the message arrived, not at the deadline"
    );

    // Without waitMs an empty read answers at once.
    let (status, body) = broker.get("/mmmq/topics/t/messages?from=2").await;
    assert_eq!((status, body), (200, json!({"messages": [], "next": 2})));
    // max and from.
    let (_, body) = broker.get("/mmmq/topics/t/messages?from=0&max=1").await;
    assert_eq!(body["messages"].as_array().unwrap().len(), 1);
    assert_eq!(body["next"], 1);
    let (status, body) = broker.get("/mmmq/topics/nope/messages").await;
    assert_eq!(status, 404, "{body}");
    assert!(body["error"].as_str().unwrap().contains("nope"));
}

#[tokio::test(flavor = "multi_thread")]
async fn overlapping_patterns_each_get_every_match_and_dead_letters_reach_no_wildcard() {
    let tmp = tempfile::tempdir().unwrap();
    let orders = Consumer::start().await;
    let everything = Consumer::start().await;
    // Refuses everything: its messages end up in __dlq.refuser.
    let refuser = Consumer::start_on(0, Arc::new(|_| Answer::Nack)).await;
    write_dispatchers(
        tmp.path(),
        &json!([
            host_dispatcher("orders", "order.*", orders.port),
            host_dispatcher("everything", "**", everything.port),
            {"consumerId": "refuser", "pattern": "order.new", "maxNackRetries": 0,
             "host": {"protocol": "http", "address": "127.0.0.1", "port": refuser.port}},
        ]),
    );
    let broker = Broker::start(tmp.path()).await;
    broker.produce("order.new", json!(1)).await;
    broker.produce("order.cancel", json!(2)).await;
    broker.produce("payment.kakao.success", json!(3)).await;
    orders.wait_for(2, WAIT).await;
    everything.wait_for(3, WAIT).await;
    let dlq = broker.pull_until("__dlq.refuser", 1).await;
    assert_eq!(dlq[0]["content"]["envelope"]["topic"], "order.new");
    // A fence: topics are announced to the dispatchers in creation order, so once `**` has
    // subscribed to a topic created after the dead-letter topic, it has seen that one too.
    broker.produce("z.after", json!(4)).await;
    everything.wait_for(4, WAIT).await;
    let (_, status) = broker.get("/mmmq/dispatchers").await;
    let subscribed: Vec<&str> = status
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["consumerId"] == "everything")
        .unwrap()["topics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["topic"].as_str().unwrap())
        .collect();
    assert!(subscribed.contains(&"z.after"), "{subscribed:?}");
    assert!(!subscribed.contains(&"__dlq.refuser"), "{subscribed:?}");
    // Topics are delivered independently: compare as sets.
    let mut topics: Vec<String> = everything
        .envelopes()
        .iter()
        .map(|e| e["topic"].as_str().unwrap().to_owned())
        .collect();
    topics.sort();
    assert_eq!(
        topics,
        vec![
            "order.cancel",
            "order.new",
            "payment.kakao.success",
            "z.after"
        ]
    );
    let topics: Vec<Value> = orders
        .envelopes()
        .iter()
        .map(|e| e["topic"].clone())
        .collect();
    assert_eq!(topics, vec![json!("order.new"), json!("order.cancel")]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nacked_message_is_resent_three_times_then_dead_lettered_and_the_next_flows() {
    let tmp = tempfile::tempdir().unwrap();
    let consumer = Consumer::start_on(
        0,
        Arc::new(|e: &Value| {
            if e["content"]["bad"] == true {
                Answer::Nack
            } else {
                Answer::Ack
            }
        }),
    )
    .await;
    write_dispatchers(
        tmp.path(),
        &json!([host_dispatcher("billing", "pay.*", consumer.port)]),
    );
    let broker = Broker::start(tmp.path()).await;
    broker
        .produce("pay.in", json!({"bad": true, "id": 1}))
        .await;
    broker
        .produce("pay.in", json!({"bad": false, "id": 2}))
        .await;
    let got = consumer.wait_for(5, WAIT).await;
    let ids: Vec<Value> = got.iter().map(|e| e["content"]["id"].clone()).collect();
    assert_eq!(
        ids,
        vec![json!(1), json!(1), json!(1), json!(1), json!(2)],
        "1 + 3 attempts, then the next"
    );
    let dlq = broker.pull_until("__dlq.billing", 1).await;
    let letter = &dlq[0]["content"];
    assert_eq!(letter["attempts"], 4);
    assert_eq!(letter["consumerId"], "billing");
    assert!(
        letter["reason"].as_str().unwrap().contains("NACK"),
        "{letter}"
    );
    assert_eq!(letter["envelope"]["topic"], "pay.in");
    assert_eq!(letter["envelope"]["offset"], 0);
    assert_eq!(letter["envelope"]["content"], json!({"bad": true, "id": 1}));
    let s = broker
        .dispatcher_when("billing", |s| s["delivered"] == 1)
        .await;
    assert_eq!(
        (s["nacked"].clone(), s["deadLettered"].clone()),
        (json!(4), json!(1))
    );
    // Producing to the dead-letter topic is refused; reading it is allowed (above).
    let (code, _) = broker
        .post(
            "/mmmq/messages",
            &json!({"topic": "__dlq.billing", "content": 1}),
        )
        .await;
    assert_eq!(code, 400);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_that_is_down_gets_everything_in_order_once_it_is_up() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    write_dispatchers(tmp.path(), &json!([host_dispatcher("late", "**", port)]));
    let broker = Broker::start(tmp.path()).await;
    for i in 0..5 {
        broker.produce("jobs", json!(i)).await;
    }
    // A failing consumer is also a communication failure, not a NACK.
    let failing = Consumer::start_on(port, Arc::new(|_| Answer::Error)).await;
    eventually(WAIT, "a failed delivery", || {
        (!failing.envelopes().is_empty()).then_some(())
    })
    .await;
    failing.stop().await;
    let (_, status) = broker.get("/mmmq/dispatchers").await;
    assert!(status[0]["lastError"].as_str().is_some(), "{status}");
    assert_eq!(status[0]["deadLettered"], 0);
    let consumer = Consumer::start_on(port, Arc::new(|_| Answer::Ack)).await;
    let got = consumer.wait_for(5, Duration::from_secs(90)).await;
    let contents: Vec<Value> = got.iter().map(|e| e["content"].clone()).collect();
    assert_eq!(contents, (0..5).map(|i| json!(i)).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread")]
async fn batched_delivery_sends_arrays_and_a_nack_falls_back_to_one_at_a_time() {
    let tmp = tempfile::tempdir().unwrap();
    let consumer = Consumer::start_on(
        0,
        Arc::new(|e: &Value| {
            if e["content"] == 3 {
                Answer::Nack
            } else {
                Answer::Ack
            }
        }),
    )
    .await;
    write_dispatchers(
        tmp.path(),
        &json!([{"consumerId": "b", "pattern": "x", "batchMaxMessages": 10, "maxNackRetries": 1,
                 "host": {"protocol": "HTTP", "address": "127.0.0.1", "port": consumer.port}}]),
    );
    let (status, _) = {
        let broker = Broker::start(tmp.path()).await;
        let items: Vec<Value> = (0..6)
            .map(|i| json!({"topic": "x", "content": i}))
            .collect();
        let r = broker
            .post("/mmmq/messages/batch", &Value::Array(items))
            .await;
        broker.pull_until("__dlq.b", 1).await;
        eventually(WAIT, "delivery done", || {
            consumer
                .envelopes()
                .iter()
                .any(|e| e["content"] == 5)
                .then_some(())
        })
        .await;
        r
    };
    assert_eq!(status, 200);
    let requests = consumer.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.is_array() && r.as_array().unwrap().len() > 1),
        "{requests:?}"
    );
    // With batchMaxMessages > 1 every body is an array, also when a NACK makes the broker go
    // one message at a time.
    assert!(requests.iter().all(Value::is_array), "{requests:?}");
    // Everything but 3 was ACKed; 3 was tried in the batch, then alone twice (1 + 1 retry).
    let singles: Vec<Value> = requests
        .iter()
        .filter(|r| r.as_array().unwrap().len() == 1)
        .map(|r| r[0]["content"].clone())
        .collect();
    assert_eq!(
        singles.iter().filter(|c| **c == 3).count(),
        2,
        "{requests:?}"
    );
}

/// A consumer told to expect batches may reject anything that is not an array: a lone message
/// (nothing else committed behind it) still goes as an array of one.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_of_one_is_still_an_array() {
    let tmp = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let bodies: Arc<parking_lot::Mutex<Vec<Value>>> = Arc::default();
    let seen = bodies.clone();
    let app = axum::Router::new().route(
        "/mmmq/messages",
        axum::routing::post(move |body: axum::body::Bytes| {
            let seen = seen.clone();
            async move {
                let v: Value = serde_json::from_slice(&body).unwrap();
                let ok = v.is_array();
                seen.lock().push(v);
                if ok {
                    (axum::http::StatusCode::OK, r#"{"ack":"ACK"}"#)
                } else {
                    (
                        axum::http::StatusCode::BAD_REQUEST,
                        r#"{"error":"arrays only"}"#,
                    )
                }
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    write_dispatchers(
        tmp.path(),
        &json!([{"consumerId": "b", "pattern": "x", "batchMaxMessages": 10,
                 "host": {"protocol": "HTTP", "address": "127.0.0.1", "port": port}}]),
    );
    let broker = Broker::start(tmp.path()).await;
    broker.produce("x", json!("only")).await;
    let first = eventually(WAIT, "the first request", || bodies.lock().first().cloned()).await;
    assert_eq!(first.as_array().map(Vec::len), Some(1), "{first}");
    assert_eq!(first[0]["content"], "only");
    broker.produce("x", json!("second")).await;
    eventually(WAIT, "the second request", || {
        (bodies.lock().len() >= 2).then_some(())
    })
    .await;
    assert!(
        bodies.lock().iter().all(Value::is_array),
        "{:?}",
        bodies.lock()
    );
}
