//! Deployed plugins and their versions (docs/plugins.md, "Deploying plugins by API"):
//! `{root-dir}/plugins/{name}/`.
//!
//! ```text
//! {root-dir}/plugins/{name}/{version}.wasm   each kept version (version: 16 hex digits of SHA-256)
//! {root-dir}/plugins/{name}/versions.json    {"current", "versions": [{"version","bytes","deployedAt","world"}…]}
//! {root-dir}/plugins/{name}/current.wasm     a copy of the current version
//! ```
//!
//! (The kept versions and their index are [`super::kept`]'s, shared with `plugin.path`
//! dispatchers, which keep what they load in `{root-dir}/plugins/.path/{consumerId}/`.)
//!
//! A dispatcher whose plugin names `name` runs `current.wasm`, so a deploy, a rollback or an
//! activation is one atomic replace of that file, and the plugin target's hot reload (docs/plugins.md,
//! "WebAssembly handlers") switches versions between two messages, with no loss, no repeat, in
//! order. Every file is written aside, synced and renamed, and every directory is made durably;
//! `versions.json` decides what is current, and `current.wasm` is repaired from it at open if a
//! crash came between the two.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::kept::{self, INDEX, KeptError, read_index, version_file, write_durably, write_index};
pub use super::kept::{KEPT_VERSIONS, PluginVersions};
use super::runtime::{PluginEngine, PluginError, version_of};
use crate::storage::vfs::read_whole;
use crate::storage::{OsFs, Vfs};
pub use mmmq_core::{Deployed, VersionInfo};

/// The largest component a deploy takes.
pub const MAX_PLUGIN_BYTES: usize = 64 << 20;

const CURRENT: &str = "current.wasm";

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
    /// The disk refused, or a file is not what it should be.
    #[error("plugin store: {0}")]
    Io(#[from] KeptError),
    /// The cluster could not make the change now (docs/cluster.md, "Configuration in a
    /// cluster").
    #[error(transparent)]
    Cluster(#[from] crate::cluster::node::ClusterError),
}

/// The deployed plugins under `{root-dir}/plugins/`.
pub struct PluginStore {
    vfs: Arc<dyn Vfs>,
    dir: PathBuf,
    /// One change at a time (a deploy, rollback or activation reads, then writes, the index).
    changing: tokio::sync::Mutex<()>,
}

impl PluginStore {
    /// The store of `root_dir`; repairs each plugin's `current.wasm` from its index. Blocking.
    pub fn open(root_dir: &Path) -> Self {
        Self::open_on(Arc::new(OsFs), root_dir)
    }

    /// [`PluginStore::open`] on another file system (the simulated disk of a test). Blocking.
    pub fn open_on(vfs: Arc<dyn Vfs>, root_dir: &Path) -> Self {
        let store = Self {
            vfs,
            dir: root_dir.join("plugins"),
            changing: tokio::sync::Mutex::new(()),
        };
        for name in names(&*store.vfs, &store.dir) {
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
        version_file(&root_dir.join("plugins").join(name), version)
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
        let (bytes, world) = Self::compile(name, bytes).await?;
        let _one = self.changing.lock().await;
        let dir = self.dir.join(name);
        let name = name.to_owned();
        let vfs = self.vfs.clone();
        blocking(move || {
            let index = read_index(&*vfs, &dir)?;
            // The index names the new version before `current.wasm` holds it: a crash between
            // the two is repaired at open.
            let index = kept::keep(&*vfs, &dir, index, &name, &bytes, &world)?;
            write_durably(&*vfs, &dir.join(CURRENT), &bytes)?;
            Ok(Deployed {
                name,
                version: index.current,
                world,
            })
        })
        .await
    }

    /// Checks a deploy of `bytes` as `name`: a plugin name, not too large, a component of a
    /// supported world (answered with the bytes).
    async fn compile(name: &str, bytes: Vec<u8>) -> Result<(Vec<u8>, String), StoreError> {
        Self::check_name(name)?;
        if bytes.len() > MAX_PLUGIN_BYTES {
            return Err(StoreError::TooLarge(bytes.len()));
        }
        let engine = PluginEngine::shared().await?;
        Ok(tokio::task::spawn_blocking(move || {
            engine.compile(&bytes).map(|c| (bytes, c.world.to_owned()))
        })
        .await
        .expect("compile task panicked")?)
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

    /// Runs `f` on plugin `name`'s directory off the executor, one change of the store at a
    /// time (each reads, then writes, the index).
    async fn change<T: Send + 'static>(
        &self,
        name: &str,
        f: impl FnOnce(&dyn Vfs, &Path, String) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        Self::check_name(name)?;
        let _one = self.changing.lock().await;
        let dir = self.dir.join(name);
        let name = name.to_owned();
        let vfs = self.vfs.clone();
        blocking(move || f(&*vfs, &dir, name)).await
    }

    async fn switch(
        &self,
        name: &str,
        choose: impl FnOnce(&PluginVersions) -> Result<String, StoreError> + Send + 'static,
    ) -> Result<Deployed, StoreError> {
        self.change(name, move |vfs, dir, name| {
            let mut index = read_index(vfs, dir)?.ok_or(StoreError::NoSuchPlugin(name.clone()))?;
            index.name = name.clone();
            let version = choose(&index)?;
            let bytes = read_version(vfs, dir, &version)?;
            index.current = version.clone();
            make_current(vfs, dir, &index, &bytes)?;
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
        let vfs = self.vfs.clone();
        blocking(move || {
            let mut out = Vec::new();
            for name in names(&*vfs, &dir) {
                if let Some(mut index) = read_index(&*vfs, &dir.join(&name))? {
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
        let vfs = &*self.vfs;
        let dir = self.dir.join(name);
        let Some(index) = read_index(vfs, &dir)? else {
            return Ok(());
        };
        let current = read_whole(vfs, &dir.join(CURRENT)).ok().flatten();
        if current.as_deref().map(version_of).as_deref() != Some(&*index.current) {
            let bytes = read_version(vfs, &dir, &index.current)?;
            tracing::warn!(
                plugin = name,
                version = index.current,
                "current.wasm repaired from the index"
            );
            write_durably(vfs, &dir.join(CURRENT), &bytes)?;
        }
        Ok(())
    }
}

/// The bytes of a kept version the index names. Blocking.
fn read_version(vfs: &dyn Vfs, dir: &Path, version: &str) -> Result<Vec<u8>, StoreError> {
    let path = version_file(dir, version);
    read_whole(vfs, &path)
        .map_err(KeptError::from)?
        .ok_or(StoreError::Io(KeptError::Missing(path)))
}

/// The deployed plugins in `dir`, by name. Blocking.
fn names(vfs: &dyn Vfs, dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = vfs
        .read_dir(dir)
        .unwrap_or_default()
        .into_iter()
        // `.path` holds what `plugin.path` dispatchers loaded, not a plugin.
        .filter(|name| !name.starts_with('.') && vfs.exists(&dir.join(name).join(INDEX)))
        .collect();
    names.sort();
    names
}

/// The index first (it decides), then the copy the dispatchers run.
fn make_current(
    vfs: &dyn Vfs,
    dir: &Path,
    index: &PluginVersions,
    bytes: &[u8],
) -> Result<(), StoreError> {
    write_index(vfs, dir, index)?;
    Ok(write_durably(vfs, &dir.join(CURRENT), bytes)?)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .expect("plugin store task panicked")
}

#[path = "store_cluster.rs"]
pub mod cluster;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::kept::{keep_loaded, loaded_dir};
    use crate::storage::vfs::sim::{CutMode, SimFs};

    /// A rollback is durable when it answers, `current.wasm` included, and what `plugin.path`
    /// dispatchers keep beside the plugins is not listed as one.
    #[tokio::test]
    async fn a_rollback_survives_a_power_cut_and_loaded_versions_are_not_plugins() {
        let fs = SimFs::new();
        let root = Path::new("/root");
        fs.mkdir_durable(root);
        let dir = root.join("plugins").join("p");
        // Two deployed versions (not components: the store does not compile what it keeps), the
        // copy the dispatchers run not written yet, as after a crash in a deploy.
        let v1 = kept::keep(&fs, &dir, None, "p", b"\0asm v1", "w").unwrap();
        let index = read_index(&fs, &dir).unwrap();
        let v2 = kept::keep(&fs, &dir, index, "p", b"\0asm v2", "w").unwrap();
        keep_loaded(&fs, &loaded_dir(root, "c"), "c", b"\0asm c", "w").unwrap();

        let store = PluginStore::open_on(Arc::new(fs.clone()), root);
        assert_eq!(fs.contents(&dir.join(CURRENT)).unwrap(), b"\0asm v2");
        let listed = store.list().await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].current, v2.current);
        assert_eq!(store.rollback("p").await.unwrap().version, v1.current);

        fs.power_cut(3, CutMode::SyncedOnly);
        let store = PluginStore::open_on(Arc::new(fs.clone()), root);
        assert_eq!(store.list().await.unwrap()[0].current, v1.current);
        assert_eq!(fs.contents(&dir.join(CURRENT)).unwrap(), b"\0asm v1");
    }
}
