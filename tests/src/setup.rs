//! Root dirs for the tests: `dispatchers.json` entries and plugin components built from this
//! workspace.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::workspace_root;

/// Writes `{root}/dispatchers.json`.
pub fn write_dispatchers(root: &Path, dispatchers: &Value) {
    std::fs::create_dir_all(root).unwrap();
    std::fs::write(
        root.join("dispatchers.json"),
        serde_json::to_vec_pretty(dispatchers).unwrap(),
    )
    .unwrap();
}

/// A dispatcher entry for a local consumer.
pub fn host_dispatcher(id: &str, pattern: &str, port: u16) -> Value {
    serde_json::json!({
        "consumerId": id,
        "pattern": pattern,
        "host": {"protocol": "HTTP", "address": "127.0.0.1", "port": port, "timeoutMs": 5000},
    })
}

/// A dispatcher entry for a plugin file in `{root}/plugins/`; `extra` adds fields (and fields of
/// `"plugin"`).
pub fn plugin_dispatcher(id: &str, pattern: &str, file: &str, extra: Value) -> Value {
    let mut d = serde_json::json!({"consumerId": id, "pattern": pattern, "plugin": {"path": format!("plugins/{file}")}});
    if let Value::Object(extra) = extra {
        for (k, v) in extra {
            if k == "plugin" {
                for (pk, pv) in v.as_object().unwrap() {
                    d["plugin"][pk] = pv.clone();
                }
            } else {
                d[k] = v;
            }
        }
    }
    d
}

/// A root dir whose one dispatcher, `id`, runs the `testbed` plugin on `pattern` (`extra` as in
/// [`plugin_dispatcher`]).
pub fn testbed_root(root: &Path, id: &str, pattern: &str, extra: Value) {
    deploy_plugin(root, &plugin_wasm("testbed", None), "testbed.wasm");
    write_dispatchers(
        root,
        &serde_json::json!([plugin_dispatcher(id, pattern, "testbed.wasm", extra)]),
    );
}

/// Builds the plugin crate `package` for `wasm32-wasip2` (profile `plugin`) and returns the
/// component's path. `variant` sets `TESTBED_VERSION` and gets its own target dir, so two
/// versions of one plugin can exist side by side. Built once per test process.
pub fn plugin_wasm(package: &str, variant: Option<&str>) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let key = format!("{package}/{}", variant.unwrap_or("-"));
    let mut built = BUILT.lock().unwrap();
    if let Some((_, p)) = built.iter().find(|(k, _)| *k == key) {
        return p.clone();
    }
    ensure_wasm_target();
    let root = workspace_root();
    let target_dir = root.join("target").join(match variant {
        Some(v) => format!("wasm-{v}"),
        None => "wasm".to_owned(),
    });
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args([
            "build",
            "--profile",
            "plugin",
            "--target",
            "wasm32-wasip2",
            "-p",
            package,
        ])
        .arg("--target-dir")
        .arg(&target_dir);
    if let Some(v) = variant {
        cmd.env("TESTBED_VERSION", v);
    }
    let out = cmd.output().expect("run cargo");
    assert!(
        out.status.success(),
        "building {package} for wasm32-wasip2 failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = target_dir
        .join("wasm32-wasip2/plugin")
        .join(format!("{}.wasm", package.replace('-', "_")));
    assert!(path.exists(), "{} was not built", path.display());
    built.push((key, path.clone()));
    path
}

/// Installs the `wasm32-wasip2` target when it is missing (`scripts/test` does it first).
pub fn ensure_wasm_target() {
    let out = Command::new("rustc")
        .args(["--print", "target-libdir", "--target", "wasm32-wasip2"])
        .output();
    let installed = out
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .is_some_and(|p| p.exists());
    if !installed {
        let status = Command::new("rustup")
            .args(["target", "add", "wasm32-wasip2"])
            .status()
            .expect("rustup");
        assert!(status.success(), "rustup target add wasm32-wasip2 failed");
    }
}

/// Copies a built component to `{root}/plugins/{name}` atomically (write aside, then rename), as
/// a deploy would.
pub fn deploy_plugin(root: &Path, wasm: &Path, name: &str) -> PathBuf {
    let dir = root.join("plugins");
    std::fs::create_dir_all(&dir).unwrap();
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::copy(wasm, &tmp).unwrap();
    let dest = dir.join(name);
    std::fs::rename(&tmp, &dest).unwrap();
    dest
}

/// The same component with a custom section appended: another version of the same code (a
/// deploy of it is a new version) without a second build.
pub fn wasm_variant(wasm: &[u8], n: u8) -> Vec<u8> {
    let mut out = wasm.to_vec();
    let name = b"mmmq-test";
    out.extend_from_slice(&[0, (1 + name.len() + 1) as u8, name.len() as u8]);
    out.extend_from_slice(name);
    out.push(n);
    out
}
