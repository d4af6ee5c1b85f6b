//! Deployed plugins and their versions (README, "Deploying plugins"):
//! `{root-dir}/plugins/{name}/`.
//!
//! ```text
//! {root-dir}/plugins/{name}/{version}.wasm   each kept version (version: 16 hex digits of SHA-256)
//! {root-dir}/plugins/{name}/versions.json    {"current", "versions": [{"version","bytes","deployedAt","world"}…]}
//! {root-dir}/plugins/{name}/current.wasm     a copy of the current version
//! ```
//!
//! A dispatcher whose plugin names `name` runs `current.wasm`, so a deploy, a rollback or an
//! activation is one atomic replace of that file, and the plugin target's hot reload (README,
//! "WebAssembly handlers") switches versions between two messages, with no loss, no repeat, in
//! order. Every file is written aside, synced and renamed; `versions.json` decides what is
//! current, and `current.wasm` is repaired from it at open if a crash came between the two.

use std::path::{Path, PathBuf};

use mmmq_core::now_ms;
use serde::{Deserialize, Serialize};

use super::runtime::{PluginEngine, PluginError, version_of};
pub use mmmq_core::{Deployed, VersionInfo};

/// At least this many versions are kept per plugin (the current one always).
pub const KEPT_VERSIONS: usize = 10;

/// The largest component a deploy takes.
pub const MAX_PLUGIN_BYTES: usize = 64 << 20;

const CURRENT: &str = "current.wasm";
const INDEX: &str = "versions.json";

/// Why a deploy, rollback or activation was refused.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Not a plugin name.
    #[error("bad plugin name {0:?}: 1 to 200 characters of [A-Za-z0-9._-], not starting with '.'")]
    BadName(String),
    /// Not a component of a supported world.
    #[error(transparent)]
    Invalid(#[from] PluginError),
    /// Over [`MAX_PLUGIN_BYTES`].
    #[error("the component is {0} bytes; the limit is {MAX_PLUGIN_BYTES}")]
    TooLarge(usize),
    /// No plugin of that name was deployed.
    #[error("no plugin named {0:?} was deployed")]
    NoSuchPlugin(String),
    /// That version is not kept.
    #[error("plugin {name:?} has no version {version:?} (kept: {kept})")]
    NoSuchVersion {
        /// The plugin.
        name: String,
        /// The version asked for.
        version: String,
        /// The kept versions.
        kept: String,
    },
    /// A rollback from the oldest kept version.
    #[error("plugin {0:?} has no version before the current one")]
    NoPrevious(String),
    /// The disk refused.
    #[error("plugin store: {0}")]
    Io(String),
}

/// A plugin: its current version and the kept ones, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PluginVersions {
    /// The name.
    #[serde(default)]
    pub name: String,
    /// The version dispatchers naming it run.
    pub current: String,
    /// Kept versions in deploy order.
    pub versions: Vec<VersionInfo>,
}

/// The deployed plugins under `{root-dir}/plugins/`.
pub struct PluginStore {
    dir: PathBuf,
    /// One change at a time (a deploy, rollback or activation reads, then writes, the index).
    changing: tokio::sync::Mutex<()>,
}

impl PluginStore {
    /// The store of `root_dir`; repairs each plugin's `current.wasm` from its index. Blocking.
    pub fn open(root_dir: &Path) -> Self {
        let store = Self {
            dir: root_dir.join("plugins"),
            changing: tokio::sync::Mutex::new(()),
        };
        for name in names(&store.dir) {
            if let Err(e) = store.repair(&name) {
                tracing::error!(plugin = name, error = %e, "cannot repair the plugin's current version");
            }
        }
        store
    }

    /// The file a dispatcher naming `name` runs.
    pub fn current_path(root_dir: &Path, name: &str) -> PathBuf {
        root_dir.join("plugins").join(name).join(CURRENT)
    }

    /// The file of a kept version.
    pub fn version_path(root_dir: &Path, name: &str, version: &str) -> PathBuf {
        root_dir
            .join("plugins")
            .join(name)
            .join(format!("{version}.wasm"))
    }

    /// Checks a plugin name.
    pub fn check_name(name: &str) -> Result<(), StoreError> {
        let ok = (1..=200).contains(&name.len())
            && !name.starts_with('.')
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if ok {
            Ok(())
        } else {
            Err(StoreError::BadName(name.to_owned()))
        }
    }

    /// Validates `bytes` (a component of a supported world), stores it durably and makes it
    /// current. Deploying a kept version again makes it current.
    pub async fn deploy(&self, name: &str, bytes: Vec<u8>) -> Result<Deployed, StoreError> {
        Self::check_name(name)?;
        if bytes.len() > MAX_PLUGIN_BYTES {
            return Err(StoreError::TooLarge(bytes.len()));
        }
        let engine = PluginEngine::shared().await?;
        let (bytes, world) = tokio::task::spawn_blocking(move || {
            engine.compile(&bytes).map(|c| (bytes, c.world.to_owned()))
        })
        .await
        .expect("compile task panicked")?;
        let _one = self.changing.lock().await;
        let dir = self.dir.join(name);
        let name = name.to_owned();
        blocking(move || {
            let mut index = read_index(&dir)?.unwrap_or(PluginVersions {
                name: name.clone(),
                current: String::new(),
                versions: Vec::new(),
            });
            let version = version_of(&bytes);
            write_durably(&dir.join(format!("{version}.wasm")), &bytes)?;
            index.versions.retain(|v| v.version != version);
            index.versions.push(VersionInfo {
                version: version.clone(),
                bytes: bytes.len() as u64,
                deployed_at: now_ms(),
                world: world.clone(),
            });
            index.current = version.clone();
            let dropped = prune(&mut index);
            make_current(&dir, &index, &bytes)?;
            for old in dropped {
                let _ = std::fs::remove_file(dir.join(format!("{old}.wasm")));
            }
            Ok(Deployed {
                name,
                version,
                world,
            })
        })
        .await
    }

    /// Makes the version deployed before the current one current.
    pub async fn rollback(&self, name: &str) -> Result<Deployed, StoreError> {
        self.switch(name, |index| {
            let at = index
                .versions
                .iter()
                .position(|v| v.version == index.current)
                .unwrap_or(index.versions.len());
            match at.checked_sub(1) {
                Some(i) => Ok(index.versions[i].version.clone()),
                None => Err(StoreError::NoPrevious(index.name.clone())),
            }
        })
        .await
    }

    /// Makes a kept version current.
    pub async fn activate(&self, name: &str, version: &str) -> Result<Deployed, StoreError> {
        let version = version.to_owned();
        self.switch(name, move |index| {
            if index.versions.iter().any(|v| v.version == version) {
                Ok(version.clone())
            } else {
                Err(StoreError::NoSuchVersion {
                    name: index.name.clone(),
                    version: version.clone(),
                    kept: index
                        .versions
                        .iter()
                        .map(|v| v.version.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                })
            }
        })
        .await
    }

    async fn switch(
        &self,
        name: &str,
        choose: impl FnOnce(&PluginVersions) -> Result<String, StoreError> + Send + 'static,
    ) -> Result<Deployed, StoreError> {
        Self::check_name(name)?;
        let _one = self.changing.lock().await;
        let dir = self.dir.join(name);
        let name = name.to_owned();
        blocking(move || {
            let mut index = read_index(&dir)?.ok_or(StoreError::NoSuchPlugin(name.clone()))?;
            index.name = name.clone();
            let version = choose(&index)?;
            let bytes = std::fs::read(dir.join(format!("{version}.wasm")))
                .map_err(|e| StoreError::Io(format!("{version}.wasm: {e}")))?;
            index.current = version.clone();
            make_current(&dir, &index, &bytes)?;
            let world = index
                .versions
                .iter()
                .find(|v| v.version == version)
                .map(|v| v.world.clone())
                .unwrap_or_default();
            Ok(Deployed {
                name,
                version,
                world,
            })
        })
        .await
    }

    /// Every deployed plugin, by name.
    pub async fn list(&self) -> Result<Vec<PluginVersions>, StoreError> {
        let dir = self.dir.clone();
        blocking(move || {
            let mut out = Vec::new();
            for name in names(&dir) {
                if let Some(mut index) = read_index(&dir.join(&name))? {
                    index.name = name;
                    out.push(index);
                }
            }
            Ok(out)
        })
        .await
    }

    /// Rewrites `current.wasm` when it is not the index's current version (a crash between the
    /// index and the copy). Blocking.
    fn repair(&self, name: &str) -> Result<(), StoreError> {
        let dir = self.dir.join(name);
        let Some(index) = read_index(&dir)? else {
            return Ok(());
        };
        let current = std::fs::read(dir.join(CURRENT)).ok();
        if current.as_deref().map(version_of).as_deref() != Some(&*index.current) {
            let bytes = std::fs::read(dir.join(format!("{}.wasm", index.current)))
                .map_err(|e| StoreError::Io(e.to_string()))?;
            tracing::warn!(
                plugin = name,
                version = index.current,
                "current.wasm repaired from the index"
            );
            write_durably(&dir.join(CURRENT), &bytes)?;
        }
        Ok(())
    }
}

/// The deployed plugins in `dir`, by name. Blocking.
fn names(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().join(INDEX).is_file())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

/// Drops the oldest versions past [`KEPT_VERSIONS`] (never the current one); their names.
fn prune(index: &mut PluginVersions) -> Vec<String> {
    let mut dropped = Vec::new();
    while index.versions.len() > KEPT_VERSIONS {
        let Some(i) = index
            .versions
            .iter()
            .position(|v| v.version != index.current)
        else {
            break;
        };
        dropped.push(index.versions.remove(i).version);
    }
    dropped
}

/// The index first (it decides), then the copy the dispatchers run.
fn make_current(dir: &Path, index: &PluginVersions, bytes: &[u8]) -> Result<(), StoreError> {
    let raw = serde_json::to_vec_pretty(index).expect("an index encodes");
    write_durably(&dir.join(INDEX), &raw)?;
    write_durably(&dir.join(CURRENT), bytes)
}

fn read_index(dir: &Path) -> Result<Option<PluginVersions>, StoreError> {
    match std::fs::read(dir.join(INDEX)) {
        Ok(raw) => serde_json::from_slice(&raw)
            .map(Some)
            .map_err(|e| StoreError::Io(format!("{}: {e}", dir.join(INDEX).display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError::Io(e.to_string())),
    }
}

/// Writes aside, syncs, renames over, syncs the directory.
fn write_durably(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    use std::io::Write;
    let io = |e: std::io::Error| StoreError::Io(format!("{}: {e}", path.display()));
    let dir = path.parent().expect("a file in a directory");
    std::fs::create_dir_all(dir).map_err(io)?;
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name().unwrap_or_default().to_string_lossy()
    ));
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .expect("plugin store task panicked")
}
