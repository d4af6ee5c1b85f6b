//! The consumer side of `e2e`: the send-time stamp every payload starts with, what a consumer
//! received inside the measured window, and one consumer per system.

use std::time::Instant;

use crate::{RABBIT_QUEUE, nats_stream, rabbit_channel};

/// The clock that producers stamp messages with and consumers read them by (one process).
static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

pub fn now_us() -> u64 {
    ORIGIN.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// Width of the send time at the start of every payload.
const STAMP: usize = 20;

/// A payload of `len` bytes that starts with its send time.
pub fn stamped(len: usize) -> String {
    let mut p = format!("{:0width$}", now_us(), width = STAMP);
    p.extend(std::iter::repeat_n('x', len.saturating_sub(STAMP)));
    p
}

/// What a consumer received of the messages sent inside the measured window: (sent, received)
/// times in µs.
#[derive(Default)]
pub struct Received {
    pub window: std::sync::Mutex<(u64, u64)>,
    pub times: std::sync::Mutex<Vec<(u64, u64)>>,
}

impl Received {
    pub fn record(&self, payload: &str) {
        let Some(sent) = payload.get(..STAMP).and_then(|s| s.parse::<u64>().ok()) else {
            return;
        };
        let now = now_us();
        let (from, to) = *self.window.lock().unwrap();
        if (from..to).contains(&sent) {
            self.times.lock().unwrap().push((sent, now));
        }
    }
}

/// The no-op HTTP consumer mmmq delivers to: answers ACK to a single envelope or an array.
pub async fn http_consumer(port: u16, received: std::sync::Arc<Received>) -> anyhow::Result<()> {
    let app = axum::Router::new().route(
        "/mmmq/messages",
        axum::routing::post(move |body: axum::body::Bytes| {
            let received = received.clone();
            async move {
                let record = |v: &serde_json::Value| {
                    if let Some(pad) = v["content"]["pad"].as_str() {
                        received.record(pad);
                    }
                };
                match serde_json::from_slice::<serde_json::Value>(&body) {
                    Ok(serde_json::Value::Array(items)) => items.iter().for_each(record),
                    Ok(one) => record(&one),
                    Err(_) => return (axum::http::StatusCode::BAD_REQUEST, "bad JSON"),
                }
                (axum::http::StatusCode::OK, r#"{"ack":"ACK"}"#)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    axum::serve(listener, app).await?;
    Ok(())
}

/// A Redis consumer group member: reads, records, acknowledges.
pub async fn redis_consumer(url: &str, received: std::sync::Arc<Received>) -> anyhow::Result<()> {
    let mut con = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let _: Result<String, _> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg("bench")
        .arg("g")
        .arg("$")
        .arg("MKSTREAM")
        .query_async(&mut con)
        .await;
    loop {
        let reply: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("g")
            .arg("c")
            .arg("COUNT")
            .arg(1000)
            .arg("BLOCK")
            .arg(1000)
            .arg("STREAMS")
            .arg("bench")
            .arg(">")
            .query_async(&mut con)
            .await?;
        let mut ack = redis::cmd("XACK");
        ack.arg("bench").arg("g");
        let mut any = false;
        for entry in reply.keys.iter().flat_map(|k| &k.ids) {
            if let Some(redis::Value::BulkString(pad)) = entry.map.get("pad") {
                received.record(std::str::from_utf8(pad).unwrap_or(""));
            }
            ack.arg(&entry.id);
            any = true;
        }
        if any {
            let _: i64 = ack.query_async(&mut con).await?;
        }
    }
}

/// A JetStream pull consumer with explicit acknowledgements.
pub async fn nats_consumer(url: &str, received: std::sync::Arc<Received>) -> anyhow::Result<()> {
    use futures::StreamExt;
    let stream = nats_stream(url).await?;
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: Some("bench".into()),
            ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
            deliver_policy: async_nats::jetstream::consumer::DeliverPolicy::New,
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow::anyhow!("creating the consumer: {e}"))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| anyhow::anyhow!("consuming: {e}"))?;
    while let Some(message) = messages.next().await {
        let message = message.map_err(|e| anyhow::anyhow!("consuming: {e}"))?;
        received.record(std::str::from_utf8(&message.payload).unwrap_or(""));
        message
            .ack()
            .await
            .map_err(|e| anyhow::anyhow!("acking: {e}"))?;
    }
    Ok(())
}

/// A RabbitMQ consumer with manual acks and a prefetch of 1,000.
pub async fn rabbit_consumer(url: &str, received: std::sync::Arc<Received>) -> anyhow::Result<()> {
    use futures::StreamExt;
    let channel = rabbit_channel(url).await?;
    channel
        .basic_qos(1000, lapin::options::BasicQosOptions::default())
        .await?;
    let mut deliveries = channel
        .basic_consume(
            RABBIT_QUEUE,
            "bench",
            lapin::options::BasicConsumeOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await?;
    while let Some(delivery) = deliveries.next().await {
        let delivery = delivery?;
        received.record(std::str::from_utf8(&delivery.data).unwrap_or(""));
        delivery
            .ack(lapin::options::BasicAckOptions::default())
            .await?;
    }
    Ok(())
}
