//! The README's front door, run as a newcomer would run it: `./scripts/run` (the first of the
//! two commands, with the debug binary the suite built), then every command of "A five-minute
//! tour" against it, each answer checked against what the README shows (`mmmq_tests::doc_run`
//! says how a document is read). The plugin part scaffolds, tests, builds, checks and deploys a
//! handler with only the binary and cargo, and builds the README's own handler snippet.
//!
//! Where the test differs from a reader's terminal: it runs in a temporary directory rather than
//! the checkout, on free ports rather than 8080 and 9000, with the plugin builds in a target dir
//! shared with the other tests (`target/wasm32-wasip2/` in a command means that one) and cargo
//! offline (the SDK's dependencies are in cargo's cache from the workspace build).

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mmmq_tests::doc_run::{Session, die_with_parent, steps};
use mmmq_tests::{free_port, mmmq_bin, workspace_root};

#[test]
fn the_readme_tour_runs_as_written() {
    mmmq_tests::ensure_wasm_target();
    let root = workspace_root();
    let tmp = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let consumer_port = free_port().to_string();
    // The workspace's own target dir is locked by the `cargo test` running this one.
    let wasm_target = root.join("target/wasm");
    let scaffold_target = root.join("target/wasm-scaffold");

    // The first of the two commands.
    let run_log = tmp.path().join("run.log");
    let mut run = Command::new(root.join("scripts/run"));
    let run = die_with_parent(&mut run)
        .env("MMMQ_BIN", mmmq_bin())
        .env("CARGO_TARGET_DIR", &wasm_target)
        .env("MMMQ_ROOT_DIR", tmp.path().join("mmmq-demo"))
        .env("MMMQ_LISTEN", &addr)
        .env("MMMQ_KAFKA_LISTEN", format!("127.0.0.1:{}", free_port()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&run_log).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut run = Stopped(run);
    let log = || std::fs::read_to_string(&run_log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(600);
    while !log().contains("the audit plugin logged the 3 demo messages above") {
        assert!(
            run.0.try_wait().unwrap().is_none() && Instant::now() < deadline,
            "./scripts/run did not come up:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let start = readme.find("## A five-minute tour").unwrap();
    let tour = &readme[start..readme.find("## Install").unwrap()];
    let first_line = readme[..start].lines().count() + 1;
    let mut session = Session::new(tmp.path());
    let bin_dir = mmmq_bin().parent().unwrap().to_owned();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap());
    session.env = vec![
        ("PATH".into(), path),
        ("MMMQ_BROKER".into(), format!("http://{addr}")),
        (
            "CARGO_TARGET_DIR".into(),
            scaffold_target.display().to_string(),
        ),
        ("CARGO_NET_OFFLINE".into(), "true".into()),
        // No registry serves this version of the SDK: the scaffold carries it.
        ("MMMQ_SDK_INDEX".into(), "http://127.0.0.1:9/".into()),
    ];
    session.replace = vec![
        ("localhost:8080".into(), addr.clone()),
        ("9000".into(), consumer_port),
        (
            "target/wasm32-wasip2/".into(),
            format!("{}/wasm32-wasip2/", scaffold_target.display()),
        ),
    ];
    session.run(&steps(tour, first_line));

    // What the README says the consumer prints: both messages, in order.
    let deadline = Instant::now() + Duration::from_secs(10);
    let printed = loop {
        let (out, err) = session.background_output(0);
        if out.contains("order.created 0 1 {\"id\": 2, \"total\": 20}") {
            break out;
        }
        assert!(
            Instant::now() < deadline,
            "the consumer printed {out:?}, and on stderr {err:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        printed,
        "order.created 0 0 {\"id\": 1, \"total\": 9.5}\norder.created 0 1 {\"id\": 2, \"total\": 20}\n"
    );
}

/// `./scripts/run`, stopped (SIGTERM to its process group: the script stops its broker) and
/// waited for when the test ends, also when it fails, before the temporary root dir goes.
struct Stopped(Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", self.0.id())])
            .status();
        let _ = self.0.wait();
    }
}
