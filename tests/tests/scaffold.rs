//! `mmmq plugin new` as a plugin author without this checkout gets it (docs/plugins.md,
//! "Write, deploy and change a handler"): the scaffold depends on the SDK by version, so here the SDK is the crate
//! `cargo package` makes of this workspace's `plugin-sdk/` (unpacked, and patched in for
//! crates.io's), never the workspace directory. The crate is made in an empty directory, its own
//! test runs natively, it builds, passes `mmmq plugin check` and is deployed to a running broker.
//!
//! `MMMQ_BIN` points the test at another binary: `.ci/run` runs it again with the one
//! `cargo install --path broker --locked` installed.

use std::path::{Path, PathBuf};
use std::process::Command;

use mmmq_tests::{Broker, mmmq_bin, run_ok, workspace_root, write_dispatchers};
use serde_json::json;

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// `cargo package -p mmmq-plugin-sdk`, unpacked under `into`: the SDK as crates.io would serve it.
fn packaged_sdk(into: &Path) -> PathBuf {
    let version = env!("CARGO_PKG_VERSION");
    // Its own target dir: the workspace's is locked by the `cargo test` running this.
    let target = into.join("package-target");
    run_ok(
        cargo()
            .current_dir(workspace_root())
            .args([
                "package",
                "-p",
                "mmmq-plugin-sdk",
                "--no-verify",
                "--allow-dirty",
                "--offline",
                "--target-dir",
            ])
            .arg(&target),
    );
    let krate = target.join(format!("package/mmmq-plugin-sdk-{version}.crate"));
    run_ok(
        Command::new("tar")
            .arg("xzf")
            .arg(&krate)
            .arg("-C")
            .arg(into),
    );
    let sdk = into.join(format!("mmmq-plugin-sdk-{version}"));
    assert!(
        sdk.join("wit/plugin.wit").exists(),
        "the packaged SDK carries its WIT"
    );
    sdk
}

/// `cargo ARGS` in the scaffold `krate`, with `sdk` in place of crates.io's `mmmq-plugin-sdk`.
/// Offline: the SDK's dependencies are in the registry cache from the workspace build. The
/// target dir is shared by both tests here, so those dependencies build once.
fn scaffold_cargo(krate: &Path, sdk: &Path, args: &[&str]) -> Command {
    let mut cmd = cargo();
    cmd.current_dir(krate)
        .args(args)
        .arg("--offline")
        .arg("--config")
        .arg(format!(
            "patch.crates-io.mmmq-plugin-sdk.path={}",
            json!(sdk.display().to_string())
        ))
        .arg("--target-dir")
        .arg(workspace_root().join("target/wasm-scaffold"));
    cmd
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_plugin_builds_against_the_packaged_sdk_checks_and_is_deployed() {
    mmmq_tests::ensure_wasm_target();
    let tmp = tempfile::tempdir().unwrap();
    let sdk = packaged_sdk(tmp.path());
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();

    // `mmmq --version` names the SDK version a scaffold is built with.
    let version = run_ok(Command::new(mmmq_bin()).arg("--version"));
    let version = String::from_utf8_lossy(&version.stdout);
    let sdk_version = env!("CARGO_PKG_VERSION");
    assert!(
        version.contains(&format!("plugin SDK: mmmq-plugin-sdk {sdk_version}"))
            && version.contains("mmmq:plugin/handler@0.2.0"),
        "{version}"
    );

    run_ok(
        Command::new(mmmq_bin())
            .current_dir(&empty)
            .args(["plugin", "new", "greeter"]),
    );
    let krate = empty.join("greeter");
    let manifest = std::fs::read_to_string(krate.join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains(&format!("mmmq-plugin-sdk = \"{sdk_version}\"")),
        "by version, no path: {manifest}"
    );
    let readme = std::fs::read_to_string(krate.join("README.md")).unwrap();

    // The scaffold's own test, natively.
    let tested = run_ok(&mut scaffold_cargo(&krate, &sdk, &["test"]));
    assert!(
        String::from_utf8_lossy(&tested.stdout).contains("1 passed"),
        "{}",
        String::from_utf8_lossy(&tested.stdout)
    );
    // The README's three commands: build, check, deploy.
    assert!(readme.contains("cargo build --release --target wasm32-wasip2"));
    run_ok(&mut scaffold_cargo(
        &krate,
        &sdk,
        &["build", "--release", "--target", "wasm32-wasip2"],
    ));
    let wasm = workspace_root().join("target/wasm-scaffold/wasm32-wasip2/release/greeter.wasm");
    assert!(readme.contains("mmmq plugin check target/wasm32-wasip2/release/greeter.wasm"));
    let check = run_ok(
        Command::new(mmmq_bin())
            .args(["plugin", "check"])
            .arg(&wasm),
    );
    let check = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.contains("compatible mmmq plugin") && check.contains("mmmq:plugin/handler@0.2.0"),
        "{check}"
    );

    // A running broker gets a dispatcher naming the plugin, by `mmmq reload` as the README says.
    let root = tmp.path().join("broker");
    let broker = Broker::start(&root).await;
    broker.produce("events", json!({"id": 7})).await;
    broker
        .produce("events", json!({"name": "not an event"}))
        .await;
    // A broken file is refused with the reason, and nothing changes.
    write_dispatchers(
        &root,
        &json!([{"consumerId": "greeter", "pattern": "events", "plugin": {"name": "greeter", "timeoutMs": 0}}]),
    );
    let refused = broker.cli(["reload"]);
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && why.contains("`plugin.timeoutMs` must be at least 1"),
        "{why}"
    );
    write_dispatchers(
        &root,
        &json!([{"consumerId": "greeter", "pattern": "events", "plugin": {"name": "greeter"}}]),
    );
    assert!(readme.contains("mmmq reload"));
    let reloaded = broker.cli_ok(["reload"]);
    assert!(
        String::from_utf8_lossy(&reloaded.stdout).contains("added: greeter"),
        "{}",
        String::from_utf8_lossy(&reloaded.stdout)
    );
    assert!(
        readme.contains(
            "mmmq plugin deploy target/wasm32-wasip2/release/greeter.wasm --name greeter"
        )
    );
    let wasm_path = wasm.to_str().unwrap();
    broker.cli_ok(["plugin", "deploy", wasm_path, "--name", "greeter"]);
    // The plugin handles both: the event is ACKed, the rest dead-lettered at once.
    broker
        .dispatcher_when("greeter", |s| {
            s["delivered"] == 1 && s["topics"][0]["deadLettered"] == 1
        })
        .await;
    let logs = broker.cli_ok(["plugin", "logs", "greeter"]);
    let logs = String::from_utf8_lossy(&logs.stdout);
    assert!(logs.contains("events offset 0: event 7"), "{logs}");
}

/// `--sdk-path`: developing against a checkout's SDK.
#[test]
fn sdk_path_scaffolds_against_a_checkout() {
    mmmq_tests::ensure_wasm_target();
    let tmp = tempfile::tempdir().unwrap();
    run_ok(
        Command::new(mmmq_bin())
            .args(["plugin", "new", "my-handler", "--dir"])
            .arg(tmp.path())
            .arg("--sdk-path")
            .arg(workspace_root().join("plugin-sdk")),
    );
    let krate = tmp.path().join("my-handler");
    let manifest = std::fs::read_to_string(krate.join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains("mmmq-plugin-sdk = { path = "),
        "{manifest}"
    );
    run_ok(
        cargo()
            .current_dir(&krate)
            .args([
                "build",
                "--offline",
                "--release",
                "--target",
                "wasm32-wasip2",
                "--target-dir",
            ])
            .arg(workspace_root().join("target/wasm-scaffold")),
    );
    let wasm = workspace_root().join("target/wasm-scaffold/wasm32-wasip2/release/my_handler.wasm");
    run_ok(
        Command::new(mmmq_bin())
            .args(["plugin", "check"])
            .arg(&wasm),
    );
    // Not an SDK: refused, nothing written.
    let out = Command::new(mmmq_bin())
        .args(["plugin", "new", "other", "--dir"])
        .arg(tmp.path())
        .arg("--sdk-path")
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not the plugin SDK"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!tmp.path().join("other").exists());
}
