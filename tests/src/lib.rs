//! Support for the end-to-end tests: finding the real `mmmq` binary and the shapes of test data.

use std::path::PathBuf;

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
