//! `mmmq bench`: benchmarks that print one JSON object per line, so runs can be compared and
//! recorded (docs/benchmarks.md). Machines here are shared and noisy: every run measures its own
//! baselines (the raw disk) so results are read as ratios taken in the same run.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::storage::{FlushMode, Log, LogConfig, OsFs, StorageError};

/// Parameters of `mmmq bench storage`.
#[derive(Debug, Clone, clap::Args)]
pub struct StorageBench {
    /// Where the temporary logs go (must be on the disk being measured, not tmpfs).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// How long each configuration runs.
    #[arg(long = "seconds", value_parser = parse_seconds, default_value = "3")]
    pub duration: Duration,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub message_bytes: usize,
    /// Concurrent appender counts to try.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    pub appenders: Vec<usize>,
    /// Flush modes to try.
    #[arg(long, value_delimiter = ',', default_value = "group,per-append,none")]
    pub modes: Vec<FlushMode>,
}

/// A temporary directory under `dir` (created if missing) for one run's files, removed afterwards.
fn scratch_dir(dir: &Path) -> std::io::Result<tempfile::TempDir> {
    std::fs::create_dir_all(dir)?;
    tempfile::Builder::new()
        .prefix("mmmq-bench-")
        .tempdir_in(dir)
}

/// Seconds (fractions allowed) as a duration, for `--seconds`.
fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|e| format!("{s:?} is not a number of seconds: {e}"))?;
    Duration::try_from_secs_f64(secs).map_err(|e| e.to_string())
}

fn mode_name(mode: FlushMode) -> &'static str {
    match mode {
        FlushMode::GroupCommit => "group",
        FlushMode::PerAppend => "per-append",
        FlushMode::NoSync => "none",
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

/// Runs the storage benchmark, printing JSON lines to `out`.
pub async fn storage(cfg: StorageBench, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let scratch = scratch_dir(&cfg.dir)?;
    let mb = cfg.message_bytes as f64 / 1e6;

    // Baselines: what the disk itself allows, same run, same directory.
    let mut disk = serde_json::Map::new();
    for per_sync in [1usize, 64] {
        let path = scratch.path().join(format!("raw-{per_sync}"));
        let d = cfg.duration;
        let size = cfg.message_bytes;
        let rate =
            tokio::task::spawn_blocking(move || raw_fdatasync_appends(&path, size, per_sync, d))
                .await??;
        disk.insert(
            format!("appends_per_s_{per_sync}_per_sync"),
            json!(rate.round()),
        );
        writeln!(
            out,
            "{}",
            json!({"bench": "storage", "what": "disk", "appends_per_sync": per_sync,
                   "message_bytes": size, "appends_per_s": rate.round(), "mb_per_s": rate * mb})
        )?;
    }

    let mut results = Vec::new();
    for &mode in &cfg.modes {
        for &n in &cfg.appenders {
            let dir = scratch.path().join(format!("{}-{n}", mode_name(mode)));
            let r = run_appenders(&dir, mode, n, cfg.message_bytes, cfg.duration).await?;
            let line = json!({
                "bench": "storage", "what": "append", "mode": mode_name(mode), "appenders": n,
                "message_bytes": cfg.message_bytes, "appends": r.count,
                "seconds": r.elapsed.as_secs_f64(), "appends_per_s": r.rate().round(),
                "mb_per_s": r.rate() * mb, "p50_us": r.p50_us, "p99_us": r.p99_us,
            });
            writeln!(out, "{line}")?;
            results.push((mode, n, r.rate(), dir));
        }
    }

    // Sequential read of the largest log written.
    if let Some((_, _, _, dir)) = results.iter().max_by(|a, b| {
        let size =
            |d: &Path| std::fs::metadata(d.join("0000000000000000000.mmm")).map_or(0, |m| m.len());
        size(&a.3).cmp(&size(&b.3))
    }) {
        let dir = dir.clone();
        let (bytes, secs) = tokio::task::spawn_blocking(move || sequential_read(&dir)).await??;
        writeln!(
            out,
            "{}",
            json!({"bench": "storage", "what": "sequential_read", "bytes": bytes,
                   "seconds": secs, "mb_per_s": bytes as f64 / 1e6 / secs})
        )?;
    }

    let rate = |mode, n| {
        results
            .iter()
            .find(|r| r.0 == mode && r.1 == n)
            .map(|r| r.2)
    };
    let mut ratios = serde_json::Map::new();
    for &n in &cfg.appenders {
        if let (Some(g), Some(p)) = (
            rate(FlushMode::GroupCommit, n),
            rate(FlushMode::PerAppend, n),
        ) {
            ratios.insert(format!("group_vs_per_append_{n}"), json!(g / p));
        }
        if let Some(g) = rate(FlushMode::GroupCommit, n) {
            let per_sync = if n == 1 { 1 } else { 64 };
            if let Some(d) = disk
                .get(&format!("appends_per_s_{per_sync}_per_sync"))
                .and_then(|v| v.as_f64())
            {
                ratios.insert(
                    format!("group_{n}_vs_disk_{per_sync}_per_sync"),
                    json!(g / d),
                );
            }
        }
    }
    writeln!(
        out,
        "{}",
        json!({"bench": "storage", "what": "ratios", "ratios": ratios})
    )?;
    Ok(())
}

struct RunResult {
    count: u64,
    elapsed: Duration,
    p50_us: f64,
    p99_us: f64,
}

impl RunResult {
    fn rate(&self) -> f64 {
        self.count as f64 / self.elapsed.as_secs_f64()
    }
}

async fn run_appenders(
    dir: &Path,
    mode: FlushMode,
    appenders: usize,
    size: usize,
    duration: Duration,
) -> Result<RunResult, StorageError> {
    let config = LogConfig {
        flush: mode,
        ..LogConfig::default()
    };
    let d = dir.to_owned();
    let log = tokio::task::spawn_blocking(move || Log::open(&d, Arc::new(OsFs), config))
        .await
        .expect("open task")?;
    let payload: Arc<[u8]> = vec![b'x'; size].into();
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for _ in 0..appenders {
        let log = log.clone();
        let payload = payload.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                log.append(&payload).await?;
                lat.push(t.elapsed());
            }
            Ok::<_, StorageError>(lat)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("appender task")?);
    }
    let elapsed = start.elapsed();
    all.sort_unstable();
    Ok(RunResult {
        count: all.len() as u64,
        elapsed,
        p50_us: percentile(&all, 0.50),
        p99_us: percentile(&all, 0.99),
    })
}

/// Appends `size`-byte records to a plain file, `fdatasync` after every `per_sync` of them.
fn raw_fdatasync_appends(
    path: &Path,
    size: usize,
    per_sync: usize,
    duration: Duration,
) -> std::io::Result<f64> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(path)?;
    let chunk = vec![b'x'; size * per_sync];
    let start = Instant::now();
    let mut pos = 0u64;
    let mut count = 0u64;
    while start.elapsed() < duration {
        file.write_all_at(&chunk, pos)?;
        file.sync_data()?;
        pos += chunk.len() as u64;
        count += per_sync as u64;
    }
    Ok(count as f64 / start.elapsed().as_secs_f64())
}

fn sequential_read(dir: &Path) -> Result<(u64, f64), StorageError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| StorageError::io(dir, e))?;
    let _guard = rt.enter();
    let log = Log::open(dir, Arc::new(OsFs), LogConfig::default())?;
    let start = Instant::now();
    let mut offset = 0;
    let mut bytes = 0u64;
    loop {
        let entries = log.read_from(offset, 1000, 4 << 20)?;
        let Some(last) = entries.last() else { break };
        offset = last.offset + 1;
        for e in &entries {
            bytes += e.payload.as_ref().map_or(0, |p| p.len() as u64);
        }
    }
    Ok((bytes, start.elapsed().as_secs_f64().max(1e-9)))
}

/// Parameters of `mmmq bench http`.
#[derive(Debug, Clone, clap::Args)]
pub struct HttpBench {
    /// Where the broker's temporary root dir goes.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// How long each configuration runs.
    #[arg(long = "seconds", value_parser = parse_seconds, default_value = "3")]
    pub duration: Duration,
    /// Content size in bytes (the JSON string's length).
    #[arg(long, default_value_t = 1024)]
    pub message_bytes: usize,
    /// Producer counts for single-message produce.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    pub producers: Vec<usize>,
    /// Producers of the end-to-end run.
    #[arg(long, default_value_t = 16)]
    pub e2e_producers: usize,
}

/// Durable produce over HTTP (1 and 64 keep-alive clients), batch produce, and end to end through
/// a no-op HTTP consumer, each next to the storage engine alone in the same run.
pub async fn http(cfg: HttpBench, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let scratch = scratch_dir(&cfg.dir)?;
    let mb = cfg.message_bytes as f64 / 1e6;

    // The consumer: answers ACK and records when each message arrived.
    let started = Instant::now();
    let received: Arc<parking_lot::Mutex<Vec<f64>>> = Arc::default();
    let consumer = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let consumer_port = consumer.local_addr()?.port();
    {
        let received = received.clone();
        let app = axum::Router::new().route(
            "/mmmq/messages",
            axum::routing::post(move |body: bytes::Bytes| {
                let received = received.clone();
                async move {
                    let now = started.elapsed().as_secs_f64();
                    if let Ok(env) = serde_json::from_slice::<serde_json::Value>(&body)
                        && let Some(sent) = env["content"]["t"].as_f64()
                    {
                        received.lock().push(now - sent);
                    }
                    r#"{"ack":"ACK"}"#
                }
            }),
        );
        tokio::spawn(async move { axum::serve(consumer, app).await });
    }
    let root = scratch.path().join("root");
    std::fs::create_dir_all(&root)?;
    std::fs::write(
        root.join("dispatchers.json"),
        json!([{"consumerId": "bench", "pattern": "e2e.*",
                "host": {"protocol": "HTTP", "address": "127.0.0.1", "port": consumer_port}}])
        .to_string(),
    )?;
    let (base, stop, server) = start_broker(&root).await?;

    let pad = "x".repeat(cfg.message_bytes);
    for &p in &cfg.producers {
        let topic = format!("produce.p{p}");
        let r = http_load(&base, p, cfg.duration, started, 1, &topic, &pad).await?;
        let storage = run_appenders(
            &scratch.path().join(format!("storage-{p}")),
            FlushMode::GroupCommit,
            p,
            cfg.message_bytes,
            cfg.duration,
        )
        .await?;
        writeln!(
            out,
            "{}",
            json!({
                "bench": "http", "what": "produce", "producers": p, "message_bytes": cfg.message_bytes,
                "msgs_per_s": r.rate().round(), "mb_per_s": r.rate() * mb, "p50_us": r.p50_us, "p99_us": r.p99_us,
                "storage_alone_msgs_per_s": storage.rate().round(), "ratio_to_storage": r.rate() / storage.rate(),
            })
        )?;
    }
    let r = http_load(&base, 8, cfg.duration, started, 100, "batch.t", &pad).await?;
    writeln!(
        out,
        "{}",
        json!({
            "bench": "http", "what": "batch_produce", "producers": 8, "batch": 100, "message_bytes": cfg.message_bytes,
            "msgs_per_s": r.rate().round(), "mb_per_s": r.rate() * mb, "p50_us_per_request": r.p50_us, "p99_us_per_request": r.p99_us,
        })
    )?;

    received.lock().clear();
    let r = http_load(
        &base,
        cfg.e2e_producers,
        cfg.duration,
        started,
        1,
        "e2e.t",
        &pad,
    )
    .await?;
    // Wait for the consumer to drain what was produced.
    let deadline = Instant::now() + Duration::from_secs(60);
    while (received.lock().len() as u64) < r.count && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drain_end = started.elapsed().as_secs_f64();
    let mut lat: Vec<Duration> = received
        .lock()
        .iter()
        .map(|s| Duration::from_secs_f64(s.max(0.0)))
        .collect();
    lat.sort_unstable();
    writeln!(
        out,
        "{}",
        json!({
            "bench": "http", "what": "end_to_end", "producers": cfg.e2e_producers, "message_bytes": cfg.message_bytes,
            "produced": r.count, "delivered": lat.len(), "produce_msgs_per_s": r.rate().round(),
            "delivered_msgs_per_s": (lat.len() as f64 / (drain_end - r.started_at)).round(),
            "p50_us_produce_to_consumer": percentile(&lat, 0.5), "p99_us_produce_to_consumer": percentile(&lat, 0.99),
        })
    )?;
    stop.cancel();
    let _ = server.await;
    Ok(())
}

struct LoadResult {
    count: u64,
    elapsed: Duration,
    started_at: f64,
    p50_us: f64,
    p99_us: f64,
}

impl LoadResult {
    fn rate(&self) -> f64 {
        self.count as f64 / self.elapsed.as_secs_f64()
    }
}

/// `producers` clients, each with its own connection and one request in flight, for `duration`.
async fn http_load(
    base: &str,
    producers: usize,
    duration: Duration,
    clock: Instant,
    batch: usize,
    topic: &str,
    pad: &str,
) -> anyhow::Result<LoadResult> {
    let started_at = clock.elapsed().as_secs_f64();
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for _ in 0..producers {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(1)
            .build()?;
        let url = if batch == 1 {
            format!("{base}/mmmq/messages")
        } else {
            format!("{base}/mmmq/messages/batch")
        };
        let topic = topic.to_owned();
        let pad = pad.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let t = clock.elapsed().as_secs_f64();
                let one = format!(r#"{{"topic":"{topic}","content":{{"t":{t},"pad":"{pad}"}}}}"#);
                let body = if batch == 1 {
                    one
                } else {
                    format!("[{}]", vec![one; batch].join(","))
                };
                let sent = Instant::now();
                let r = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await?;
                anyhow::ensure!(r.status() == 200, "produce answered {}", r.status());
                r.bytes().await?;
                lat.push(sent.elapsed());
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let elapsed = start.elapsed();
    all.sort_unstable();
    Ok(LoadResult {
        count: (all.len() * batch) as u64,
        elapsed,
        started_at,
        p50_us: percentile(&all, 0.5),
        p99_us: percentile(&all, 0.99),
    })
}

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
pub async fn plugin(cfg: PluginBench, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    use crate::plugin::runtime::{Instance, Limits, PluginEngine, WitMessage};
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
        };
        let log = crate::plugin::runtime::bench_log();
        let message = WitMessage {
            topic: "bench".into(),
            offset: 0,
            timestamp: 0,
            key: None,
            content: format!(r#"{{"pad":"{}"}}"#, "x".repeat(size.saturating_sub(10))),
        };
        let mut instance = Instance::new(&engine, &compiled, limits, &log)?;
        instance.handle(&message)?;
        let t = Instant::now();
        for _ in 0..calls {
            instance.handle(&message)?;
        }
        let reuse_us = t.elapsed().as_secs_f64() * 1e6 / calls as f64;
        let fresh_calls = (calls / 10).max(100);
        let t = Instant::now();
        for _ in 0..fresh_calls {
            Instance::new(&engine, &compiled, limits, &log)?.handle(&message)?;
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
        dispatchers.push(d);
        std::fs::write(
            root.join("dispatchers.json"),
            serde_json::Value::Array(dispatchers.clone()).to_string(),
        )?;
        let start = Instant::now();
        let r = client
            .post(format!("{base}/mmmq/admin/reload"))
            .send()
            .await?;
        anyhow::ensure!(r.status() == 200, "reload answered {}", r.status());
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let status: serde_json::Value = client
                .get(format!("{base}/mmmq/dispatchers"))
                .send()
                .await?
                .json()
                .await?;
            let delivered = status
                .as_array()
                .and_then(|a| a.iter().find(|d| d["consumerId"] == id))
                .and_then(|d| d["delivered"].as_u64())
                .unwrap_or(0);
            if delivered >= backlog || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
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

/// Parameters of `mmmq bench embedded`.
#[derive(Debug, Clone, clap::Args)]
pub struct EmbeddedBench {
    /// Where the broker's temporary root dir goes.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// How long each produce run lasts.
    #[arg(long = "seconds", value_parser = parse_seconds, default_value = "3")]
    pub duration: Duration,
    /// Content size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub message_bytes: usize,
    /// Producer counts.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    pub producers: Vec<usize>,
    /// Messages in the backlog the no-op handler drains.
    #[arg(long, default_value_t = 100_000)]
    pub backlog: usize,
}

/// The broker inside the application: produce with no HTTP, a stored backlog drained by a no-op
/// in-process handler, and produce-to-handler latency.
pub async fn embedded(cfg: EmbeddedBench, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    use crate::broker::{Broker, ProduceItem};
    use mmmq_core::Topic;
    let scratch = scratch_dir(&cfg.dir)?;
    let broker = Arc::new(Broker::open(crate::config::ServeConfig::new(scratch.path())).await?);
    let pad = "x".repeat(cfg.message_bytes);
    let clock = Instant::now();
    let item = |topic: &Topic| ProduceItem {
        topic: topic.clone(),
        key: None,
        content: serde_json::value::RawValue::from_string(format!(
            r#"{{"t":{},"pad":"{pad}"}}"#,
            clock.elapsed().as_secs_f64()
        ))
        .expect("valid JSON"),
    };
    for &p in &cfg.producers {
        let topic = Topic::new(format!("produce.p{p}"))?;
        let deadline = Instant::now() + cfg.duration;
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..p {
            let broker = broker.clone();
            let topic = topic.clone();
            let pad = pad.clone();
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let content =
                        serde_json::value::RawValue::from_string(format!(r#"{{"pad":"{pad}"}}"#))
                            .expect("JSON");
                    broker
                        .produce(ProduceItem {
                            topic: topic.clone(),
                            key: None,
                            content,
                        })
                        .await?;
                    lat.push(t.elapsed());
                }
                Ok::<_, crate::broker::BrokerError>(lat)
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await??);
        }
        let rate = all.len() as f64 / start.elapsed().as_secs_f64();
        all.sort_unstable();
        writeln!(
            out,
            "{}",
            json!({
                "bench": "embedded", "what": "produce", "producers": p, "message_bytes": cfg.message_bytes,
                "msgs_per_s": rate.round(), "p50_us": percentile(&all, 0.5), "p99_us": percentile(&all, 0.99),
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
    let latencies: Arc<parking_lot::Mutex<Vec<f64>>> = Arc::default();
    let start = Instant::now();
    {
        let handled = handled.clone();
        let latencies = latencies.clone();
        broker
            .handle(
                "bench",
                "*.t",
                move |m: mmmq_client::Message<serde_json::Value>| {
                    let handled = handled.clone();
                    let latencies = latencies.clone();
                    async move {
                        if m.topic.as_str() == "live.t"
                            && let Some(t) = m.content["t"].as_f64()
                        {
                            latencies.lock().push(clock.elapsed().as_secs_f64() - t);
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
            "message_bytes": cfg.message_bytes, "delivered_msgs_per_s": drain.round(),
        })
    )?;

    // Live: 16 producers, the handler measuring produce-to-handler latency.
    let live = Topic::new("live.t")?;
    let deadline = Instant::now() + cfg.duration;
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
                broker
                    .produce(ProduceItem {
                        topic: live.clone(),
                        key: None,
                        content,
                    })
                    .await?;
                produced.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok::<_, crate::broker::BrokerError>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let total = produced.load(std::sync::atomic::Ordering::Relaxed);
    while (latencies.lock().len() as u64) < total {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut lat: Vec<Duration> = latencies
        .lock()
        .iter()
        .map(|s| Duration::from_secs_f64(s.max(0.0)))
        .collect();
    lat.sort_unstable();
    writeln!(
        out,
        "{}",
        json!({
            "bench": "embedded", "what": "end_to_end", "producers": 16, "message_bytes": cfg.message_bytes,
            "msgs_per_s": (total as f64 / cfg.duration.as_secs_f64()).round(),
            "p50_us_produce_to_handler": percentile(&lat, 0.5), "p99_us_produce_to_handler": percentile(&lat, 0.99),
        })
    )?;
    broker.shutdown().await;
    Ok(())
}

/// A broker on a free loopback port with `root`, answering `/healthz`: its URL, the token that
/// stops it and its task.
async fn start_broker(
    root: &Path,
) -> anyhow::Result<(
    String,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<Result<(), crate::server::ServeError>>,
)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(crate::server::run(
        listener,
        crate::config::ServeConfig::new(root),
        stop.clone().cancelled_owned(),
    ));
    let health = reqwest::Client::new();
    while health
        .get(format!("{base}/healthz"))
        .send()
        .await
        .map(|r| r.status() != 200)
        .unwrap_or(true)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok((base, stop, server))
}

/// Parameters of `mmmq bench boot`.
#[derive(Debug, Clone, clap::Args)]
pub struct BootBench {
    /// Where the scratch root goes (its disk is what is measured).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// How much to store before the reboot, in GiB.
    #[arg(long, default_value_t = 1.0)]
    pub gib: f64,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 1024)]
    pub message_bytes: usize,
}

/// Fills a topic with `gib` of segments, then measures a whole boot (`Broker::open`: every topic
/// recovered, dispatchers started) until the broker answers.
pub async fn boot(cfg: BootBench, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    use crate::broker::Broker;
    let scratch = scratch_dir(&cfg.dir)?;
    let root = scratch.path().join("root");
    let dir = root.join("topics").join("boot.t");
    let target = (cfg.gib * (1u64 << 30) as f64) as u64;
    let fill_start = Instant::now();
    let (entries, bytes) = {
        let dir = dir.clone();
        let payload = vec![b'x'; cfg.message_bytes];
        let log = tokio::task::spawn_blocking(move || {
            Log::open(
                &dir,
                Arc::new(OsFs),
                LogConfig {
                    flush: FlushMode::NoSync,
                    ..LogConfig::default()
                },
            )
        })
        .await??;
        let batch: Vec<&[u8]> = vec![&payload[..]; 1000];
        while log.stats().bytes < target {
            log.append_batch(&batch).await?;
        }
        let stats = log.stats();
        (stats.next_offset, stats.bytes)
    };
    let fill_s = fill_start.elapsed().as_secs_f64();
    let start = Instant::now();
    let broker = Broker::open(crate::config::ServeConfig::new(&root)).await?;
    let boot_ms = start.elapsed().as_secs_f64() * 1e3;
    let segments = broker
        .registry()
        .all()
        .first()
        .map_or(0, |t| t.log.stats().segments);
    writeln!(
        out,
        "{}",
        json!({
            "bench": "boot", "stored_bytes": bytes, "entries": entries, "segments": segments,
            "fill_s": fill_s, "boot_ms": boot_ms,
            "note": "page cache warm from the fill: the index is read, not the data (only each log's last entry is checked)",
        })
    )?;
    broker.shutdown().await;
    Ok(())
}

/// Parameters of `mmmq bench topics`.
#[derive(Debug, Clone, clap::Args)]
pub struct TopicsBench {
    /// Where the scratch root goes.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// How many topics, each with one message and one dispatcher delivering it.
    #[arg(long, default_value_t = 10_000)]
    pub topics: usize,
    /// Segment files held open at once (default: as `serve`, the descriptor limit minus what
    /// sockets need).
    #[arg(long)]
    pub max_open_files: Option<usize>,
}

fn proc_status(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Many idle topics: creates `topics` topics with one message each, delivered by one in-process
/// dispatcher (a drain worker per topic), then measures resident memory and threads once all is
/// delivered and idle; then the same after a reboot.
pub async fn topics(cfg: TopicsBench, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    use crate::broker::Broker;
    use std::sync::atomic::{AtomicU64, Ordering};
    let scratch = scratch_dir(&cfg.dir)?;
    let mut config = crate::config::ServeConfig::new(scratch.path()).with_flush(FlushMode::NoSync);
    config.size_file_cache(cfg.max_open_files);
    let rss_before = proc_status("VmRSS:");
    for phase in ["created", "rebooted"] {
        let broker = Broker::open(config.clone()).await?;
        let delivered = Arc::new(AtomicU64::new(0));
        let d = delivered.clone();
        broker
            .handle(
                "idle",
                "**",
                move |_m: mmmq_client::Message<serde_json::Value>| {
                    let d = d.clone();
                    async move {
                        d.fetch_add(1, Ordering::Relaxed);
                        Ok::<(), String>(())
                    }
                },
            )
            .await?;
        let start = Instant::now();
        if phase == "created" {
            for i in 0..cfg.topics {
                broker
                    .produce_json(&format!("idle.t{i}"), None, &json!({"i": i}))
                    .await?;
            }
            while delivered.load(Ordering::Relaxed) < cfg.topics as u64 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let ready_ms = start.elapsed().as_secs_f64() * 1e3;
        tokio::time::sleep(Duration::from_secs(1)).await;
        writeln!(
            out,
            "{}",
            json!({
                "bench": "topics", "phase": phase, "topics": broker.registry().len(),
                "ms": ready_ms, "rss_mib": proc_status("VmRSS:") as f64 / 1024.0,
                "rss_before_mib": rss_before as f64 / 1024.0, "threads": proc_status("Threads:"),
                "open_fds": std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count()),
                "max_open_files": config.log.files.capacity(),
            })
        )?;
        broker.shutdown().await;
    }
    Ok(())
}
