//! `mmmq bench topics`: many idle topics, each delivered by a dispatcher: memory and threads.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mmmq::storage::FlushMode;
use serde_json::json;

use super::scratch_dir;

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
pub async fn run(cfg: TopicsBench, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    use mmmq::broker::Broker;
    use std::sync::atomic::{AtomicU64, Ordering};
    let scratch = scratch_dir(&cfg.dir)?;
    let mut config = mmmq::config::ServeConfig::new(scratch.path()).with_flush(FlushMode::NoSync);
    config.max_open_files = cfg.max_open_files;
    let rss_before = proc_status("VmRSS:");
    for phase in ["created", "rebooted"] {
        let broker = Broker::open(config.clone()).await?;
        let delivered = Arc::new(AtomicU64::new(0));
        let d = delivered.clone();
        broker
            .handle(
                "idle",
                "**",
                move |_m: mmmq_core::Message<serde_json::Value>| {
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
                "max_open_files": broker.file_cache().capacity(),
            })
        )?;
        broker.shutdown().await;
    }
    Ok(())
}
