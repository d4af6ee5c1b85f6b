//! Per-consumer checkpoints: `checkpoints/{consumerId}.checkpoint`, one big-endian u64, the next
//! offset that consumer will be given.
//!
//! An update is atomic: the new value goes to a temporary file that is fsynced, renamed over the
//! old one, and the directory is fsynced. A crash leaves the old value or the new one, never a torn
//! mix (an 8-byte in-place write would usually be atomic too, but "usually" is not a promise).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mmmq_core::ConsumerId;
use parking_lot::RwLock;

use super::error::{IoContext, StorageError};
use super::vfs::{OpenMode, Vfs, replace_durably};

/// File extension of a checkpoint.
pub const CHECKPOINT_EXT: &str = "checkpoint";

/// A dispatcher's position in one log: the next offset to deliver (everything below it is done)
/// and, when messages are delivered in parallel lanes, the ranges above it that are done too.
///
/// On disk (docs/storage.md, "Storage"): the first 8 bytes are always `next`, a big-endian u64 (MMMQ's
/// checkpoint); each done range follows as two big-endian u64s, start and end (exclusive).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Position {
    /// The low watermark: the first offset not yet done.
    pub next: u64,
    /// Ranges `[start, end)` above `next` that are done, in order, not touching each other.
    pub done: Vec<(u64, u64)>,
}

impl Position {
    /// A position with nothing done above `next`.
    pub fn at(next: u64) -> Self {
        Self {
            next,
            done: Vec::new(),
        }
    }

    /// Whether `offset` is done.
    pub fn is_done(&self, offset: u64) -> bool {
        offset < self.next || self.done.iter().any(|&(s, e)| (s..e).contains(&offset))
    }

    fn encode(&self) -> Vec<u8> {
        let mut raw = Vec::with_capacity(8 + 16 * self.done.len());
        raw.extend_from_slice(&self.next.to_be_bytes());
        for &(s, e) in &self.done {
            raw.extend_from_slice(&s.to_be_bytes());
            raw.extend_from_slice(&e.to_be_bytes());
        }
        raw
    }
}

/// The checkpoint directory of one log.
#[derive(Debug, Clone)]
pub struct Checkpoints {
    dir: PathBuf,
    vfs: Arc<dyn Vfs>,
    /// `false` once the log's topic is deleted ([`Checkpoints::retire`]). Every write holds it
    /// shared and checks it, so a write racing the delete (a group commit, a dispatcher's last
    /// save) either lands before the directory goes or is refused: it never creates the deleted
    /// directory again, which the next boot would open as the topic come back.
    live: Arc<RwLock<bool>>,
}

impl Checkpoints {
    /// The checkpoints in `dir` (created on the first write).
    pub fn new(dir: impl Into<PathBuf>, vfs: Arc<dyn Vfs>) -> Self {
        Self {
            dir: dir.into(),
            vfs,
            live: Arc::new(RwLock::new(true)),
        }
    }

    /// The checkpoints in the subdirectory `sub` (a consumer group's, say), on the same disk,
    /// retired with these.
    pub fn nested(&self, sub: &str) -> Self {
        Self {
            dir: self.dir.join(sub),
            vfs: self.vfs.clone(),
            live: self.live.clone(),
        }
    }

    /// Refuses every later write ([`StorageError::Retired`]), once the writes in progress are
    /// done: the topic is being deleted. Blocking (it waits for those writes).
    pub fn retire(&self) {
        *self.live.write() = false;
    }

    /// Runs a write unless retired, holding off [`Checkpoints::retire`] until it is done.
    fn writing<T>(
        &self,
        write: impl FnOnce() -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        let live = self.live.read();
        if !*live {
            return Err(StorageError::Retired {
                dir: self.dir.clone(),
            });
        }
        write()
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, id: &ConsumerId) -> PathBuf {
        self.dir.join(format!("{id}.{CHECKPOINT_EXT}"))
    }

    /// The stored next offset of `id` (its low watermark), or `None` if it never committed
    /// one. Blocking.
    pub fn read(&self, id: &ConsumerId) -> Result<Option<u64>, StorageError> {
        Ok(self.read_position(id)?.map(|p| p.next))
    }

    /// The stored position of `id`, or `None` if it never committed one. Blocking.
    pub fn read_position(&self, id: &ConsumerId) -> Result<Option<Position>, StorageError> {
        let path = self.path(id);
        if !self.vfs.exists(&path) {
            return Ok(None);
        }
        read_value(&*self.vfs, &path).map(Some)
    }

    /// Durably replaces the position of `id`. Blocking (two fsyncs).
    pub fn write_position(&self, id: &ConsumerId, position: &Position) -> Result<(), StorageError> {
        self.writing(|| replace_durably(&*self.vfs, &self.path(id), &position.encode()))
    }

    /// Durably replaces the next offset of `id`. Blocking (two fsyncs).
    pub fn write(&self, id: &ConsumerId, next_offset: u64) -> Result<(), StorageError> {
        self.writing(|| replace_durably(&*self.vfs, &self.path(id), &next_offset.to_be_bytes()))
    }

    /// A file kept next to `id`'s checkpoint, `{id}.{ext}` (a dispatcher's state beside its
    /// position, such as the bounds of its plugin's emits), or `None` if there is none. Blocking.
    pub fn read_beside(&self, id: &ConsumerId, ext: &str) -> Result<Option<Vec<u8>>, StorageError> {
        super::vfs::read_whole(&*self.vfs, &self.dir.join(format!("{id}.{ext}")))
    }

    /// Durably replaces the file `{id}.{ext}` beside `id`'s checkpoint. Blocking (two fsyncs).
    pub fn write_beside(
        &self,
        id: &ConsumerId,
        ext: &str,
        bytes: &[u8],
    ) -> Result<(), StorageError> {
        self.writing(|| replace_durably(&*self.vfs, &self.dir.join(format!("{id}.{ext}")), bytes))
    }

    /// Appends `lines` (each ending in `\n`) to the file `{id}.{ext}` beside `id`'s checkpoint,
    /// durably. Blocking (one fsync).
    pub fn append_beside(
        &self,
        id: &ConsumerId,
        ext: &str,
        lines: &[u8],
    ) -> Result<(), StorageError> {
        self.writing(|| {
            super::vfs::append_lines_durably(
                &*self.vfs,
                &self.dir.join(format!("{id}.{ext}")),
                lines,
            )
        })
    }

    /// The consumer ids with a stored checkpoint, none of the files read (a listing of names,
    /// such as Kafka's ListGroups). Blocking.
    pub fn names(&self) -> Result<Vec<String>, StorageError> {
        if !self.vfs.is_dir(&self.dir) {
            return Ok(Vec::new());
        }
        let suffix = format!(".{CHECKPOINT_EXT}");
        Ok(self
            .vfs
            .read_dir(&self.dir)
            .at(&self.dir)?
            .into_iter()
            .filter_map(|name| name.strip_suffix(&suffix).map(str::to_owned))
            .collect())
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
                    read_value(&*self.vfs, &self.dir.join(&name))?.next,
                ));
            }
        }
        out.sort();
        Ok(out)
    }
}

fn read_value(vfs: &dyn Vfs, path: &Path) -> Result<Position, StorageError> {
    let file = vfs.open(path, OpenMode::ReadOnly).at(path)?;
    let len = file.len().at(path)?;
    if len < 8 || (len - 8) % 16 != 0 || len > 8 + 16 * MAX_DONE_RANGES {
        return Err(StorageError::Inconsistent {
            path: path.to_owned(),
            reason: format!(
                "a checkpoint is 8 bytes, then 16 per done range (at most {MAX_DONE_RANGES}); this file has {len}"
            ),
        });
    }
    let mut raw = vec![0u8; len as usize];
    file.read_exact_at(&mut raw, 0).at(path)?;
    let word = |i: usize| u64::from_be_bytes(raw[i..i + 8].try_into().expect("8 bytes"));
    let done = (8..raw.len())
        .step_by(16)
        .map(|i| (word(i), word(i + 8)))
        .collect();
    Ok(Position {
        next: word(0),
        done,
    })
}

/// Most done ranges a checkpoint holds (a lane stuck behind many others is bounded by the
/// dispatcher's window long before this).
pub const MAX_DONE_RANGES: u64 = 1 << 20;
