//! `mmmq bench soak`: producers that never stop, into a topic with small segments and a small
//! `retentionBytes`, with the broker embedded in this process. Once a second it prints what the
//! topic holds on disk and the process's resident memory: retention must keep the first bounded
//! and nothing may make the second grow.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mmmq::broker::{Broker, ProduceItem};
use mmmq::config::ServeConfig;
use serde_json::json;
use serde_json::value::RawValue;

use super::scratch_dir;

/// Parameters of `mmmq bench soak`.
#[derive(Debug, Clone, clap::Args)]
pub struct SoakBench {
    /// Where the scratch root goes.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// How long to produce.
    #[arg(long, default_value = "60", value_parser = super::parse_seconds)]
    pub seconds: Duration,
    /// Producers, each with one message in flight.
    #[arg(long, default_value_t = 16)]
    pub producers: usize,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 1024)]
    pub message_bytes: usize,
    /// `--segment-max-bytes` of the broker.
    #[arg(long, default_value_t = 1 << 20)]
    pub segment_bytes: u64,
    /// The topic's `retentionBytes`.
    #[arg(long, default_value_t = 8 << 20)]
    pub retention_bytes: u64,
}

pub(super) fn rss_kib() -> u64 {
    super::rss_kib(std::process::id())
}

/// Bytes of the files directly in `dir`.
fn disk_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()?.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Runs the benchmark.
pub async fn run(cfg: SoakBench, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let scratch = scratch_dir(&cfg.dir)?;
    let root = scratch.path().join("root");
    let mut config = ServeConfig::new(&root);
    config.segment_max_bytes = cfg.segment_bytes;
    config.retention_check = Duration::from_millis(100);
    let broker = Arc::new(Broker::open(config).await?);
    let body = format!(r#"{{"retentionBytes":{}}}"#, cfg.retention_bytes);
    broker.put_topic("soak", body.as_bytes()).await?;
    let topic_dir = root.join("topics").join("soak");
    let content = RawValue::from_string(format!("\"{}\"", "x".repeat(cfg.message_bytes)))?;
    let stop = Arc::new(AtomicBool::new(false));
    let produced = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..cfg.producers {
        let (broker, stop, produced, content) = (
            broker.clone(),
            stop.clone(),
            produced.clone(),
            content.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let item = ProduceItem::new("soak", None, content.clone(), usize::MAX)
                    .expect("a valid message");
                broker.produce(item).await.expect("produce");
                produced.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let start = Instant::now();
    let (mut max_disk, mut rss_first, mut rss_max, mut rss_last) = (0, 0, 0, 0);
    let mut last = 0;
    while start.elapsed() < cfg.seconds {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let n = produced.load(Ordering::Relaxed);
        let disk = disk_bytes(&topic_dir);
        let rss = rss_kib();
        if rss_first == 0 {
            rss_first = rss;
        }
        max_disk = max_disk.max(disk);
        rss_max = rss_max.max(rss);
        rss_last = rss;
        let detail = broker.topic("soak")?;
        writeln!(
            out,
            "{}",
            json!({
                "bench": "soak", "t_s": start.elapsed().as_secs(), "produced": n,
                "msgs_per_s": n - last, "disk_mib": disk as f64 / 1048576.0,
                "rss_mib": rss as f64 / 1024.0,
                "first_offset": detail.partitions[0].first_offset,
                "segments": detail.partitions[0].segments,
            })
        )?;
        last = n;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await?;
    }
    writeln!(
        out,
        "{}",
        json!({
            "bench": "soak", "what": "summary", "seconds": cfg.seconds.as_secs(),
            "produced": produced.load(Ordering::Relaxed),
            "produced_mib": (produced.load(Ordering::Relaxed) * cfg.message_bytes as u64) as f64 / 1048576.0,
            "retention_bytes_mib": cfg.retention_bytes as f64 / 1048576.0,
            "segment_bytes": cfg.segment_bytes,
            "max_disk_mib": max_disk as f64 / 1048576.0,
            "rss_first_mib": rss_first as f64 / 1024.0, "rss_max_mib": rss_max as f64 / 1024.0,
            "rss_last_mib": rss_last as f64 / 1024.0,
        })
    )?;
    broker.shutdown().await;
    Ok(())
}
