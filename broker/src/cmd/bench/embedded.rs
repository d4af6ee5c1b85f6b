//! `mmmq bench embedded`: the broker inside the application, with no HTTP.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{Latencies, RunArgs, scratch_dir};

/// Parameters of `mmmq bench embedded`.
#[derive(Debug, Clone, clap::Args)]
pub struct EmbeddedBench {
    /// Where the scratch files go (on the disk being measured, not tmpfs), how long each
    /// configuration runs, and how big a message is.
    #[command(flatten)]
    pub run: RunArgs,
    /// Producer counts.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    pub producers: Vec<usize>,
    /// Messages in the backlog the no-op handler drains.
    #[arg(long, default_value_t = 100_000)]
    pub backlog: usize,
}

/// The broker inside the application: produce with no HTTP, a stored backlog drained by a no-op
/// in-process handler, and produce-to-handler latency.
pub async fn run(cfg: EmbeddedBench, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    use mmmq::broker::{Broker, ProduceItem};
    use mmmq_core::Topic;
    const LIMIT: usize = 1 << 20;
    let scratch = scratch_dir(&cfg.run.dir)?;
    let broker = Arc::new(Broker::open(mmmq::config::ServeConfig::new(scratch.path())).await?);
    let pad = "x".repeat(cfg.run.message_bytes);
    let clock = Instant::now();
    let item = |topic: &Topic| {
        let content = serde_json::value::RawValue::from_string(format!(
            r#"{{"t":{},"pad":"{pad}"}}"#,
            clock.elapsed().as_secs_f64()
        ))
        .expect("valid JSON");
        ProduceItem::new(topic.as_str(), None, content, LIMIT).expect("a valid message")
    };
    for &p in &cfg.producers {
        let topic = Topic::new(format!("produce.p{p}"))?;
        let deadline = Instant::now() + cfg.run.duration;
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..p {
            let broker = broker.clone();
            let topic = topic.clone();
            let pad = pad.clone();
            tasks.push(tokio::spawn(async move {
                let mut lat = Latencies::default();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let content =
                        serde_json::value::RawValue::from_string(format!(r#"{{"pad":"{pad}"}}"#))
                            .expect("JSON");
                    let item = ProduceItem::new(topic.as_str(), None, content, LIMIT)
                        .expect("a valid message");
                    broker.produce(item).await?;
                    lat.push(t.elapsed());
                }
                Ok::<_, mmmq::broker::BrokerError>(lat)
            }));
        }
        let mut all = Latencies::default();
        for t in tasks {
            all.merge(t.await??);
        }
        let rate = all.len() as f64 / start.elapsed().as_secs_f64();
        writeln!(
            out,
            "{}",
            json!({
                "bench": "embedded", "what": "produce", "producers": p, "message_bytes": cfg.run.message_bytes,
                "msgs_per_s": rate.round(), "p50_us": all.percentile_us(0.5), "p99_us": all.percentile_us(0.99),
            })
        )?;
    }

    // A stored backlog, then a no-op handler registered to drain it.
    let backlog = Topic::new("backlog.t")?;
    let mut left = cfg.backlog;
    while left > 0 {
        let n = left.min(1000);
        broker
            .produce_batch((0..n).map(|_| item(&backlog)).collect())
            .await?;
        left -= n;
    }
    let handled = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let latencies: Arc<parking_lot::Mutex<Latencies>> = Arc::default();
    let start = Instant::now();
    {
        let handled = handled.clone();
        let latencies = latencies.clone();
        broker
            .handle(
                "bench",
                "*.t",
                move |m: mmmq_core::Message<serde_json::Value>| {
                    let handled = handled.clone();
                    let latencies = latencies.clone();
                    async move {
                        if m.topic.as_str() == "live.t"
                            && let Some(t) = m.content["t"].as_f64()
                        {
                            latencies
                                .lock()
                                .push_secs(clock.elapsed().as_secs_f64() - t);
                        }
                        handled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        Ok::<_, String>(())
                    }
                },
            )
            .await?;
    }
    while handled.load(std::sync::atomic::Ordering::Relaxed) < cfg.backlog as u64 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let drain = cfg.backlog as f64 / start.elapsed().as_secs_f64();
    writeln!(
        out,
        "{}",
        json!({
            "bench": "embedded", "what": "drain_backlog", "messages": cfg.backlog,
            "message_bytes": cfg.run.message_bytes, "delivered_msgs_per_s": drain.round(),
        })
    )?;

    // Live: 16 producers, the handler measuring produce-to-handler latency.
    let live = Topic::new("live.t")?;
    let deadline = Instant::now() + cfg.run.duration;
    let mut tasks = Vec::new();
    let produced = Arc::new(std::sync::atomic::AtomicU64::new(0));
    for _ in 0..16 {
        let broker = broker.clone();
        let live = live.clone();
        let produced = produced.clone();
        let pad = pad.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let content = serde_json::value::RawValue::from_string(format!(
                    r#"{{"t":{},"pad":"{pad}"}}"#,
                    clock.elapsed().as_secs_f64()
                ))
                .expect("JSON");
                let item =
                    ProduceItem::new(live.as_str(), None, content, LIMIT).expect("a valid message");
                broker.produce(item).await?;
                produced.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok::<_, mmmq::broker::BrokerError>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let total = produced.load(std::sync::atomic::Ordering::Relaxed);
    while (latencies.lock().len() as u64) < total {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut lat = std::mem::take(&mut *latencies.lock());
    writeln!(
        out,
        "{}",
        json!({
            "bench": "embedded", "what": "end_to_end", "producers": 16, "message_bytes": cfg.run.message_bytes,
            "msgs_per_s": (total as f64 / cfg.run.duration.as_secs_f64()).round(),
            "p50_us_produce_to_handler": lat.percentile_us(0.5), "p99_us_produce_to_handler": lat.percentile_us(0.99),
        })
    )?;
    broker.shutdown().await;
    Ok(())
}
