//! A child process for the crash tests: appends to a log from many tasks at once and prints
//! `offset task seq` for every append once it is acknowledged, until it is killed.
//!
//! Usage: `crash-appender DIR SEGMENT_MAX_BYTES CYCLE`

use std::io::Write;
use std::sync::Arc;

use mmmq::storage::{Log, LogConfig, OsFs};

/// The payload the test expects at the offset the child reports.
fn payload(cycle: u64, task: u64, seq: u64) -> Vec<u8> {
    mmmq_tests::crash_payload(cycle, task, seq)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(&args[1]);
    let segment_max_bytes: u64 = args[2].parse().expect("segment size");
    let cycle: u64 = args[3].parse().expect("cycle");
    let config = LogConfig {
        segment_max_bytes,
        ..LogConfig::default()
    };
    let log = tokio::task::spawn_blocking(move || Log::open(&dir, Arc::new(OsFs), config))
        .await
        .unwrap()
        .expect("the log must open after any crash");
    println!("ready {}", log.next_offset());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    for task in 0..8u64 {
        let log = log.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            for seq in 0.. {
                let offset = log
                    .append(&payload(cycle, task, seq))
                    .await
                    .expect("append");
                if tx.send(format!("{offset} {task} {seq}")).is_err() {
                    return;
                }
            }
        });
    }
    drop(tx);
    let mut out = std::io::stdout().lock();
    while let Some(line) = rx.recv().await {
        writeln!(out, "{line}").unwrap();
        out.flush().unwrap();
    }
}
