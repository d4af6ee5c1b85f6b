//! `mmmq plugin new` as a plugin author without this checkout gets it (docs/plugins.md, "Write,
//! deploy and change a handler"): with nothing but the `mmmq` binary and cargo — no checkout, no packaged
//! SDK, no `[patch]` — a crate made in an empty directory tests natively, builds, passes
//! `mmmq plugin check` and is deployed to a running broker. Here the SDK is not on crates.io
//! (the index the binary asks is a port nothing listens on), so the binary writes the sources it
//! carries beside the plugin.
//!
//! `MMMQ_BIN` points the test at another binary: `.ci/run` runs it again with the one
//! `cargo install --path broker --locked` installed.

use std::path::PathBuf;
use std::process::Command;

use mmmq_tests::{
    Broker, build_plugin_snippet, mmmq_bin, run_ok, scaffold_cargo_ok, scaffold_target_dir,
    workspace_root, write_dispatchers,
};
use serde_json::json;

const SDK_VERSION: &str = env!("CARGO_PKG_VERSION");

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_plugin_builds_with_only_the_binary_checks_and_is_deployed() {
    mmmq_tests::ensure_wasm_target();
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();

    // `mmmq --version` names the SDK version a scaffold is built with.
    let version = stdout(&run_ok(Command::new(mmmq_bin()).arg("--version")));
    assert!(
        version.contains(&format!("plugin SDK: mmmq-plugin-sdk {SDK_VERSION}"))
            && version.contains("mmmq:plugin/handler@0.2.0"),
        "{version}"
    );

    // The SDK is not on "crates.io": the index does not answer.
    let index = "http://127.0.0.1:9/mm/mq/mmmq-plugin-sdk".to_owned();
    let created = run_ok(
        Command::new(mmmq_bin())
            .current_dir(&empty)
            .env("MMMQ_SDK_INDEX", &index)
            .args(["plugin", "new", "greeter"]),
    );
    let krate = empty.join("greeter");

    // The scaffold's own tests, natively, then the README's three commands: build, check, deploy.
    let tested = scaffold_cargo_ok(&krate, &["test"]);
    assert!(stdout(&tested).contains("2 passed"), "{}", stdout(&tested));
    let readme = std::fs::read_to_string(krate.join("README.md")).unwrap();
    assert!(readme.contains("cargo build --release --target wasm32-wasip2"));
    scaffold_cargo_ok(&krate, &["build", "--release", "--target", "wasm32-wasip2"]);

    // What it said and wrote: the SDK beside the plugin, by path and version.
    let said = stdout(&created);
    assert_eq!(
        said,
        format!(
            "created ./greeter (its README says how to build, check and deploy it)\n  \
             SDK: mmmq-plugin-sdk {SDK_VERSION} from ./greeter/mmmq-plugin-sdk, written there \
             because {index} could not be asked: error sending request: client error (Connect): \
             tcp connect error: Connection refused (os error 111)\n       \
             (the README says how to switch to crates.io once it is there)\n  \
             cd ./greeter && cargo test && cargo build --release --target wasm32-wasip2\n"
        )
    );
    let manifest = std::fs::read_to_string(krate.join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains(&format!(
            "\nmmmq-plugin-sdk = {{ path = \"mmmq-plugin-sdk\", version = \"{SDK_VERSION}\" }}\n"
        )),
        "{manifest}"
    );
    assert!(readme.contains("## The SDK in `mmmq-plugin-sdk/`"));

    let wasm = scaffold_target_dir().join("wasm32-wasip2/release/greeter.wasm");
    assert!(readme.contains("mmmq plugin check target/wasm32-wasip2/release/greeter.wasm"));
    let check = stdout(&run_ok(
        Command::new(mmmq_bin())
            .args(["plugin", "check"])
            .arg(&wasm),
    ));
    assert!(
        check.contains("compatible mmmq plugin") && check.contains("mmmq:plugin/handler@0.2.0"),
        "{check}"
    );

    // A running broker gets a dispatcher naming the plugin, by `mmmq reload` as the README says.
    let root = tmp.path().join("broker");
    let broker = Broker::start(&root).await;
    // The README's two messages: an event, and something that is not one.
    assert!(readme.contains(r#"mmmq produce --topic events '{"id": 7}'"#));
    assert!(readme.contains(r#"mmmq produce --topic events '{"name": "Ada"}'"#));
    broker.cli_ok(["produce", "--topic", "events", r#"{"id": 7}"#]);
    broker.cli_ok(["produce", "--topic", "events", r#"{"name": "Ada"}"#]);
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
    // The README's dispatcher entry.
    let entry = r#"{"consumerId": "greeter", "pattern": "events", "plugin": {"name": "greeter"}}"#;
    assert!(readme.contains(entry));
    write_dispatchers(
        &root,
        &json!([serde_json::from_str::<serde_json::Value>(entry).unwrap()]),
    );
    assert!(readme.contains("mmmq reload"));
    let reloaded = stdout(&broker.cli_ok(["reload"]));
    assert!(reloaded.contains("added: greeter"), "{reloaded}");
    assert!(
        readme.contains(
            "mmmq plugin deploy target/wasm32-wasip2/release/greeter.wasm --name greeter"
        )
    );
    let wasm_path = wasm.to_str().unwrap();
    broker.cli_ok(["plugin", "deploy", wasm_path, "--name", "greeter"]);
    // The event is ACKed, the rest dead-lettered at once with the reason.
    broker
        .dispatcher_when("greeter", |s| {
            s["delivered"] == 1 && s["topics"][0]["deadLettered"] == 1
        })
        .await;
    let logs = stdout(&broker.cli_ok(["plugin", "logs", "greeter"]));
    assert!(logs.contains("events offset 0: event 7"), "{logs}");
    let dlq = broker.pull_all("__dlq.greeter").await;
    assert_eq!(
        (
            &dlq[0]["content"]["reason"],
            &dlq[0]["content"]["envelope"]["offset"]
        ),
        (
            &json!("not an event: missing field `id` at line 1 column 14"),
            &json!(1)
        ),
        "{dlq:?}"
    );
}

/// When the index lists the SDK of this version, the scaffold takes it from the registry, as
/// any crate would, and writes no sources.
#[tokio::test(flavor = "multi_thread")]
async fn a_published_sdk_is_taken_from_the_registry() {
    let line = format!(r#"{{"name":"mmmq-plugin-sdk","vers":"{SDK_VERSION}","yanked":false}}"#);
    let app = axum::Router::new().route(
        "/mm/mq/mmmq-plugin-sdk",
        axum::routing::get(move || async move { line }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let index = format!(
        "http://{}/mm/mq/mmmq-plugin-sdk",
        listener.local_addr().unwrap()
    );
    tokio::spawn(async move { axum::serve(listener, app).await });

    let tmp = tempfile::tempdir().unwrap();
    let created = tokio::task::spawn_blocking({
        let dir = tmp.path().to_owned();
        move || {
            run_ok(
                Command::new(mmmq_bin())
                    .env("MMMQ_SDK_INDEX", index)
                    .args(["plugin", "new", "my-handler", "--dir"])
                    .arg(dir),
            )
        }
    })
    .await
    .unwrap();
    let said = stdout(&created);
    assert!(
        said.contains(&format!(
            "\n  SDK: mmmq-plugin-sdk {SDK_VERSION} from crates.io\n"
        )),
        "{said}"
    );
    let krate = tmp.path().join("my-handler");
    let manifest = std::fs::read_to_string(krate.join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains(&format!("\nmmmq-plugin-sdk = \"{SDK_VERSION}\"\n")),
        "{manifest}"
    );
    assert!(!krate.join("mmmq-plugin-sdk").exists());
}

/// Every `rust` block of the plugin guide (docs/plugins.md) builds in a fresh scaffold and passes
/// `mmmq plugin check` (the README's own handler is built by its tour, `readme.rs`); code that
/// does not compile panics with cargo's error.
#[test]
fn the_plugin_guides_snippets_build_in_a_fresh_scaffold() {
    let guide = std::fs::read_to_string(workspace_root().join("docs/plugins.md")).unwrap();
    let snippets: Vec<&str> = guide
        .split("```rust\n")
        .skip(1)
        .map(|block| &block[..block.find("```").unwrap()])
        .collect();
    assert!(!snippets.is_empty(), "the guide shows a handler");
    let mut wasm = PathBuf::new();
    for snippet in snippets {
        wasm = build_plugin_snippet(snippet);
        let check = stdout(&run_ok(
            Command::new(mmmq_bin())
                .args(["plugin", "check"])
                .arg(&wasm),
        ));
        assert!(check.contains("compatible mmmq plugin"), "{check}");
    }
    let failed = std::panic::catch_unwind(|| build_plugin_snippet("fn handle() -> Nope {}"))
        .expect_err("does not compile");
    let why = failed.downcast_ref::<String>().unwrap();
    assert!(
        why.contains("cargo test of the snippet failed") && why.contains("Nope"),
        "{why}"
    );
    // The crate recovers: the next snippet builds.
    assert_ne!(build_plugin_snippet("//! Nothing.\n"), wasm);
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
    scaffold_cargo_ok(&krate, &["build", "--release", "--target", "wasm32-wasip2"]);
    let wasm = scaffold_target_dir().join("wasm32-wasip2/release/my_handler.wasm");
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
