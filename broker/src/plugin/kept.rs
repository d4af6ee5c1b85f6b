//! A directory of kept versions of a component, content-addressed, with an index: what a deployed
//! plugin keeps in `{root-dir}/plugins/{name}/` ([`super::store`]) and what a `plugin.path`
//! dispatcher keeps of every version it loaded in `{root-dir}/plugins/.path/{consumerId}/`
//! ([`keep_loaded`]), so that `mmmq plugin replay` (docs/plugins.md, "Replay") runs the exact version that
//! handled a message whichever kind of plugin the dispatcher names.
//!
//! ```text
//! {dir}/{version}.wasm   each kept version (version: 16 hex digits of SHA-256)
//! {dir}/versions.json    {"name", "current", "versions": [{"version","bytes","deployedAt","world"}…]}
//! ```
//!
//! A version's file is written aside, synced and renamed, and its directory (and every directory
//! made on the way) synced, before the index names it; the index is written the same way. The
//! last [`KEPT_VERSIONS`] are kept (the current one always); an older one's file is removed once
//! the index no longer names it.

use std::path::{Path, PathBuf};

use mmmq_core::{VersionInfo, now_ms};
use serde::{Deserialize, Serialize};

use super::runtime::version_of;
use crate::storage::Vfs;
use crate::storage::vfs::{read_whole, replace_durably};

/// At least this many versions are kept per plugin, or per `plugin.path` dispatcher (the current
/// one always).
pub const KEPT_VERSIONS: usize = 10;

/// The index of a directory of kept versions.
pub(super) const INDEX: &str = "versions.json";

/// The directory, under `{root-dir}/plugins/`, of the versions `plugin.path` dispatchers loaded.
/// A plugin name never starts with `.`, so it is never a deployed plugin's.
const LOADED: &str = ".path";

/// Why a version could not be kept or read back.
#[derive(Debug, thiserror::Error)]
pub enum KeptError {
    /// The disk refused.
    #[error("{0}")]
    Io(#[from] crate::storage::StorageError),
    /// A file the index names is not there.
    #[error("{} is missing", .0.display())]
    Missing(PathBuf),
    /// The index is not one.
    #[error("{path}: {reason}")]
    BadIndex {
        /// The index file.
        path: PathBuf,
        /// Why it does not parse.
        reason: String,
    },
}

/// A plugin (or a `plugin.path` dispatcher's loaded components): its current version and the kept
/// ones, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PluginVersions {
    /// The plugin's name (the dispatcher's consumerId for loaded components).
    #[serde(default)]
    pub name: String,
    /// The version dispatchers naming it run (the one last loaded).
    pub current: String,
    /// Kept versions, the last deployed (or loaded) last.
    pub versions: Vec<VersionInfo>,
}

/// Where the `plugin.path` dispatcher `consumer_id` keeps the versions it loaded.
pub fn loaded_dir(root_dir: &Path, consumer_id: &str) -> PathBuf {
    root_dir.join("plugins").join(LOADED).join(consumer_id)
}

/// The file of `version` in `dir`.
pub fn version_file(dir: &Path, version: &str) -> PathBuf {
    dir.join(format!("{version}.wasm"))
}

/// The versions whose files are in `dir`, sorted (for an error that says what is kept). Blocking.
pub fn kept_files(vfs: &dyn Vfs, dir: &Path) -> Vec<String> {
    let mut kept: Vec<String> = vfs
        .read_dir(dir)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|name| {
            let version = name.strip_suffix(".wasm")?;
            is_version(version).then(|| version.to_owned())
        })
        .collect();
    kept.sort();
    kept
}

/// Whether `s` is a version: 16 lower-case hex digits.
pub fn is_version(s: &str) -> bool {
    s.len() == 16 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Keeps `bytes`, a component of `world` that the `plugin.path` dispatcher whose directory is
/// `dir` ([`loaded_dir`]) is about to run, unless it is already the last one kept: durable when
/// this returns, so that every version that handles a message can be replayed. Blocking.
pub fn keep_loaded(
    vfs: &dyn Vfs,
    dir: &Path,
    consumer_id: &str,
    bytes: &[u8],
    world: &str,
) -> Result<String, KeptError> {
    let version = version_of(bytes);
    let index = read_index(vfs, dir)?;
    if index.as_ref().is_some_and(|i| i.current == version)
        && vfs.exists(&version_file(dir, &version))
    {
        return Ok(version);
    }
    keep(vfs, dir, index, consumer_id, bytes, world)?;
    Ok(version)
}

/// Stores `bytes` durably as the newest version in `dir`, makes it the index's current one, writes
/// the index and removes the files of the versions that fall out of the last
/// [`KEPT_VERSIONS`]. `index` is `dir`'s, as read; `name` names a new one. Storing a kept
/// version again makes it the newest. The new index. Blocking.
pub(super) fn keep(
    vfs: &dyn Vfs,
    dir: &Path,
    index: Option<PluginVersions>,
    name: &str,
    bytes: &[u8],
    world: &str,
) -> Result<PluginVersions, KeptError> {
    let mut index = index.unwrap_or_else(|| PluginVersions {
        name: name.to_owned(),
        current: String::new(),
        versions: Vec::new(),
    });
    let version = version_of(bytes);
    write_durably(vfs, &version_file(dir, &version), bytes)?;
    index.versions.retain(|v| v.version != version);
    index.versions.push(VersionInfo {
        version: version.clone(),
        bytes: bytes.len() as u64,
        deployed_at: now_ms(),
        world: world.to_owned(),
    });
    index.current = version;
    let dropped = prune(&mut index);
    write_index(vfs, dir, &index)?;
    for old in dropped {
        // A file left by a failed removal is only unindexed bytes: nothing runs it.
        let _ = vfs.remove_file(&version_file(dir, &old));
    }
    Ok(index)
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

/// `dir`'s index, or `None` if it has none. Blocking.
pub(super) fn read_index(vfs: &dyn Vfs, dir: &Path) -> Result<Option<PluginVersions>, KeptError> {
    let path = dir.join(INDEX);
    match read_whole(vfs, &path)? {
        Some(raw) => serde_json::from_slice(&raw)
            .map(Some)
            .map_err(|e| KeptError::BadIndex {
                path,
                reason: e.to_string(),
            }),
        None => Ok(None),
    }
}

/// Writes `dir`'s index durably. Blocking.
pub(super) fn write_index(
    vfs: &dyn Vfs,
    dir: &Path,
    index: &PluginVersions,
) -> Result<(), KeptError> {
    let raw = serde_json::to_vec_pretty(index).expect("an index encodes");
    write_durably(vfs, &dir.join(INDEX), &raw)
}

/// Writes aside, syncs, renames over, syncs the directory; the directory, and each one made on
/// the way to it, is created durably first (a new plugin's directory, `{root-dir}/plugins`
/// itself). Blocking.
pub(super) fn write_durably(vfs: &dyn Vfs, path: &Path, bytes: &[u8]) -> Result<(), KeptError> {
    Ok(replace_durably(vfs, path, bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::vfs::sim::{CutMode, SimFs};

    fn component(n: u8) -> Vec<u8> {
        // Not a component: keeping does not compile, it stores what the caller compiled.
        vec![b'\0', b'a', b's', b'm', n]
    }

    /// Whether `path` can be reached from `root`: each directory on the way is listed in its
    /// parent (the simulated disk finds a file by its full path even when a directory above it
    /// was lost, as a real one would not).
    fn reachable(fs: &SimFs, root: &Path, path: &Path) -> bool {
        path.ancestors().take_while(|a| *a != root).all(|a| {
            let (parent, name) = (a.parent().unwrap(), a.file_name().unwrap());
            fs.read_dir(parent)
                .unwrap_or_default()
                .iter()
                .any(|n| **n == *name)
        })
    }

    /// Every directory on the way is made durably: a power cut right after a first keep (the
    /// root dir the only thing on disk before) loses nothing.
    #[test]
    fn a_first_keep_survives_a_power_cut_directories_included() {
        let fs = SimFs::new();
        let root = Path::new("/root");
        fs.mkdir_durable(root);
        let dir = loaded_dir(root, "c");
        let version = keep_loaded(&fs, &dir, "c", &component(1), "w").unwrap();
        fs.power_cut(7, CutMode::SyncedOnly);
        let file = version_file(&dir, &version);
        assert!(reachable(&fs, root, &file), "{} was lost", file.display());
        assert!(reachable(&fs, root, &dir.join(INDEX)));
        assert_eq!(read_whole(&fs, &file).unwrap(), Some(component(1)));
        let index = read_index(&fs, &dir).unwrap().expect("the index survives");
        assert_eq!(index.current, version);
        assert_eq!(index.name, "c");
        // The same for a deployed plugin's directory, beside the first.
        let named = root.join("plugins").join("p");
        let index = keep(&fs, &named, None, "p", &component(2), "w").unwrap();
        fs.power_cut(8, CutMode::SyncedOnly);
        assert!(reachable(&fs, root, &version_file(&named, &index.current)));
        assert_eq!(read_index(&fs, &named).unwrap().unwrap(), index);
    }

    #[test]
    fn the_last_ten_loaded_are_kept_and_loading_the_current_again_writes_nothing() {
        let fs = SimFs::new();
        let root = Path::new("/root");
        fs.mkdir_durable(root);
        let dir = loaded_dir(root, "c");
        let versions: Vec<String> = (0..12)
            .map(|n| keep_loaded(&fs, &dir, "c", &component(n), "w").unwrap())
            .collect();
        let index = read_index(&fs, &dir).unwrap().unwrap();
        let kept: Vec<&str> = index.versions.iter().map(|v| v.version.as_str()).collect();
        assert_eq!(
            kept,
            versions[2..].iter().map(String::as_str).collect::<Vec<_>>()
        );
        let mut files = versions[2..].to_vec();
        files.sort();
        assert_eq!(kept_files(&fs, &dir), files);
        // A restart loads the current file again: nothing to write.
        let ops = fs.ops_done();
        keep_loaded(&fs, &dir, "c", &component(11), "w").unwrap();
        assert_eq!(fs.ops_done(), ops);
        // An older kept one loaded again becomes the newest, so it outlives the others.
        keep_loaded(&fs, &dir, "c", &component(2), "w").unwrap();
        let index = read_index(&fs, &dir).unwrap().unwrap();
        assert_eq!(index.current, versions[2]);
        assert_eq!(index.versions.last().unwrap().version, versions[2]);
        assert_eq!(index.versions.len(), KEPT_VERSIONS);
    }
}
