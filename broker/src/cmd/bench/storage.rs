//! `mmmq bench storage`: the segment store alone, next to the raw disk in the same run.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mmmq::storage::{FlushMode, Log, LogConfig, OsFs, StorageError};
use serde_json::json;

use super::{Latencies, RunArgs, scratch_dir};

/// Parameters of `mmmq bench storage`.
#[derive(Debug, Clone, clap::Args)]
pub struct StorageBench {
    /// Where the scratch files go (on the disk being measured, not tmpfs), how long each
    /// configuration runs, and how big a message is.
    #[command(flatten)]
    pub run: RunArgs,
    /// Concurrent appender counts to try.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    pub appenders: Vec<usize>,
    /// Flush modes to try.
    #[arg(long, value_delimiter = ',', default_value = "group,per-append,none")]
    pub modes: Vec<FlushMode>,
}

fn mode_name(mode: FlushMode) -> &'static str {
    match mode {
        FlushMode::GroupCommit => "group",
        FlushMode::PerAppend => "per-append",
        FlushMode::NoSync => "none",
    }
}

/// Runs the storage benchmark, printing JSON lines to `out`.
pub async fn run(cfg: StorageBench, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let scratch = scratch_dir(&cfg.run.dir)?;
    let mb = cfg.run.message_bytes as f64 / 1e6;

    // Baselines: what the disk itself allows, same run, same directory.
    let mut disk = serde_json::Map::new();
    for per_sync in [1usize, 64] {
        let path = scratch.path().join(format!("raw-{per_sync}"));
        let d = cfg.run.duration;
        let size = cfg.run.message_bytes;
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
            let r = run_appenders(&dir, mode, n, cfg.run.message_bytes, cfg.run.duration).await?;
            let line = json!({
                "bench": "storage", "what": "append", "mode": mode_name(mode), "appenders": n,
                "message_bytes": cfg.run.message_bytes, "appends": r.count,
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

/// What a run of appenders did.
pub struct RunResult {
    count: u64,
    elapsed: Duration,
    p50_us: f64,
    p99_us: f64,
}

impl RunResult {
    /// Appends per second.
    pub fn rate(&self) -> f64 {
        self.count as f64 / self.elapsed.as_secs_f64()
    }
}

/// `appenders` tasks appending `size`-byte payloads to a fresh log in `dir` for `duration`.
pub async fn run_appenders(
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
            let mut lat = Latencies::default();
            while Instant::now() < deadline {
                let t = Instant::now();
                log.append(&payload).await?;
                lat.push(t.elapsed());
            }
            Ok::<_, StorageError>(lat)
        }));
    }
    let mut all = Latencies::default();
    for t in tasks {
        all.merge(t.await.expect("appender task")?);
    }
    let elapsed = start.elapsed();
    Ok(RunResult {
        count: all.len() as u64,
        elapsed,
        p50_us: all.percentile_us(0.50),
        p99_us: all.percentile_us(0.99),
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
