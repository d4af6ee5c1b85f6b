//! Plugin code built as a plugin author builds it: in a crate made by `mmmq plugin new`, with the
//! SDK's sources the binary carries written beside it (no checkout, no registry), so that a
//! handler shown in the README or the docs is known to compile against what users get.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

use mmmq::plugin::scaffold::{self, Sdk};

use crate::{ensure_wasm_target, workspace_root};

/// Where every scaffold of the tests builds: the SDK's dependencies build once for all of them.
pub fn scaffold_target_dir() -> PathBuf {
    workspace_root().join("target/wasm-scaffold")
}

/// Runs `cargo ARGS --offline --target-dir target/wasm-scaffold` in the plugin crate `krate`
/// and returns what it printed, succeeded or not. Offline: the SDK's dependencies are in the
/// registry cache from the workspace build.
///
/// The scaffolds' SDKs all sit at `mmmq-plugin-sdk/` in their crate, so cargo gives them one
/// artifact name: a second build (another test, another process) would replace the SDK that a
/// first one's doc tests are reading after cargo let go of the target dir. So each command holds
/// a lock of its own on the target dir from start to end.
pub fn scaffold_cargo(krate: &Path, args: &[&str]) -> Output {
    let target = scaffold_target_dir();
    std::fs::create_dir_all(&target).unwrap();
    let lock = File::create(target.join(".mmmq-tests.lock")).unwrap();
    lock.lock().unwrap();
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(krate)
        .args(args)
        .arg("--offline")
        .arg("--target-dir")
        .arg(&target)
        .output()
        .expect("run cargo")
}

/// [`scaffold_cargo`], panicking with what cargo printed unless it succeeded.
pub fn scaffold_cargo_ok(krate: &Path, args: &[&str]) -> Output {
    let out = scaffold_cargo(krate, args);
    assert!(
        out.status.success(),
        "cargo {} in {} failed:\n{}\n{}",
        args.join(" "),
        krate.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    out
}

/// Builds a plugin whose `src/lib.rs` is `lib_rs` and returns its component: `cargo test` (the
/// snippet's own tests, natively), then `cargo build --release --target wasm32-wasip2`. Panics
/// with cargo's output when either fails.
///
/// The crate is made once per process, by `mmmq plugin new --vendor-sdk` (the library call), in
/// `target/tmp/plugin-snippets/snippet-{pid}` (its name is the process's, so that processes
/// building at once never overwrite each other's component); calls take turns, and each
/// component is copied aside before the next build overwrites it.
pub fn build_plugin_snippet(lib_rs: &str) -> PathBuf {
    /// The crate, and how many components were built in it.
    static CRATE: Mutex<Option<(PathBuf, usize)>> = Mutex::new(None);
    // A snippet that does not build panics with the lock held; the next one starts afresh.
    let mut made = CRATE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let (krate, built) = made.get_or_insert_with(|| {
        ensure_wasm_target();
        let name = format!("snippet-{}", std::process::id());
        let dir = workspace_root().join("target/tmp/plugin-snippets");
        // A crate left by an earlier process with this id.
        let _ = std::fs::remove_dir_all(dir.join(&name));
        std::fs::create_dir_all(&dir).unwrap();
        let krate = scaffold::new(&name, &dir, &Sdk::Vendored).unwrap();
        (krate, 0)
    });
    std::fs::write(krate.join("src/lib.rs"), lib_rs).unwrap();
    for args in [
        &["test"][..],
        &["build", "--release", "--target", "wasm32-wasip2"],
    ] {
        let out = scaffold_cargo(krate, args);
        assert!(
            out.status.success(),
            "cargo {} of the snippet failed:\n{}\n{}\nsrc/lib.rs:\n{lib_rs}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
    }
    let lib = krate
        .file_name()
        .expect("a crate name")
        .to_string_lossy()
        .replace('-', "_");
    let component = scaffold_target_dir().join(format!("wasm32-wasip2/release/{lib}.wasm"));
    *built += 1;
    let kept = krate.join(format!("built/{built}.wasm"));
    std::fs::create_dir_all(kept.parent().unwrap()).unwrap();
    std::fs::copy(&component, &kept).unwrap_or_else(|e| panic!("{}: {e}", component.display()));
    kept
}
