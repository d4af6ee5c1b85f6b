//! The peers with the load model of a Kafka producer: many messages in flight per connection,
//! batched by the client. Redis gets pipelines of `window` `XADD`s (with `appendfsync always`
//! it fsyncs once per pipeline it reads); JetStream gets `window` asynchronous publishes before
//! their acks are awaited. Set next to librdkafka against mmmq's Kafka listener
//! (`bench-peers/kafka/rdkafka-bench.c`, docs/benchmarks.md, "Kafka clients").

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;

use crate::System;
use crate::consumers::stamped;

/// One producer until `deadline`: how many messages the system acknowledged.
async fn one_producer(
    system: System,
    url: &str,
    window: usize,
    message_bytes: usize,
    deadline: Instant,
) -> anyhow::Result<u64> {
    let mut acked = 0;
    match system {
        System::Redis => {
            let mut con = redis::Client::open(url)?
                .get_multiplexed_async_connection()
                .await?;
            while Instant::now() < deadline {
                let mut pipe = redis::pipe();
                for _ in 0..window {
                    pipe.cmd("XADD")
                        .arg("bench")
                        .arg("*")
                        .arg("pad")
                        .arg(stamped(message_bytes));
                }
                let ids: Vec<String> = pipe.query_async(&mut con).await?;
                acked += ids.len() as u64;
            }
        }
        System::Nats => {
            let js = async_nats::jetstream::new(async_nats::connect(url).await?);
            while Instant::now() < deadline {
                let mut pending = Vec::with_capacity(window);
                for _ in 0..window {
                    pending.push(js.publish("bench.p", stamped(message_bytes).into()).await?);
                }
                for ack in pending {
                    ack.await?;
                    acked += 1;
                }
            }
        }
        other => anyhow::bail!("{other:?} has no batched producer here"),
    }
    Ok(acked)
}

/// `producers` batching producers for `seconds`: one JSON line.
pub async fn batched(
    system: System,
    url: &str,
    producers: usize,
    seconds: u64,
    message_bytes: usize,
    window: usize,
) -> anyhow::Result<serde_json::Value> {
    if let System::Nats = system {
        crate::nats_stream(url).await?;
    }
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let tasks: Vec<_> = (0..producers)
        .map(|_| {
            let url = url.to_owned();
            tokio::spawn(
                async move { one_producer(system, &url, window, message_bytes, deadline).await },
            )
        })
        .collect();
    let mut acked = 0;
    for t in tasks {
        acked += t.await?.context("a producer failed")?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    Ok(json!({
        "bench": "peers", "what": "produce-batched", "system": crate::system_name(system),
        "producers": producers, "window": window, "message_bytes": message_bytes,
        "msgs_per_s": (acked as f64 / elapsed).round(),
    }))
}
