//! `mmmq bench router`: what the 0.2.0 world costs with real work (issue 17's goals): the call cost
//! of the `router` example (one emit per message), a stored backlog drained through it (every
//! message routed, exactly once, to another topic) next to the no-op plugin in the same run, and
//! how long a deploy takes to serve.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{Latencies, add_dispatcher, scratch_dir, start_broker, wait_delivered};

/// Parameters of `mmmq bench router`.
#[derive(Debug, Clone, clap::Args)]
pub struct RouterBench {
    /// The router example (`plugins/router`).
    #[arg(long, default_value = "target/wasm32-wasip2/plugin/router.wasm")]
    pub wasm: PathBuf,
    /// A component that ACKs everything and emits nothing (`tests/plugins/noop`), the baseline.
    #[arg(long, default_value = "target/wasm32-wasip2/plugin/noop.wasm")]
    pub noop_wasm: PathBuf,
    /// Where the broker's temporary root dir goes.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Calls per call-cost measurement.
    #[arg(long, default_value_t = 100_000)]
    pub calls: usize,
    /// Messages in the backlog each plugin drains.
    #[arg(long, default_value_t = 1_000_000)]
    pub backlog: usize,
    /// Content size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub message_bytes: usize,
    /// Deploys timed.
    #[arg(long, default_value_t = 10)]
    pub deploys: usize,
}

/// Runs the three measurements.
pub async fn run(cfg: RouterBench, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let router = std::fs::read(&cfg.wasm)?;
    let content = format!(
        r#"{{"type":"eu","pad":"{}"}}"#,
        "x".repeat(cfg.message_bytes.saturating_sub(22))
    );
    call_cost(&cfg, router.clone(), content.clone(), out).await?;

    let scratch = scratch_dir(&cfg.dir)?;
    let root = scratch.path().join("root");
    std::fs::create_dir_all(root.join("plugins"))?;
    std::fs::write(root.join("plugins/router.wasm"), &router)?;
    std::fs::copy(&cfg.noop_wasm, root.join("plugins/noop.wasm"))?;
    let (base, stop, server) = start_broker(&root).await?;
    let client = reqwest::Client::new();
    let backlog = produce_backlog(&client, &base, "orders", &content, cfg.backlog).await?;

    // Drains: each dispatcher added by a reload once the backlog is stored.
    let mut dispatchers = Vec::new();
    let mut rates = Vec::new();
    for (id, plugin) in [
        ("noop", json!({"path": "plugins/noop.wasm"})),
        (
            "router",
            json!({"path": "plugins/router.wasm", "config": {"prefix": "routed."}}),
        ),
    ] {
        let d = json!({"consumerId": id, "pattern": "orders", "plugin": plugin});
        let start = add_dispatcher(&client, &base, &root, &mut dispatchers, d).await?;
        let done = wait_delivered(&client, &base, id, backlog, Duration::from_secs(600)).await?;
        // The router is done when its outputs are stored, not when its calls are.
        let mut routed = stored(&client, &base, "routed.eu").await?;
        while id == "router" && routed < done {
            tokio::time::sleep(Duration::from_millis(2)).await;
            routed = stored(&client, &base, "routed.eu").await?;
        }
        let rate = done as f64 / start.elapsed().as_secs_f64();
        rates.push(rate);
        writeln!(
            out,
            "{}",
            json!({
                "bench": "router", "what": "drain_backlog", "via": id, "messages": done,
                "message_bytes": cfg.message_bytes, "delivered_msgs_per_s": rate.round(),
                "routed_eu": routed,
            })
        )?;
    }
    writeln!(
        out,
        "{}",
        json!({"bench": "router", "what": "ratios", "router_vs_noop_drain": rates[1] / rates[0]})
    )?;

    deploy_to_serving(&cfg, &client, &base, &root, &router, out).await?;
    stop.cancel();
    let _ = server.await;
    Ok(())
}

/// `handle` plus taking its emit, on a reused instance, with the router's config.
async fn call_cost(
    cfg: &RouterBench,
    bytes: Vec<u8>,
    content: String,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    use mmmq::plugin::runtime::{Call, Instance, Limits, PluginEngine};
    let calls = cfg.calls;
    let us = tokio::task::spawn_blocking(move || -> anyhow::Result<f64> {
        let engine = PluginEngine::new()?;
        let compiled = engine.compile(&bytes)?;
        let limits = Limits {
            max_memory_bytes: 64 << 20,
            timeout: Duration::from_secs(1),
            max_message_bytes: 1 << 20,
        };
        let log = mmmq::plugin::GuestLog::new("bench", None);
        let grants = mmmq::plugin::Grants::default();
        let mut instance = Instance::new(&engine, &compiled, limits, &log, &grants)?;
        let message = Call {
            topic: "orders".into(),
            partition: 0,
            offset: 0,
            timestamp: 0,
            key: Some("customer-42".into()),
            id: None,
            attempt: 1,
            content,
        };
        let mut emitted = 0;
        let t = Instant::now();
        for _ in 0..calls {
            instance.handle(&message)?;
            emitted += instance.take_emits().len();
        }
        anyhow::ensure!(emitted == calls, "the router emitted {emitted} for {calls}");
        Ok(t.elapsed().as_secs_f64() * 1e6 / calls as f64)
    })
    .await??;
    writeln!(
        out,
        "{}",
        json!({
            "bench": "router", "what": "call_cost", "world": "mmmq:plugin/handler@0.2.0",
            "message_bytes": cfg.message_bytes, "reused_instance_us_per_call_with_one_emit": us,
        })
    )?;
    Ok(())
}

/// Stores `n` messages (rounded down to whole batches of 1,000) in `topic`, four batches in
/// flight.
async fn produce_backlog(
    client: &reqwest::Client,
    base: &str,
    topic: &str,
    content: &str,
    n: usize,
) -> anyhow::Result<u64> {
    let one = format!(r#"{{"topic":"{topic}","key":"customer-42","content":{content}}}"#);
    let batch = format!("[{}]", vec![one; 1000].join(","));
    let batches = n / 1000;
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..4 {
        let (client, url, batch) = (
            client.clone(),
            format!("{base}/mmmq/messages/batch"),
            batch.clone(),
        );
        tasks.spawn(async move {
            for _ in (w..batches).step_by(4) {
                let r = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(batch.clone())
                    .send()
                    .await?;
                anyhow::ensure!(r.status() == 200, "backlog produce answered {}", r.status());
            }
            Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok((batches * 1000) as u64)
}

/// Messages stored in `topic`, over its partitions.
async fn stored(client: &reqwest::Client, base: &str, topic: &str) -> anyhow::Result<u64> {
    let t: serde_json::Value = client
        .get(format!("{base}/mmmq/topics/{topic}"))
        .send()
        .await?
        .json()
        .await?;
    let partitions = t["partitions"].as_array().cloned().unwrap_or_default();
    Ok(partitions
        .iter()
        .filter_map(|p| p["nextOffset"].as_u64())
        .sum())
}

/// Deploys new versions of the router (its bytes plus a custom section, so each is a new version
/// compiled from scratch) to a dispatcher naming it: how long `PUT /mmmq/plugins/{name}` takes
/// (validation, storage, the switch), and how long until a message produced right after is
/// handled by it.
async fn deploy_to_serving(
    cfg: &RouterBench,
    client: &reqwest::Client,
    base: &str,
    root: &std::path::Path,
    router: &[u8],
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let mut dispatchers: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(root.join("dispatchers.json"))?)?;
    dispatchers.push(json!({"consumerId": "live", "pattern": "live",
        "plugin": {"name": "rt", "config": {"prefix": "live."}}}));
    std::fs::write(
        root.join("dispatchers.json"),
        serde_json::Value::Array(dispatchers).to_string(),
    )?;
    client
        .post(format!("{base}/mmmq/admin/reload"))
        .send()
        .await?;
    let (mut put, mut serving) = (Latencies::default(), Latencies::default());
    for i in 0..cfg.deploys {
        let mut bytes = router.to_vec();
        let name = b"mmmq-bench";
        bytes.extend_from_slice(&[0, (1 + name.len() + 8) as u8, name.len() as u8]);
        bytes.extend_from_slice(name);
        bytes.extend_from_slice(&(i as u64).to_le_bytes());
        let t = Instant::now();
        let r = client
            .put(format!("{base}/mmmq/plugins/rt"))
            .header("content-type", "application/wasm")
            .body(bytes)
            .send()
            .await?;
        anyhow::ensure!(r.status() == 200, "deploy answered {}", r.status());
        put.push(t.elapsed());
        let r = client
            .post(format!("{base}/mmmq/messages"))
            .header("content-type", "application/json")
            .body(r#"{"topic":"live","content":{"type":"x"}}"#)
            .send()
            .await?;
        anyhow::ensure!(r.status() == 200, "produce answered {}", r.status());
        wait_delivered(client, base, "live", i as u64 + 1, Duration::from_secs(60)).await?;
        serving.push(t.elapsed());
    }
    writeln!(
        out,
        "{}",
        json!({
            "bench": "router", "what": "deploy_to_serving", "deploys": cfg.deploys,
            "component_bytes": router.len(),
            "put_ms_p50": put.percentile_us(0.5) / 1e3, "put_ms_max": put.percentile_us(1.0) / 1e3,
            "first_message_handled_ms_p50": serving.percentile_us(0.5) / 1e3,
            "first_message_handled_ms_max": serving.percentile_us(1.0) / 1e3,
        })
    )?;
    Ok(())
}
