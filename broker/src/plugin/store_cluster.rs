//! The plugin store of a cluster member (docs/cluster.md, "Configuration in a cluster"): a
//! deploy keeps the component's bytes here without making them current, the metadata decides
//! what is current, and each broker adopts the metadata's versions into its own store: the
//! bytes of a version it lacks are fetched from another broker first.

use mmmq_core::VersionInfo;

use super::{
    CURRENT, PluginStore, PluginVersions, StoreError, blocking, kept, read_index, read_version,
    version_file, write_durably,
};
use crate::plugin::kept::KeptError;
use crate::plugin::runtime::version_of;
use crate::storage::vfs::read_whole;

/// What a broker adopts of one plugin: its current version and the kept ones, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adopted {
    /// The current version.
    pub current: String,
    /// The kept versions.
    pub versions: Vec<VersionInfo>,
}

impl PluginStore {
    /// Validates `bytes` as a deploy of `name` would and keeps them durably as one of its
    /// versions' files, neither indexed nor current (the metadata decides that); answers the
    /// version and its world. A file no index names is only bytes: nothing runs it.
    pub async fn keep_unindexed(
        &self,
        name: &str,
        bytes: Vec<u8>,
    ) -> Result<(VersionInfo, Vec<u8>), StoreError> {
        let (bytes, world) = Self::compile(name, bytes).await?;
        let version = VersionInfo {
            version: version_of(&bytes),
            bytes: bytes.len() as u64,
            deployed_at: mmmq_core::now_ms(),
            world,
        };
        self.keep_bytes(name, &version.version, bytes.clone())
            .await?;
        Ok((version, bytes))
    }

    /// Keeps the bytes of `version` of `name` (fetched from another broker) as that version's
    /// file; refused unless they are that version's (their SHA-256 names it).
    pub async fn keep_bytes(
        &self,
        name: &str,
        version: &str,
        bytes: Vec<u8>,
    ) -> Result<(), StoreError> {
        Self::check_name(name)?;
        if !kept::is_version(version) || version_of(&bytes) != version {
            return Err(StoreError::NoSuchVersion {
                name: name.to_owned(),
                version: version.to_owned(),
                kept: "(the bytes are not that version's)".into(),
            });
        }
        let path = version_file(&self.dir.join(name), version);
        let vfs = self.vfs.clone();
        blocking(move || Ok(write_durably(&*vfs, &path, &bytes)?)).await
    }

    /// Whether this broker keeps the bytes of `version` of `name` (an unindexed file too).
    pub async fn holds(&self, name: &str, version: &str) -> bool {
        if Self::check_name(name).is_err() || !kept::is_version(version) {
            return false;
        }
        let path = version_file(&self.dir.join(name), version);
        let vfs = self.vfs.clone();
        tokio::task::spawn_blocking(move || vfs.exists(&path))
            .await
            .expect("plugin store task panicked")
    }

    /// The bytes of `version` of `name` if this broker keeps them (an unindexed file too).
    pub async fn version_bytes(
        &self,
        name: &str,
        version: &str,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        Self::check_name(name)?;
        if !kept::is_version(version) {
            return Ok(None);
        }
        let path = version_file(&self.dir.join(name), version);
        let vfs = self.vfs.clone();
        blocking(move || Ok(read_whole(&*vfs, &path).map_err(KeptError::from)?)).await
    }

    /// Makes this store say what the metadata says of `name`: `adopted.current` current (its
    /// file must be here), the kept versions whose files are here listed, and the files of
    /// versions the metadata dropped removed. Answers whether the current version changed (the
    /// dispatchers naming the plugin switch then).
    pub async fn adopt(&self, name: &str, adopted: Adopted) -> Result<bool, StoreError> {
        self.change(name, move |vfs, dir, name| {
            let old = read_index(vfs, dir)?;
            let file = version_file(dir, &adopted.current);
            if !vfs.exists(&file) {
                return Err(KeptError::Missing(file).into());
            }
            let index = PluginVersions {
                name,
                current: adopted.current.clone(),
                versions: adopted
                    .versions
                    .iter()
                    .filter(|v| vfs.exists(&version_file(dir, &v.version)))
                    .cloned()
                    .collect(),
            };
            let running = read_whole(vfs, &dir.join(CURRENT)).ok().flatten();
            let runs_current =
                running.as_deref().map(version_of).as_deref() == Some(&*index.current);
            let same_index = old
                .as_ref()
                .is_some_and(|o| o.current == index.current && o.versions == index.versions);
            if same_index && runs_current {
                return Ok(false);
            }
            // The index first (it decides; `current.wasm` is repaired from it at open), then
            // the copy the dispatchers run.
            kept::write_index(vfs, dir, &index)?;
            if !runs_current {
                let bytes = read_version(vfs, dir, &index.current)?;
                write_durably(vfs, &dir.join(CURRENT), &bytes)?;
            }
            for gone in old.iter().flat_map(|o| &o.versions) {
                if !adopted.versions.iter().any(|v| v.version == gone.version) {
                    // A file left by a failed removal is only unindexed bytes.
                    let _ = vfs.remove_file(&version_file(dir, &gone.version));
                }
            }
            Ok(!runs_current || old.is_none_or(|o| o.current != index.current))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use super::*;
    use crate::storage::Vfs;
    use crate::storage::vfs::sim::{CutMode, SimFs};

    fn info(bytes: &[u8]) -> VersionInfo {
        VersionInfo {
            version: version_of(bytes),
            bytes: bytes.len() as u64,
            deployed_at: 1,
            world: "w".into(),
        }
    }

    /// Adopting needs the current version's bytes, lists only the versions kept here, switches
    /// `current.wasm` durably, and drops the files of versions the metadata dropped.
    #[tokio::test]
    async fn adopting_switches_durably_and_lists_what_is_here() {
        let fs = SimFs::new();
        let root = Path::new("/root");
        fs.mkdir_durable(root);
        let store = PluginStore::open_on(Arc::new(fs.clone()), root);
        let (v1, v2, v3) = (
            b"\0asm 1".as_slice(),
            b"\0asm 2".as_slice(),
            b"\0asm 3".as_slice(),
        );
        let all = Adopted {
            current: info(v2).version,
            versions: vec![info(v1), info(v2)],
        };
        assert!(matches!(
            store.adopt("p", all.clone()).await,
            Err(StoreError::Io(KeptError::Missing(_)))
        ));
        store
            .keep_bytes("p", &info(v2).version, v2.to_vec())
            .await
            .unwrap();
        assert!(store.adopt("p", all.clone()).await.unwrap());
        assert!(!store.adopt("p", all).await.unwrap(), "nothing changed");
        fs.power_cut(5, CutMode::SyncedOnly);
        let store = PluginStore::open_on(Arc::new(fs.clone()), root);
        let listed = store.list().await.unwrap();
        assert_eq!(listed[0].current, info(v2).version);
        assert_eq!(listed[0].versions, vec![info(v2)], "v1 is not kept here");
        let dir = root.join("plugins").join("p");
        assert_eq!(fs.contents(&dir.join(CURRENT)).unwrap(), v2);

        store
            .keep_bytes("p", &info(v3).version, v3.to_vec())
            .await
            .unwrap();
        let next = Adopted {
            current: info(v3).version,
            versions: vec![info(v3)],
        };
        assert!(store.adopt("p", next).await.unwrap());
        assert_eq!(fs.contents(&dir.join(CURRENT)).unwrap(), v3);
        assert!(!fs.exists(&version_file(&dir, &info(v2).version)));
        assert_eq!(
            store.version_bytes("p", &info(v3).version).await.unwrap(),
            Some(v3.to_vec())
        );
        assert_eq!(store.version_bytes("p", "../x").await.unwrap(), None);
    }
}
