//! `mmmq bench boot`: a boot with a large stored log, until the broker is ready.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use mmmq::storage::{FlushMode, Log, LogConfig, OsFs};
use serde_json::json;

use super::scratch_dir;

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
/// recovered, dispatchers started) as after a crash, and again after a clean shutdown.
pub async fn run(cfg: BootBench, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    use mmmq::broker::Broker;
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
    let broker = Broker::open(mmmq::config::ServeConfig::new(&root)).await?;
    let boot_ms = start.elapsed().as_secs_f64() * 1e3;
    let segments = broker
        .registry()
        .all()
        .first()
        .map_or(0, |t| t.first().log.stats().segments);
    // A clean stop leaves the marker: the next boot checks the tail quickly.
    broker.shutdown().await;
    drop(broker);
    let start = Instant::now();
    let broker = Broker::open(mmmq::config::ServeConfig::new(&root)).await?;
    let clean_boot_ms = start.elapsed().as_secs_f64() * 1e3;
    writeln!(
        out,
        "{}",
        json!({
            "bench": "boot", "stored_bytes": bytes, "entries": entries, "segments": segments,
            "fill_s": fill_s, "boot_ms": boot_ms, "boot_after_clean_shutdown_ms": clean_boot_ms,
            "note": "page cache warm from the fill; sealed segments' indexes are read, not their data; boot_ms (as after a crash) reads the tail segment whole and reconciles it with its index, boot_after_clean_shutdown_ms checks only its last entry",
        })
    )?;
    broker.shutdown().await;
    Ok(())
}
