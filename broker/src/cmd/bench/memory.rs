//! `mmmq bench memory`: resident memory of a broker holding many stored messages, after boot and
//! while reading the oldest of them, next to an empty broker's (docs/storage.md, "Storage": memory is
//! bounded by open segments, not by stored messages).
//!
//! The log is written directly in the on-disk format (frames and index, many small segments) so
//! that a hundred million messages take a minute to lay down; each broker is a child process
//! (`mmmq serve`) whose `VmRSS` is read from `/proc`.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mmmq::storage::frame;
use mmmq::storage::scan::{DATA_EXT, INDEX_EXT, segment_file_name};
use serde_json::json;

use super::{rss_kib, scratch_dir};

/// Parameters of `mmmq bench memory`.
#[derive(Debug, Clone, clap::Args)]
pub struct MemoryBench {
    /// Where the scratch root goes.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Messages to store.
    #[arg(long, default_value_t = 100_000_000)]
    pub messages: u64,
    /// Bytes per segment (small, so that there are many).
    #[arg(long, default_value_t = 4 << 20)]
    pub segment_bytes: u64,
    /// Messages read from the oldest on, through the pull API, after the boot.
    #[arg(long, default_value_t = 2_000_000)]
    pub read: u64,
}

/// Lays down `n` small messages in `dir` as segments of about `segment_bytes`.
fn write_log(dir: &Path, n: u64, segment_bytes: u64) -> std::io::Result<u64> {
    std::fs::create_dir_all(dir)?;
    let now = mmmq_core::now_ms();
    let mut segments = 0;
    let mut offset = 0;
    let mut frames = Vec::with_capacity(segment_bytes as usize + 4096);
    let mut index = Vec::new();
    while offset < n {
        let start = offset;
        frames.clear();
        index.clear();
        while offset < n && (frames.len() as u64) < segment_bytes {
            index.extend_from_slice(&(frames.len() as u64).to_be_bytes());
            let payload = format!(r#"{{"timestamp":{now},"key":null,"content":{offset}}}"#);
            frame::encode_into(payload.as_bytes(), &mut frames);
            offset += 1;
        }
        let mut data = BufWriter::new(std::fs::File::create(
            dir.join(segment_file_name(start, DATA_EXT)),
        )?);
        data.write_all(&frames)?;
        data.flush()?;
        std::fs::write(dir.join(segment_file_name(start, INDEX_EXT)), &index)?;
        segments += 1;
    }
    Ok(segments)
}

struct Served {
    child: Child,
    url: String,
    boot_ms: f64,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn serve(root: &Path, http: &reqwest::Client) -> anyhow::Result<Served> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let start = Instant::now();
    let child = Command::new(std::env::current_exe()?)
        .args(["serve", "--root-dir"])
        .arg(root)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let url = format!("http://127.0.0.1:{port}");
    loop {
        if let Ok(r) = http.get(format!("{url}/healthz")).send().await
            && r.status() == 200
        {
            break;
        }
        anyhow::ensure!(start.elapsed() < Duration::from_secs(600), "never healthy");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(Served {
        child,
        url,
        boot_ms: start.elapsed().as_secs_f64() * 1e3,
    })
}

/// Runs the benchmark.
pub async fn run(cfg: MemoryBench, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let scratch = scratch_dir(&cfg.dir)?;
    let http = reqwest::Client::new();
    let empty_root = scratch.path().join("empty");
    let empty = serve(&empty_root, &http).await?;
    // Settle, as the loaded broker does before its reading, so both are read the same way.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_empty = rss_kib(empty.child.id());
    drop(empty);

    let root = scratch.path().join("full");
    let fill = Instant::now();
    let (messages, seg) = (cfg.messages, cfg.segment_bytes);
    let dir = root.join("topics").join("mem");
    let segments = tokio::task::spawn_blocking(move || write_log(&dir, messages, seg)).await??;
    let fill_s = fill.elapsed().as_secs_f64();
    let stored: u64 = std::fs::read_dir(root.join("topics").join("mem"))?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();

    let full = serve(&root, &http).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_booted = rss_kib(full.child.id());
    let read_start = Instant::now();
    let mut from = 0;
    let mut peak = rss_booted;
    while from < cfg.read.min(messages) {
        let page: serde_json::Value = http
            .get(format!(
                "{}/mmmq/topics/mem/messages?from={from}&max=1000",
                full.url
            ))
            .send()
            .await?
            .json()
            .await?;
        from = page["next"].as_u64().unwrap_or(from + 1);
        peak = peak.max(rss_kib(full.child.id()));
    }
    let read_s = read_start.elapsed().as_secs_f64();
    // And a read of every segment's first entry, the whole log through.
    let mut at = 0;
    let step = (messages / segments.max(1)).max(1);
    while at < messages {
        http.get(format!(
            "{}/mmmq/topics/mem/messages?from={at}&max=1",
            full.url
        ))
        .send()
        .await?
        .bytes()
        .await?;
        at += step;
    }
    let rss_after_scan = rss_kib(full.child.id());
    writeln!(
        out,
        "{}",
        json!({
            "bench": "memory", "messages": messages, "segments": segments,
            "stored_bytes": stored, "fill_s": fill_s,
            "boot_ms": full.boot_ms,
            "rss_empty_mib": rss_empty as f64 / 1024.0,
            "rss_after_boot_mib": rss_booted as f64 / 1024.0,
            "rss_peak_reading_oldest_mib": peak as f64 / 1024.0,
            "rss_after_touching_every_segment_mib": rss_after_scan as f64 / 1024.0,
            "above_empty_mib": (peak.max(rss_after_scan).saturating_sub(rss_empty)) as f64 / 1024.0,
            "read_messages": cfg.read.min(messages), "read_s": read_s,
            "note": "boot_ms is spawn to /healthz 200, page cache warm from the fill (no clean-shutdown marker: the tail is checked fully)",
        })
    )?;
    Ok(())
}
