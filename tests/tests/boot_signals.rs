//! Signals while `mmmq serve` is still recovering: SIGTERM and SIGINT end it cleanly (exit 0),
//! SIGHUP does not end it at all.

use std::path::Path;
use std::time::Duration;

use mmmq_tests::spawn_serve;

/// Enough topic directories that recovery takes a while (each is opened and checked).
const TOPICS: usize = 6000;

/// A root dir with many empty topics: recovery opens each, writes nothing.
fn many_topics(root: &Path) {
    let topics = root.join("topics");
    for t in 0..TOPICS {
        let dir = topics.join(format!("boot.t{t:05}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("0000000000000000000.mmm"), b"").unwrap();
        std::fs::write(dir.join("0000000000000000000.idx"), b"").unwrap();
    }
}

/// Starts serve on a root with many topics and returns once it listens while still recovering
/// (`/healthz` answers 503).
async fn booting(root: &Path) -> (std::process::Child, String) {
    many_topics(root);
    let (child, addr, log) = spawn_serve(root, &[]);
    let addr = addr.unwrap_or_else(|| panic!("serve did not listen:\n{}", log.lock()));
    let url = format!("http://{addr}");
    let health = reqwest::get(format!("{url}/healthz")).await.unwrap();
    assert_eq!(
        health.status(),
        503,
        "recovery of {TOPICS} topics finished before the test could signal: make it longer"
    );
    (child, url)
}

fn exit_of(mut child: std::process::Child) -> std::process::ExitStatus {
    for _ in 0..3000 {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    panic!("serve did not exit within 30 s of the signal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_and_sigint_during_recovery_exit_cleanly() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let tmp = tempfile::tempdir().unwrap();
        let (child, _) = booting(tmp.path()).await;
        unsafe { libc::kill(child.id() as i32, sig) };
        let status = tokio::task::spawn_blocking(move || exit_of(child))
            .await
            .unwrap();
        assert_eq!(status.code(), Some(0), "signal {sig}: {status:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_during_recovery_is_not_fatal() {
    let tmp = tempfile::tempdir().unwrap();
    let (child, url) = booting(tmp.path()).await;
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    let mut healthy = false;
    for _ in 0..3000 {
        if let Ok(r) = reqwest::get(format!("{url}/healthz")).await
            && r.status() == 200
        {
            healthy = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        healthy,
        "serve never became healthy after a SIGHUP during boot"
    );
    let topics: serde_json::Value = reqwest::get(format!("{url}/mmmq/topics"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(topics.as_array().unwrap().len(), TOPICS);
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = tokio::task::spawn_blocking(move || exit_of(child))
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
}
