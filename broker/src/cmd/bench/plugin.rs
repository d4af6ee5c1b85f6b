//! `mmmq bench plugin`: the cost of one `handle` call, and a stored backlog drained through a
//! no-op plugin next to a no-op HTTP consumer in the same run.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{add_dispatcher, scratch_dir, start_broker, wait_delivered};

/// Parameters of `mmmq bench plugin`.
#[derive(Debug, Clone, clap::Args)]
pub struct PluginBench {
    /// A component that ACKs everything (`tests/plugins/noop`).
    #[arg(long, default_value = "target/wasm32-wasip2/plugin/noop.wasm")]
    pub wasm: PathBuf,
    /// Where the broker's temporary root dir goes.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Calls per call-cost measurement.
    #[arg(long, default_value_t = 100_000)]
    pub calls: usize,
    /// Messages in the backlog each target drains.
    #[arg(long, default_value_t = 50_000)]
    pub backlog: usize,
    /// Content size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub message_bytes: usize,
}

/// The cost of one `handle` call (reused instance and instance per message), then a stored
/// backlog drained through the plugin versus through a no-op HTTP consumer in the same run.
pub async fn run(cfg: PluginBench, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    use mmmq::plugin::runtime::{Call, Instance, Limits, PluginEngine};
    let bytes = std::fs::read(&cfg.wasm)?;
    let calls = cfg.calls;
    let size = cfg.message_bytes;
    let costs = tokio::task::spawn_blocking(move || -> anyhow::Result<(f64, f64, f64)> {
        let engine = PluginEngine::new()?;
        let t = Instant::now();
        let compiled = engine.compile(&bytes)?;
        let compile_ms = t.elapsed().as_secs_f64() * 1e3;
        let limits = Limits {
            max_memory_bytes: 64 << 20,
            timeout: Duration::from_secs(1),
            max_message_bytes: 1 << 20,
        };
        let log = mmmq::plugin::GuestLog::new("bench", None);
        let message = Call {
            topic: "bench".into(),
            partition: 0,
            offset: 0,
            timestamp: 0,
            key: None,
            id: None,
            attempt: 1,
            content: format!(r#"{{"pad":"{}"}}"#, "x".repeat(size.saturating_sub(10))),
        };
        let grants = mmmq::plugin::Grants::default();
        let mut instance = Instance::new(&engine, &compiled, limits, &log, &grants)?;
        instance.handle(&message)?;
        let t = Instant::now();
        for _ in 0..calls {
            instance.handle(&message)?;
        }
        let reuse_us = t.elapsed().as_secs_f64() * 1e6 / calls as f64;
        let fresh_calls = (calls / 10).max(100);
        let t = Instant::now();
        for _ in 0..fresh_calls {
            Instance::new(&engine, &compiled, limits, &log, &grants)?.handle(&message)?;
        }
        let fresh_us = t.elapsed().as_secs_f64() * 1e6 / fresh_calls as f64;
        Ok((compile_ms, reuse_us, fresh_us))
    })
    .await??;
    writeln!(
        out,
        "{}",
        json!({
            "bench": "plugin", "what": "call_cost", "message_bytes": size, "compile_ms": costs.0,
            "reused_instance_us_per_call": costs.1, "instance_per_message_us_per_call": costs.2,
            "ratio_fresh_to_reused": costs.2 / costs.1,
        })
    )?;

    // Delivery: a stored backlog drained through a plugin dispatcher and through an HTTP
    // dispatcher, each added by a reload once the backlog is there, in the same run.
    let scratch = scratch_dir(&cfg.dir)?;
    let root = scratch.path().join("root");
    std::fs::create_dir_all(root.join("plugins"))?;
    std::fs::copy(&cfg.wasm, root.join("plugins/noop.wasm"))?;
    let consumer = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let consumer_port = consumer.local_addr()?.port();
    let app = axum::Router::new().route(
        "/mmmq/messages",
        axum::routing::post(|| async { r#"{"ack":"ACK"}"# }),
    );
    tokio::spawn(async move { axum::serve(consumer, app).await });
    let (base, stop, server) = start_broker(&root).await?;
    let client = reqwest::Client::new();
    let pad = "x".repeat(cfg.message_bytes);
    let one = format!(r#"{{"topic":"backlog","content":{{"pad":"{pad}"}}}}"#);
    let batch = format!("[{}]", vec![one; 100].join(","));
    for _ in 0..cfg.backlog / 100 {
        let r = client
            .post(format!("{base}/mmmq/messages/batch"))
            .header("content-type", "application/json")
            .body(batch.clone())
            .send()
            .await?;
        anyhow::ensure!(r.status() == 200, "backlog produce answered {}", r.status());
    }
    let backlog = (cfg.backlog / 100 * 100) as u64;
    let mut rates = serde_json::Map::new();
    let mut dispatchers = Vec::new();
    for (id, target) in [
        ("plugin", json!({"plugin": {"path": "plugins/noop.wasm"}})),
        (
            "http",
            json!({"host": {"protocol": "HTTP", "address": "127.0.0.1", "port": consumer_port}}),
        ),
    ] {
        let mut d = json!({"consumerId": id, "pattern": "backlog"});
        for (k, v) in target.as_object().expect("object") {
            d[k] = v.clone();
        }
        let start = add_dispatcher(&client, &base, &root, &mut dispatchers, d).await?;
        wait_delivered(&client, &base, id, backlog, Duration::from_secs(300)).await?;
        let rate = backlog as f64 / start.elapsed().as_secs_f64();
        rates.insert(id.to_owned(), json!(rate));
        writeln!(
            out,
            "{}",
            json!({
                "bench": "plugin", "what": "drain_backlog", "via": id, "messages": backlog,
                "message_bytes": cfg.message_bytes, "delivered_msgs_per_s": rate.round(),
            })
        )?;
    }
    if let (Some(p), Some(h)) = (rates["plugin"].as_f64(), rates["http"].as_f64()) {
        writeln!(
            out,
            "{}",
            json!({"bench": "plugin", "what": "ratios", "plugin_vs_http_drain": p / h})
        )?;
    }
    stop.cancel();
    let _ = server.await;
    Ok(())
}
