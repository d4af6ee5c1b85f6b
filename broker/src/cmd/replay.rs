//! `mmmq plugin replay` (docs/plugins.md, "Replay"): the command line over [`mmmq::replay`].

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use mmmq::config::defaults;
use mmmq::replay::{ReplayRequest, Replayed, replay};

/// Arguments of `mmmq plugin replay`.
#[derive(clap::Args)]
pub struct ReplayArgs {
    /// The broker's root dir (read only: a broker may be running on it).
    #[arg(long, env = "MMMQ_ROOT_DIR", default_value = defaults::ROOT_DIR)]
    root_dir: PathBuf,
    /// The plugin dispatcher's consumerId.
    #[arg(long)]
    consumer: String,
    /// The message's topic.
    #[arg(long)]
    topic: String,
    /// Its partition.
    #[arg(long, default_value_t = 0)]
    partition: u32,
    /// Its offset.
    #[arg(long)]
    offset: u64,
    /// Run this version (16 hex digits) instead of the one that handled the message.
    #[arg(long)]
    version: Option<String>,
    /// Let the plugin reach the dispatcher's `plugin.allowedHosts` (no network otherwise).
    #[arg(long)]
    allow_http: bool,
    /// The attempt number the call is told.
    #[arg(long, default_value_t = 1)]
    attempt: u32,
    /// The broker's --max-body-bytes (bounds what the plugin may emit).
    #[arg(long, env = "MMMQ_MAX_BODY_BYTES", default_value_t = defaults::MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// The result as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Replays and prints. Exit status 0 when the call answered (whatever its verdict), 1 after a
/// fault, 2 when nothing could be replayed.
pub fn run(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let req = ReplayRequest {
        root_dir: args.root_dir,
        consumer: args.consumer,
        topic: args.topic,
        partition: args.partition,
        offset: args.offset,
        version: args.version,
        allow_http: args.allow_http,
        attempt: args.attempt,
        max_body_bytes: args.max_body_bytes,
    };
    let out = &mut std::io::stdout().lock();
    let done = match replay(&req) {
        Ok(done) => done,
        Err(e) => {
            eprintln!("mmmq plugin replay: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&done)?)?;
    } else {
        print(&done, out)?;
    }
    Ok(if done.fault.is_some() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn print(r: &Replayed, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "replayed {} partition {} offset {} (key {}) on {}",
        r.topic,
        r.partition,
        r.offset,
        r.key.as_deref().unwrap_or("none"),
        r.consumer
    )?;
    let why = match r.version_from {
        "recorded" => "the version that handled it",
        _ => "asked for",
    };
    writeln!(out, "version  {} ({why}; {})", r.version, r.world)?;
    match (&r.verdict, &r.fault) {
        (Some(v), _) => writeln!(out, "verdict  {v}")?,
        (None, Some(f)) => {
            writeln!(out, "fault    (counted as a NACK by the broker)")?;
            for line in f.lines() {
                writeln!(out, "  {line}")?;
            }
        }
        (None, None) => {}
    }
    writeln!(out, "took     {:.1} ms", r.elapsed_ms)?;
    writeln!(out, "emits    {}", r.emits.len())?;
    for e in &r.emits {
        writeln!(
            out,
            "  -> {} key={} {}",
            e["topic"].as_str().unwrap_or("?"),
            e["key"].as_str().unwrap_or("none"),
            e["content"]
        )?;
    }
    writeln!(out, "logs     {}", r.logs.len())?;
    for l in &r.logs {
        writeln!(
            out,
            "  {:<5} {}",
            l["level"].as_str().unwrap_or("?"),
            // The plugin's text, as the broker's log shows it.
            mmmq::plugin::escape_controls(l["message"].as_str().unwrap_or(""))
        )?;
    }
    Ok(())
}
