//! Reloads that meet a slow consumer: the status and metrics stay answerable while a reload waits
//! for a delivery in flight, and a reload whose request is dropped (a client that gives up) still
//! runs to its end, so the dispatcher is never left stopped and never runs twice.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mmmq_tests::{Broker, eventually, write_dispatchers};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::watch;

const WAIT: Duration = Duration::from_secs(30);

/// An HTTP consumer whose answers wait while its gate is closed.
struct GatedConsumer {
    port: u16,
    gate: watch::Sender<bool>,
    received: Arc<Mutex<Vec<Value>>>,
}

impl GatedConsumer {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (gate, open) = watch::channel(true);
        let received: Arc<Mutex<Vec<Value>>> = Arc::default();
        let seen = received.clone();
        let app = axum::Router::new().route(
            "/mmmq/messages",
            axum::routing::post(move |body: axum::body::Bytes| {
                let seen = seen.clone();
                let mut open = open.clone();
                async move {
                    seen.lock().push(serde_json::from_slice(&body).unwrap());
                    let _ = open.wait_for(|o| *o).await;
                    r#"{"ack":"ACK"}"#
                }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self {
            port,
            gate,
            received,
        }
    }

    fn offsets(&self) -> Vec<u64> {
        self.received
            .lock()
            .iter()
            .map(|e| e["offset"].as_u64().unwrap())
            .collect()
    }

    async fn wait_for_offset(&self, offset: u64) {
        eventually(WAIT, &format!("offset {offset} to arrive"), || {
            self.offsets().contains(&offset).then_some(())
        })
        .await;
    }
}

fn dispatcher(port: u16, retries: u32) -> Value {
    json!([{"consumerId": "slow", "pattern": "r", "maxNackRetries": retries,
            "host": {"protocol": "HTTP", "address": "127.0.0.1", "port": port}}])
}

async fn max_nack_retries(broker: &Broker) -> Option<u64> {
    let (_, all) = broker.get("/mmmq/dispatchers").await;
    all.as_array()?
        .iter()
        .find(|d| d["consumerId"] == "slow")
        .and_then(|d| d["maxNackRetries"].as_u64())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_waiting_on_a_slow_consumer_blocks_no_status_and_a_dropped_one_still_completes() {
    let tmp = tempfile::tempdir().unwrap();
    let consumer = GatedConsumer::start().await;
    write_dispatchers(tmp.path(), &dispatcher(consumer.port, 3));
    let broker = Broker::start(tmp.path()).await;

    // 1. A delivery in flight holds a reload of its dispatcher; status and metrics still answer.
    consumer.gate.send_replace(false);
    broker.produce("r", json!(0)).await;
    consumer.wait_for_offset(0).await;
    write_dispatchers(tmp.path(), &dispatcher(consumer.port, 5));
    let reload = {
        let http = broker.http.clone();
        let url = format!("{}/mmmq/admin/reload", broker.url);
        tokio::spawn(async move { http.post(url).send().await.unwrap().status().as_u16() })
    };
    eventually(WAIT, "the reload to stop the old dispatcher", || {
        broker
            .log
            .lock()
            .contains("stopping dispatcher")
            .then_some(())
    })
    .await;
    let quick = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    for path in ["/mmmq/dispatchers", "/metrics"] {
        let r = quick.get(format!("{}{path}", broker.url)).send().await;
        assert!(
            r.is_ok_and(|r| r.status() == 200),
            "{path} must answer while a reload waits"
        );
    }
    assert!(!reload.is_finished(), "the reload waits for the delivery");
    consumer.gate.send_replace(true);
    assert_eq!(reload.await.unwrap(), 200);
    assert_eq!(max_nack_retries(&broker).await, Some(5));

    // 2. The client gives up on a reload while it waits: the reload still runs to its end.
    consumer.gate.send_replace(false);
    broker.produce("r", json!(1)).await;
    consumer.wait_for_offset(1).await;
    write_dispatchers(tmp.path(), &dispatcher(consumer.port, 7));
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let r = impatient
        .post(format!("{}/mmmq/admin/reload", broker.url))
        .send()
        .await;
    assert!(r.is_err(), "the request times out while the reload waits");
    consumer.gate.send_replace(true);
    let deadline = Instant::now() + WAIT;
    while max_nack_retries(&broker).await != Some(7) {
        assert!(
            Instant::now() < deadline,
            "the dropped reload never finished"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for n in 2..6 {
        broker.produce("r", json!(n)).await;
    }
    eventually(WAIT, "every message", || {
        (consumer.offsets().len() >= 6).then_some(())
    })
    .await;
    // Each message once, in order: no second worker ever ran.
    assert_eq!(consumer.offsets(), (0..6).collect::<Vec<_>>());
}
