//! `mmmq bench dedup`: the memory and CPU of idempotent produce's id window (docs/delivery.md,
//! "Idempotent produce") at a given id rate over a window, measured on the broker's own structure with a
//! simulated clock (so a two-minute window takes seconds), with ids shaped like `mmmq-client`'s.

use std::io::Write;
use std::time::Instant;

use mmmq::topics::dedup::{Claim, Dedup, MAX_IDS};
use serde_json::json;

use super::soak::rss_kib;

/// Parameters of `mmmq bench dedup`.
#[derive(Debug, Clone, clap::Args)]
pub struct DedupBench {
    /// Ids per second.
    #[arg(long, default_value_t = 100_000)]
    pub ids_per_s: u64,
    /// The window (`dedupWindowMs`; the default is two minutes).
    #[arg(long, default_value_t = 120_000)]
    pub window_ms: u64,
    /// How long to run, in simulated seconds (past the window, so that ids expire).
    #[arg(long, default_value_t = 150)]
    pub seconds: u64,
}

/// Runs the benchmark and prints one JSON line.
pub fn run(cfg: DedupBench, out: &mut dyn Write) -> anyhow::Result<()> {
    let dedup = Dedup::default();
    let before = rss_kib();
    let prefix = format!("{:x}-{:x}", std::process::id(), 0x1876_5432_10ab_cdefu64);
    let total = cfg.ids_per_s * cfg.seconds;
    let started = Instant::now();
    let mut peak = 0;
    for n in 0..total {
        let now_ms = 1_000_000 + n * 1000 / cfg.ids_per_s;
        let id = format!("{prefix}-{n:x}");
        match dedup.claim(&id, now_ms, cfg.window_ms) {
            Claim::New(ticket) => dedup.stored(&ticket, 0, n),
            other => anyhow::bail!("id {n} claimed as {other:?}"),
        }
        if n % (cfg.ids_per_s * 10) == 0 {
            peak = peak.max(rss_kib());
        }
    }
    let elapsed = started.elapsed();
    let held = dedup.len();
    let after = rss_kib().max(peak);
    let grown = after.saturating_sub(before) * 1024;
    writeln!(
        out,
        "{}",
        json!({
            "bench": "dedup", "ids_per_s": cfg.ids_per_s, "window_ms": cfg.window_ms,
            "window_would_hold": cfg.ids_per_s * cfg.window_ms / 1000, "max_ids": MAX_IDS,
            "ids_held": held, "rss_growth_mib": grown as f64 / (1 << 20) as f64,
            "bytes_per_id": grown as f64 / held.max(1) as f64,
            "ns_per_claim_and_store": elapsed.as_nanos() as f64 / total as f64,
        })
    )?;
    Ok(())
}
