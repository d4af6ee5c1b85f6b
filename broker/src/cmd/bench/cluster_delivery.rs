//! `mmmq bench cluster --parts delivery` (docs/benchmarks.md, "A cluster"): end to end through a
//! remote HTTP consumer, a single broker next to the cluster in the same run, then the
//! messages the cluster delivers again after a SIGKILL of the partition's leader, next to what
//! one checkpoint interval ACKs (contract §13, "Delivery in a cluster").

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Latencies;
use super::cluster::{ClusterBench, Nodes, http_load_owned, leader_of};

/// Producers of the end-to-end runs (issue 32's goal names 16).
const PRODUCERS: usize = 16;
/// The dispatchers' checkpoint interval (the default).
const INTERVAL: Duration = Duration::from_millis(50);

/// What the consumer saw.
#[derive(Default)]
struct Seen {
    /// Produce → consumer latency of each delivery.
    latencies: Latencies,
    /// Deliveries per (topic, partition, offset).
    times: HashMap<(String, u64, u64), u32>,
    /// When each delivery arrived (seconds on the bench's clock), in order.
    at: Vec<f64>,
}

impl Seen {
    fn delivered(&self) -> usize {
        self.at.len()
    }

    fn repeated(&self) -> u64 {
        self.times.values().map(|n| u64::from(n - 1)).sum()
    }
}

/// A consumer answering ACK to every envelope, recording it.
async fn consumer(clock: Instant) -> anyhow::Result<(u16, Arc<parking_lot::Mutex<Seen>>)> {
    let seen: Arc<parking_lot::Mutex<Seen>> = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let recorder = seen.clone();
    let app = axum::Router::new().route(
        "/mmmq/messages",
        axum::routing::post(move |body: bytes::Bytes| {
            let recorder = recorder.clone();
            async move {
                let now = clock.elapsed().as_secs_f64();
                let envelopes = match serde_json::from_slice::<Value>(&body) {
                    Ok(Value::Array(a)) => a,
                    Ok(one) => vec![one],
                    Err(_) => Vec::new(),
                };
                let mut s = recorder.lock();
                for e in envelopes {
                    if let Some(sent) = e["content"]["t"].as_f64() {
                        s.latencies.push_secs(now - sent);
                    }
                    let key = (
                        e["topic"].as_str().unwrap_or_default().to_owned(),
                        e["partition"].as_u64().unwrap_or(0),
                        e["offset"].as_u64().unwrap_or(0),
                    );
                    *s.times.entry(key).or_default() += 1;
                    s.at.push(now);
                }
                r#"{"ack":"ACK"}"#
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((port, seen))
}

/// `dispatchers.json` in broker 1's root, reloaded (a cluster applies it everywhere).
async fn configure(
    nodes: &Nodes,
    http: &reqwest::Client,
    pattern: &str,
    port: u16,
) -> anyhow::Result<()> {
    let spec = json!([{"consumerId": "bench", "pattern": pattern,
        "host": {"protocol": "HTTP", "address": "127.0.0.1", "port": port}}]);
    std::fs::write(nodes.root(1).join("dispatchers.json"), spec.to_string())?;
    let r = http
        .post(format!("{}/mmmq/admin/reload", nodes.url(1)))
        .send()
        .await?;
    anyhow::ensure!(r.status() == 200, "reload: {}", r.text().await?);
    Ok(())
}

/// Waits until the consumer got `n` distinct messages (at most 60 s).
async fn drained(seen: &parking_lot::Mutex<Seen>, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while (seen.lock().times.len() as u64) < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One end-to-end run on `topic`: produced, delivered per second, latency.
async fn end_to_end(
    nodes: &Nodes,
    cfg: &ClusterBench,
    clock: Instant,
    seen: &parking_lot::Mutex<Seen>,
    topic: &str,
) -> anyhow::Result<(f64, f64, f64, f64)> {
    *seen.lock() = Seen::default();
    let pad = "x".repeat(cfg.run.message_bytes);
    let r = http_load_owned(
        nodes.urls(),
        PRODUCERS,
        cfg.run.duration,
        clock,
        topic.to_owned(),
        pad,
    )
    .await?;
    drained(seen, r.count).await;
    let mut s = std::mem::take(&mut *seen.lock());
    let end = s.at.last().copied().unwrap_or(r.started_at);
    let delivered = s.times.len() as f64 / (end - r.started_at).max(1e-9);
    Ok((
        r.rate(),
        delivered,
        s.latencies.percentile_us(0.5),
        s.latencies.percentile_us(0.99),
    ))
}

/// The delivery part.
pub(super) async fn delivery(
    cfg: &ClusterBench,
    dir: &Path,
    http: &reqwest::Client,
) -> anyhow::Result<Value> {
    let clock = Instant::now();
    let (port, seen) = consumer(clock).await?;
    let single = Nodes::start(&dir.join("single"), 1, false, http).await?;
    configure(&single, http, "e2e.*", port).await?;
    single
        .put_topic(http, "e2e.single", json!({"partitions": 1}))
        .await?;
    let (s_produced, s_delivered, s_p50, s_p99) =
        end_to_end(&single, cfg, clock, &seen, "e2e.single").await?;
    drop(single);

    let mut cluster = Nodes::start(&dir.join("cluster"), cfg.brokers, true, http).await?;
    cluster
        .put_topic(http, "e2e.cluster", json!({"partitions": 1}))
        .await?;
    configure(&cluster, http, "e2e.*", port).await?;
    cluster.settled(http).await?;
    let (c_produced, c_delivered, c_p50, c_p99) =
        end_to_end(&cluster, cfg, clock, &seen, "e2e.cluster").await?;

    // A failover mid-stream: what is delivered twice, next to what one checkpoint interval
    // ACKs at the rate of the second before the kill.
    *seen.lock() = Seen::default();
    cluster
        .put_topic(http, "e2e.failover", json!({"partitions": 1}))
        .await?;
    let view = cluster.settled(http).await?;
    let leader = leader_of(&view, "e2e.failover").ok_or_else(|| anyhow::anyhow!("no leader"))?;
    let survivors: Vec<String> = (1..=cfg.brokers)
        .filter(|b| *b != leader)
        .map(|b| cluster.url(b))
        .collect();
    let pad = "x".repeat(cfg.run.message_bytes);
    let load = tokio::spawn(http_load_owned(
        survivors,
        PRODUCERS,
        cfg.run.duration,
        clock,
        "e2e.failover".to_owned(),
        pad,
    ));
    tokio::time::sleep(cfg.run.duration / 2).await;
    let killed_at = clock.elapsed().as_secs_f64();
    cluster.kill(leader);
    let r = load.await??;
    drained(&seen, r.count).await;
    let s = std::mem::take(&mut *seen.lock());
    let last_second =
        s.at.iter()
            .filter(|t| (killed_at - 1.0..killed_at).contains(*t))
            .count() as f64;
    let per_interval = last_second * INTERVAL.as_secs_f64();
    Ok(json!({
        "bench": "cluster", "what": "delivery", "brokers": cfg.brokers, "producers": PRODUCERS,
        "message_bytes": cfg.run.message_bytes, "partitions": 1,
        "single_produced_msg_s": s_produced.round(), "single_delivered_msg_s": s_delivered.round(),
        "single_p50_us_produce_to_consumer": s_p50, "single_p99_us_produce_to_consumer": s_p99,
        "cluster_produced_msg_s": c_produced.round(), "cluster_delivered_msg_s": c_delivered.round(),
        "cluster_p50_us_produce_to_consumer": c_p50, "cluster_p99_us_produce_to_consumer": c_p99,
        "ratio_delivered": c_delivered / s_delivered,
        "failover": {
            "delivered": s.delivered(), "distinct": s.times.len(), "redelivered": s.repeated(),
            "acked_per_checkpoint_interval": per_interval.round(),
            "checkpoint_interval_ms": INTERVAL.as_millis() as u64,
        },
        "note": "producers spread over every broker (the failover run over the survivors); the consumer ACKs every envelope; redelivered counts the envelopes delivered more than once after the leader's SIGKILL",
    }))
}
