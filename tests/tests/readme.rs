//! The README's front door, run as a newcomer would run it: `./scripts/run` (the first of the
//! two commands, with the debug binary the suite built), then every command of "A five-minute
//! tour" against it, each answer checked against what the README shows (`mmmq_tests::doc_run`
//! says how a document is read). The plugin part scaffolds, tests, builds, checks and deploys a
//! handler with only the binary and cargo, and builds the README's own handler snippet.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use mmmq_tests::doc_run::{Session, steps};
use mmmq_tests::{free_port, mmmq_bin, workspace_root};

#[test]
fn the_readme_tour_runs_as_written() {
    mmmq_tests::ensure_wasm_target();
    let root = workspace_root();
    let tmp = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let consumer_port = free_port().to_string();
    let demo = tmp.path().join("mmmq-demo");
    // The plugin builds share a target dir with the other tests' (the workspace's own is locked
    // by the `cargo test` running this one).
    let wasm_target = root.join("target/wasm");
    let scaffold_target = root.join("target/wasm-scaffold");

    // The first of the two commands.
    let run_log = tmp.path().join("run.log");
    let mut run = Command::new(root.join("scripts/run"))
        .env("MMMQ_BIN", mmmq_bin())
        .env("CARGO_TARGET_DIR", &wasm_target)
        .env("MMMQ_ROOT_DIR", &demo)
        .env("MMMQ_LISTEN", &addr)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&run_log).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let stop_run = StopGroup(run.id());
    let log = || std::fs::read_to_string(&run_log).unwrap_or_default();
    let ready = "the audit plugin logged the 3 demo messages above";
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while !log().contains(ready) {
        assert!(
            run.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline,
            "./scripts/run did not come up:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let tour =
        &readme[readme.find("## A five-minute tour").unwrap()..readme.find("## Install").unwrap()];
    let mut session = Session::new(tmp.path());
    let bin_dir = mmmq_bin().parent().unwrap().to_owned();
    session.env = vec![
        (
            "PATH".into(),
            format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap()),
        ),
        ("MMMQ_BROKER".into(), format!("http://{addr}")),
        (
            "CARGO_TARGET_DIR".into(),
            scaffold_target.display().to_string(),
        ),
        // The SDK's dependencies are in cargo's cache from the workspace build.
        ("CARGO_NET_OFFLINE".into(), "true".into()),
        // No registry serves this version of the SDK: the scaffold carries it.
        ("MMMQ_SDK_INDEX".into(), "http://127.0.0.1:9/".into()),
    ];
    session.replace = vec![
        ("localhost:8080".into(), addr.clone()),
        ("9000".into(), consumer_port.clone()),
        (
            "target/wasm32-wasip2/".into(),
            format!("{}/wasm32-wasip2/", scaffold_target.display()),
        ),
    ];
    session.run(&steps(tour));

    // What the README says the consumer prints.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let printed = loop {
        let out = session.background_output(0);
        if out.contains("order.created 0 1 {\"id\": 2, \"total\": 20}") {
            break out;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the consumer printed {out:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        printed.starts_with("order.created 0 0 {\"id\": 1, \"total\": 9.5}\n"),
        "{printed}"
    );
    drop(session);
    drop(stop_run);
    let _ = run.wait();
}

/// Stops `./scripts/run` and its broker (SIGTERM to its process group) when the test ends, also
/// when it fails.
struct StopGroup(u32);

impl Drop for StopGroup {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", self.0)])
            .status();
    }
}
