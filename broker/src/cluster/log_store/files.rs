//! The files of a clustered partition beside its segments, in `{partition}/raft/`
//! (docs/cluster.md, "Clustered partitions on disk"):
//!
//! - `entries`: the sidecar of entries that carry no message (blanks, memberships), one record a
//!   entry in index order, each framed as a segment's entries are (`[u32 length][u32
//!   CRC32C][payload]`) around the entry as JSON. Appended and fsynced before the messages of the
//!   same append are queued; cut back by its length; rewritten (temporary file, fsync, rename)
//!   when a purge drops its first records.
//! - `vote`, `purged` (the purge point and the offset after it), and the state machine's
//!   `applied` and `snapshot`: small JSON files replaced atomically.
//!
//! Everything here blocks: callers run it on blocking threads.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::StoreError;
use super::layout::Entry;
use crate::storage::frame::{self, HEADER_LEN, Header};
use crate::storage::vfs::{self, OpenMode, Vfs};

/// The directory of these files inside a partition's directory.
pub const RAFT_DIR: &str = "raft";
/// The sidecar's file name.
pub const ENTRIES: &str = "entries";
/// The vote's file name.
pub const VOTE: &str = "vote";
/// The purge point's file name.
pub const PURGED: &str = "purged";

/// The sidecar file and where each of its records starts.
#[derive(Debug)]
pub(super) struct Sidecar {
    vfs: Arc<dyn Vfs>,
    path: PathBuf,
    /// `(index, position)` of each record, in index order.
    records: Vec<(u64, u64)>,
    /// The file's length: where the next record goes.
    len: u64,
}

impl Sidecar {
    /// Reads the sidecar in `raft_dir` (none yet: empty). A torn last record — the write of an
    /// append that was never acknowledged — is cut; a damaged record that sound ones follow is
    /// an error naming the file (those may have been acknowledged).
    pub(super) fn load(
        vfs: &Arc<dyn Vfs>,
        raft_dir: &Path,
    ) -> Result<(Self, Vec<Entry>), StoreError> {
        let path = raft_dir.join(ENTRIES);
        let raw = vfs::read_whole(&**vfs, &path)?.unwrap_or_default();
        let Parsed {
            entries,
            records,
            end,
        } = parse(&raw).map_err(|reason| StoreError::Corrupt {
            path: path.clone(),
            reason,
        })?;
        let mut sidecar = Self {
            vfs: vfs.clone(),
            path,
            records,
            len: raw.len() as u64,
        };
        if end < sidecar.len {
            tracing::warn!(file = %sidecar.path.display(), bytes = sidecar.len - end, "cutting a torn record after the last complete one (a write that was never acknowledged)");
            sidecar.set_len(end)?;
        }
        Ok((sidecar, entries))
    }

    /// Appends the records of `entries` (after every record there) and syncs them.
    pub(super) fn append(&mut self, entries: &[Entry]) -> Result<(), StoreError> {
        let mut buf = Vec::new();
        let mut records = Vec::with_capacity(entries.len());
        for e in entries {
            records.push((e.log_id.index, self.len + buf.len() as u64));
            frame::encode_into(&serde_json::to_vec(e).expect("entries serialize"), &mut buf);
        }
        let created = !self.vfs.exists(&self.path);
        if created {
            vfs::create_dir_durably(&*self.vfs, self.path.parent().expect("in raft/"))?;
        }
        let mode = if created {
            OpenMode::CreateNew
        } else {
            OpenMode::ReadWrite
        };
        let at = |e| crate::storage::StorageError::io(&self.path, e);
        let file = self.vfs.open(&self.path, mode).map_err(at)?;
        file.write_all_at(&buf, self.len).map_err(at)?;
        file.sync_data().map_err(at)?;
        if created {
            let dir = self.path.parent().expect("in raft/");
            self.vfs
                .sync_dir(dir)
                .map_err(|e| crate::storage::StorageError::io(dir, e))?;
        }
        self.len += buf.len() as u64;
        self.records.extend(records);
        Ok(())
    }

    /// Removes the records of indexes `from` and after, durably (a cut of the file's length).
    pub(super) fn cut_from(&mut self, from: u64) -> Result<(), StoreError> {
        let i = self.records.partition_point(|&(index, _)| index < from);
        let Some(&(_, pos)) = self.records.get(i) else {
            return Ok(());
        };
        self.set_len(pos)?;
        self.records.truncate(i);
        Ok(())
    }

    /// Removes the records of indexes before `from`: the file is rewritten with the rest and
    /// replaces the old one atomically.
    pub(super) fn drop_before(&mut self, from: u64) -> Result<(), StoreError> {
        let i = self.records.partition_point(|&(index, _)| index < from);
        if i == 0 {
            return Ok(());
        }
        let raw = vfs::read_whole(&*self.vfs, &self.path)?.unwrap_or_default();
        let cut = self.records.get(i).map_or(self.len, |&(_, pos)| pos);
        let rest = raw.get(cut as usize..self.len as usize).unwrap_or_default();
        vfs::replace_durably(&*self.vfs, &self.path, rest)?;
        self.records = self.records[i..]
            .iter()
            .map(|&(index, pos)| (index, pos - cut))
            .collect();
        self.len -= cut;
        Ok(())
    }

    fn set_len(&mut self, len: u64) -> Result<(), StoreError> {
        let at = |e| crate::storage::StorageError::io(&self.path, e);
        let file = self.vfs.open(&self.path, OpenMode::ReadWrite).map_err(at)?;
        file.set_len(len).map_err(at)?;
        file.sync_data().map_err(at)?;
        self.len = len;
        Ok(())
    }
}

/// What a sidecar file holds.
#[derive(Debug, Default)]
pub struct Parsed {
    /// The entries, in index order.
    pub entries: Vec<Entry>,
    /// `(index, position)` of each record.
    pub records: Vec<(u64, u64)>,
    /// Where the last complete record ends (a torn one may follow).
    pub end: u64,
}

/// The sidecar's records. `Err` says why the file cannot be trusted.
pub fn parse(raw: &[u8]) -> Result<Parsed, String> {
    let mut entries: Vec<Entry> = Vec::new();
    let mut records = Vec::new();
    let mut pos = 0usize;
    while pos < raw.len() {
        let bad = match frame::decode(&raw[pos..]) {
            Ok(payload) => match serde_json::from_slice::<Entry>(payload) {
                Ok(e) => {
                    if let Some(prev) = entries.last()
                        && prev.log_id.index >= e.log_id.index
                    {
                        return Err(format!(
                            "the record at byte {pos} (index {}) does not follow index {}",
                            e.log_id.index, prev.log_id.index
                        ));
                    }
                    records.push((e.log_id.index, pos as u64));
                    entries.push(e);
                    pos += HEADER_LEN + payload.len();
                    continue;
                }
                Err(e) => format!("the record at byte {pos} is no entry: {e}"),
            },
            Err(fault) => format!("the record at byte {pos}: {fault}"),
        };
        // Torn (the end of the file) or damaged (a sound record follows where its header says it
        // ends)?
        let next = Header::parse(&raw[pos..]).map(|h| pos as u64 + h.frame_len());
        let followed = next
            .filter(|&n| n < raw.len() as u64)
            .is_some_and(|n| frame::decode(&raw[n as usize..]).is_ok_and(|p| !p.is_empty()));
        if followed {
            return Err(format!(
                "{bad}, and sound records follow it; they may have been acknowledged, so nothing is cut"
            ));
        }
        break;
    }
    Ok(Parsed {
        entries,
        records,
        end: pos as u64,
    })
}

/// The JSON value in `path`, if the file exists.
pub(crate) fn read_json<T: DeserializeOwned>(
    vfs: &dyn Vfs,
    path: &Path,
) -> Result<Option<T>, StoreError> {
    let Some(raw) = vfs::read_whole(vfs, path)? else {
        return Ok(None);
    };
    serde_json::from_slice(&raw)
        .map(Some)
        .map_err(|e| StoreError::Corrupt {
            path: path.to_owned(),
            reason: e.to_string(),
        })
}

/// Replaces `path` with `value` as JSON, durably (temporary file, fsync, rename, directory
/// fsync).
pub(crate) fn write_json<T: Serialize>(
    vfs: &dyn Vfs,
    path: &Path,
    value: &T,
) -> Result<(), StoreError> {
    let raw = serde_json::to_vec(value).expect("state serializes");
    vfs::replace_durably(vfs, path, &raw)?;
    Ok(())
}
