//! `mmmq bench`: benchmarks that print one JSON object per line, so runs can be compared and
//! recorded (docs/benchmarks.md). Machines here are shared and noisy: every run measures its own
//! baselines (the raw disk, the storage engine alone, an HTTP consumer) so results are read as
//! ratios taken in the same run.
//!
//! One file per benchmark (`storage`, `http`, `plugin`, `router`, `embedded`, `boot`, `topics`, `cluster`, …); this module
//! holds what they share ([`Latencies`], scratch directories, a broker on a free port).

pub mod boot;
pub mod cluster;
mod cluster_delivery;
pub mod consume;
pub mod dedup;
pub mod embedded;
pub mod http;
pub mod memory;
pub mod plugin;
pub mod router;
pub mod soak;
pub mod storage;
pub mod topics;

use std::path::{Path, PathBuf};
use std::time::Duration;

/// What the load benchmarks share.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Where the scratch root dir or logs go (created if missing, removed afterwards).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// How long each configuration runs.
    #[arg(long = "seconds", value_parser = parse_seconds, default_value = "3")]
    pub duration: Duration,
    /// Content size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub message_bytes: usize,
}

/// Latencies of one measurement: pushed as they come, reported as percentiles in microseconds.
#[derive(Debug, Default)]
pub struct Latencies {
    samples: Vec<Duration>,
    sorted: bool,
}

impl Latencies {
    /// Records one.
    pub fn push(&mut self, d: Duration) {
        self.samples.push(d);
        self.sorted = false;
    }

    /// Records one given in seconds (a clock difference; a negative one, from clocks read on two
    /// threads, counts as zero).
    pub fn push_secs(&mut self, secs: f64) {
        self.push(Duration::from_secs_f64(secs.max(0.0)));
    }

    /// Takes in another collector's samples.
    pub fn merge(&mut self, other: Latencies) {
        self.samples.extend(other.samples);
        self.sorted = false;
    }

    /// How many were recorded.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// The `p` quantile (0–1) in microseconds; 0 when there are none.
    pub fn percentile_us(&mut self, p: f64) -> f64 {
        if self.samples.is_empty() {
            return 0.0;
        }
        if !self.sorted {
            self.samples.sort_unstable();
            self.sorted = true;
        }
        let i = ((self.samples.len() as f64 - 1.0) * p).round() as usize;
        self.samples[i].as_secs_f64() * 1e6
    }
}

/// A temporary directory under `dir` (created if missing) for one run's files, removed afterwards.
pub fn scratch_dir(dir: &Path) -> std::io::Result<tempfile::TempDir> {
    std::fs::create_dir_all(dir)?;
    tempfile::Builder::new()
        .prefix("mmmq-bench-")
        .tempdir_in(dir)
}

/// Resident memory of process `pid` in KiB (0 when it cannot be read).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Seconds (fractions allowed) as a duration, for `--seconds`.
pub fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|e| format!("{s:?} is not a number of seconds: {e}"))?;
    Duration::try_from_secs_f64(secs).map_err(|e| e.to_string())
}

/// A broker on a free loopback port with `root`, answering `/healthz`: its URL, the token that
/// stops it and its task.
pub async fn start_broker(
    root: &Path,
) -> anyhow::Result<(
    String,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<Result<(), mmmq::server::ServeError>>,
)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(mmmq::server::run(
        listener,
        mmmq::config::ServeConfig::new(root),
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

/// Adds dispatcher `d` to `dispatchers`, writes them as `{root}/dispatchers.json` and reloads the
/// broker at `base`: when the reload answered (the dispatcher starts then).
pub async fn add_dispatcher(
    client: &reqwest::Client,
    base: &str,
    root: &Path,
    dispatchers: &mut Vec<serde_json::Value>,
    d: serde_json::Value,
) -> anyhow::Result<std::time::Instant> {
    dispatchers.push(d);
    std::fs::write(
        root.join("dispatchers.json"),
        serde_json::Value::Array(dispatchers.clone()).to_string(),
    )?;
    let start = std::time::Instant::now();
    let r = client
        .post(format!("{base}/mmmq/admin/reload"))
        .send()
        .await?;
    anyhow::ensure!(r.status() == 200, "reload answered {}", r.status());
    Ok(start)
}

/// Waits until dispatcher `id` of the broker at `base` has delivered at least `n` messages, or
/// `timeout` has passed; returns what it had delivered.
pub async fn wait_delivered(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    n: u64,
    timeout: Duration,
) -> anyhow::Result<u64> {
    let deadline = std::time::Instant::now() + timeout;
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
        if delivered >= n || std::time::Instant::now() > deadline {
            return Ok(delivered);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_what_was_pushed() {
        let mut l = Latencies::default();
        assert_eq!(l.percentile_us(0.5), 0.0);
        for ms in [5, 1, 3, 2, 4] {
            l.push(Duration::from_millis(ms));
        }
        l.push_secs(-1.0);
        assert_eq!(l.len(), 6);
        assert_eq!(l.percentile_us(0.0), 0.0);
        assert_eq!(l.percentile_us(1.0), 5000.0);
        assert_eq!(l.percentile_us(0.5), 3000.0);
    }
}
