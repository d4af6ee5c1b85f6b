//! Per-consumer checkpoints: `checkpoints/{consumerId}.checkpoint`, one big-endian u64, the next
//! offset that consumer will be given.
//!
//! An update is atomic: the new value goes to a temporary file that is fsynced, renamed over the
//! old one, and the directory is fsynced. A crash leaves the old value or the new one, never a torn
//! mix (an 8-byte in-place write would usually be atomic too, but "usually" is not a promise).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mmmq_core::ConsumerId;

use super::error::{IoContext, StorageError};
use super::vfs::{OpenMode, Vfs, replace_durably};

/// File extension of a checkpoint.
pub const CHECKPOINT_EXT: &str = "checkpoint";

/// The checkpoint directory of one log.
#[derive(Debug, Clone)]
pub struct Checkpoints {
    dir: PathBuf,
    vfs: Arc<dyn Vfs>,
}

impl Checkpoints {
    /// The checkpoints in `dir` (created on the first write).
    pub fn new(dir: impl Into<PathBuf>, vfs: Arc<dyn Vfs>) -> Self {
        Self {
            dir: dir.into(),
            vfs,
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, id: &ConsumerId) -> PathBuf {
        self.dir.join(format!("{id}.{CHECKPOINT_EXT}"))
    }

    /// The stored next offset of `id`, or `None` if it never committed one. Blocking.
    pub fn read(&self, id: &ConsumerId) -> Result<Option<u64>, StorageError> {
        let path = self.path(id);
        if !self.vfs.exists(&path) {
            return Ok(None);
        }
        read_value(&*self.vfs, &path).map(Some)
    }

    /// Durably replaces the next offset of `id`. Blocking (two fsyncs).
    pub fn write(&self, id: &ConsumerId, next_offset: u64) -> Result<(), StorageError> {
        replace_durably(&*self.vfs, &self.path(id), &next_offset.to_be_bytes())
    }

    /// Every stored checkpoint, by consumer id (for status and `mmmq inspect`). Blocking.
    pub fn list(&self) -> Result<Vec<(String, u64)>, StorageError> {
        if !self.vfs.is_dir(&self.dir) {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for name in self.vfs.read_dir(&self.dir).at(&self.dir)? {
            if let Some(id) = name.strip_suffix(&format!(".{CHECKPOINT_EXT}")) {
                out.push((
                    id.to_owned(),
                    read_value(&*self.vfs, &self.dir.join(&name))?,
                ));
            }
        }
        out.sort();
        Ok(out)
    }
}

fn read_value(vfs: &dyn Vfs, path: &Path) -> Result<u64, StorageError> {
    let file = vfs.open(path, OpenMode::ReadOnly).at(path)?;
    let len = file.len().at(path)?;
    if len != 8 {
        return Err(StorageError::Inconsistent {
            path: path.to_owned(),
            reason: format!("a checkpoint is 8 bytes, this file has {len}"),
        });
    }
    let mut raw = [0u8; 8];
    file.read_exact_at(&mut raw, 0).at(path)?;
    Ok(u64::from_be_bytes(raw))
}
