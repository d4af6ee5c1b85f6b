//! The `plugin` of a `dispatchers.json` entry (docs/dispatchers.md, "Dispatchers" and "Deploying plugins by
//! API"): a component by `path` or a deployed plugin by `name`, its shadow version, limits,
//! config and allowed origins. [`super::dispatchers`] parses the rest of the entry.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::AllowedOrigin;
use crate::plugin::store::PluginStore;

/// A WebAssembly handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginSpec {
    /// The component file, resolved against the root dir (for a named plugin, its
    /// `current.wasm`).
    pub path: PathBuf,
    /// `plugin.name`: a deployed plugin (docs/plugins.md, "Deploying plugins by API") whose current version it
    /// follows; `None` for `plugin.path`.
    pub name: Option<String>,
    /// `plugin.shadow`: a kept version of the named plugin run after the current one on every
    /// message, side-effect free, its verdicts compared.
    pub shadow: Option<ShadowSpec>,
    /// Each `handle` call is interrupted after this long.
    pub timeout: Duration,
    /// The guest's memory cap.
    pub max_memory_bytes: u64,
    /// `plugin.config`: what a 0.2.0 plugin reads with `get-config`.
    pub config: std::sync::Arc<std::collections::BTreeMap<String, String>>,
    /// `plugin.allowedHosts`: the origins its `wasi:http` requests may go to (none: no network).
    pub allowed_hosts: std::sync::Arc<Vec<AllowedOrigin>>,
}

/// A shadow version (docs/plugins.md, "Deploying plugins by API").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowSpec {
    /// The version.
    pub version: String,
    /// Its file in the plugin's directory.
    pub path: PathBuf,
}

/// Default plugin call timeout.
pub const DEFAULT_PLUGIN_TIMEOUT_MS: u64 = 1_000;
/// Default plugin memory cap (64 MiB).
pub const DEFAULT_PLUGIN_MEMORY: u64 = 64 * 1024 * 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawPlugin {
    path: Option<String>,
    name: Option<String>,
    shadow: Option<String>,
    timeout_ms: Option<u64>,
    max_memory_bytes: Option<u64>,
    config: Option<std::collections::BTreeMap<String, String>>,
    allowed_hosts: Option<Vec<String>>,
}

/// `plugin.path` resolved against the root dir, which it must not leave: no absolute path, no
/// `..` (docs/dispatchers.md, "Dispatchers"). The file is the broker's to read and to show errors about, and
/// the contract makes the path relative to the root dir; what lies outside is the operator's to
/// bring in (a copy, or a symbolic link they make inside the root dir). Checked on the text, so
/// it holds for a file that does not exist yet.
fn inside_root(root_dir: &Path, path: &str) -> Result<PathBuf, String> {
    let escapes = Path::new(path).components().any(|c| {
        matches!(
            c,
            Component::ParentDir | Component::RootDir | Component::Prefix(_)
        )
    });
    if escapes {
        return Err(format!(
            "`plugin.path` {path:?} is outside the root dir: give a path relative to it, without \
             `..` (e.g. \"plugins/audit.wasm\"), or deploy the plugin by name"
        ));
    }
    Ok(root_dir.join(path))
}

/// Checks an entry's `plugin` object; paths are resolved against the root dir.
pub(super) fn plugin_spec(p: RawPlugin, root_dir: &Path) -> Result<PluginSpec, String> {
    let (path, name) = match (&p.path, &p.name) {
        (Some(path), None) if path.trim().is_empty() => {
            return Err("`plugin.path` is empty".into());
        }
        (Some(path), None) => (inside_root(root_dir, path)?, None),
        (None, Some(name)) => {
            PluginStore::check_name(name).map_err(|e| format!("`plugin.name`: {e}"))?;
            (
                PluginStore::current_path(root_dir, name),
                Some(name.clone()),
            )
        }
        _ => return Err("`plugin` needs exactly one of `path` and `name`".into()),
    };
    let shadow = match (&p.shadow, &name) {
        (None, _) => None,
        (Some(_), None) => {
            return Err("`plugin.shadow` names a kept version of a `plugin.name`".into());
        }
        (Some(v), Some(name)) => {
            if v.len() != 16 || !v.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!(
                    "`plugin.shadow`: {v:?} is not a version (16 hex digits)"
                ));
            }
            Some(ShadowSpec {
                version: v.clone(),
                path: PluginStore::version_path(root_dir, name, v),
            })
        }
    };
    let max_memory_bytes = p.max_memory_bytes.unwrap_or(DEFAULT_PLUGIN_MEMORY);
    if max_memory_bytes < 64 * 1024 {
        return Err("`plugin.maxMemoryBytes` must be at least 65536 (one wasm page)".into());
    }
    Ok(PluginSpec {
        path,
        name,
        shadow,
        timeout: super::positive_ms(p.timeout_ms, DEFAULT_PLUGIN_TIMEOUT_MS, "plugin.timeoutMs")?,
        max_memory_bytes,
        config: std::sync::Arc::new(p.config.unwrap_or_default()),
        allowed_hosts: std::sync::Arc::new(
            p.allowed_hosts
                .unwrap_or_default()
                .iter()
                .enumerate()
                .map(|(i, h)| {
                    AllowedOrigin::parse(h).map_err(|e| format!("`plugin.allowedHosts[{i}]`: {e}"))
                })
                .collect::<Result<_, _>>()?,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_path_stays_inside_the_root_dir() {
        let root = Path::new("/root");
        assert_eq!(
            inside_root(root, "plugins/a..b.wasm").unwrap(),
            Path::new("/root/plugins/a..b.wasm")
        );
        assert_eq!(
            inside_root(root, "./audit.wasm").unwrap(),
            Path::new("/root/./audit.wasm")
        );
        for bad in ["/etc/hostname", "../x.wasm", "plugins/../../x.wasm", "a/.."] {
            let e = inside_root(root, bad).unwrap_err();
            assert!(
                e.starts_with(&format!("`plugin.path` {bad:?} is outside")),
                "{e}"
            );
        }
    }
}
