//! Support for the end-to-end tests: the real `mmmq` binary in a temporary root dir on a free
//! port ([`Broker`]), real HTTP consumers that record what they receive ([`Consumer`]), the
//! root dirs and plugin components they run, and plugin code built in a scaffold as a plugin
//! author builds it ([`build_plugin_snippet`]), and a [`cluster`] of brokers with its [`checker`].

mod broker;
pub mod browser;
pub mod checker;
pub mod cluster;
pub mod cluster_delivery;
mod consumer;
pub mod doc_run;
pub mod kafka;
pub mod kafka_wire;
mod setup;
mod snippet;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub use broker::{Broker, Handled, spawn_serve};
pub use consumer::{Answer, Consumer};
pub use setup::{
    deploy_plugin, ensure_wasm_target, host_dispatcher, plugin_dispatcher, plugin_wasm,
    testbed_root, wasm_variant, write_dispatchers,
};
pub use snippet::{build_plugin_snippet, scaffold_cargo, scaffold_cargo_ok, scaffold_target_dir};

/// The payload the crash appender writes for (`cycle`, `task`, `seq`): varied lengths, so that
/// torn writes land at every kind of boundary.
pub fn crash_payload(cycle: u64, task: u64, seq: u64) -> Vec<u8> {
    let pad = "p".repeat(((cycle * 7 + task * 13 + seq) % 200) as usize);
    format!(r#"{{"timestamp":0,"key":null,"content":{{"cycle":{cycle},"task":{task},"seq":{seq},"pad":"{pad}"}}}}"#)
        .into_bytes()
}

/// The `mmmq` binary of this build (`scripts/test` builds it before the tests run; `MMMQ_BIN`
/// overrides).
pub fn mmmq_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("MMMQ_BIN") {
        return p.into();
    }
    // target/debug/deps/<test> → target/debug/mmmq
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let bin = dir.join("mmmq");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p mmmq` (scripts/test does) or set MMMQ_BIN",
        bin.display()
    );
    bin
}

/// An example binary of this build (`target/debug/examples/NAME`, built by `cargo test`).
pub fn example_bin(name: &str) -> PathBuf {
    let bin = mmmq_bin()
        .parent()
        .expect("target dir")
        .join("examples")
        .join(name);
    assert!(
        bin.exists(),
        "{} is missing: cargo test builds examples",
        bin.display()
    );
    bin
}

/// Waits until `f` returns `Some`, checking every 20 ms, or panics after `timeout` with `what`.
pub async fn eventually<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// As [`eventually`], for a condition that needs to `.await` (an HTTP request).
pub async fn eventually_async<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Checks that no `(key, content.seq)` of `got` came twice and that each key's seqs rose in
/// the order received (`mmmq_tests::Broker::produce_keyed` sends them so); returns how many.
pub fn check_per_key_order(got: &[serde_json::Value]) -> usize {
    let mut last: std::collections::BTreeMap<String, u64> = Default::default();
    let mut seen = std::collections::HashSet::new();
    for e in got {
        let key = e["key"].as_str().expect("a keyed envelope").to_owned();
        let seq = e["content"]["seq"].as_u64().expect("content.seq");
        assert!(
            seen.insert((key.clone(), seq)),
            "{key}/{seq} delivered twice"
        );
        if let Some(&before) = last.get(&key) {
            assert!(seq > before, "key {key}: {seq} arrived after {before}");
        }
        last.insert(key, seq);
    }
    seen.len()
}

/// Reads until the server closes the connection (or `limit` passes); returns what it sent and
/// whether it closed.
pub async fn read_to_close(stream: &mut tokio::net::TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (got, true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (got, false),
        }
    }
}

/// A connection to `addr` from the loopback address `source` (any of 127.0.0.0/8 on Linux), so
/// that a test has a client address of its own, apart from the pooled connections of the rest.
pub async fn connect_from(source: &str, addr: &str) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    socket.connect(addr.parse().unwrap()).await.unwrap()
}

/// A port nothing listens on (yet), below the kernel's ephemeral range (32768–60999 on
/// Linux): a port the kernel picked for a port-0 bind could be handed out again to the next
/// port-0 bind — a broker's HTTP listener took the Kafka port a test had just been given, and
/// the broker could not start. Each call in a process tries the next port of a sequence that
/// starts at a place of its own.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 10_000;
    const SPAN: u32 = 32_768 - LOW;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    if NEXT.load(Ordering::Relaxed) == u32::MAX {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let start = (std::process::id().wrapping_mul(7_919) ^ nanos) % SPAN;
        let _ = NEXT.compare_exchange(u32::MAX, start, Ordering::Relaxed, Ordering::Relaxed);
    }
    for _ in 0..SPAN {
        let port = (LOW + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port below the ephemeral range")
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_owned()
}

/// Runs `cmd` and waits; panics with what it printed unless it succeeded.
pub fn run_ok(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    succeeded(out)
}

/// `out`, after checking that its command succeeded (else a panic with what it printed).
fn succeeded(out: std::process::Output) -> std::process::Output {
    assert!(
        out.status.success(),
        "the command failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The `error` of a JSON error answer (panics when there is none).
pub fn error_of(body: &serde_json::Value) -> &str {
    body["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error: {body}"))
}
