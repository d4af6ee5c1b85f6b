//! The one door all storage file I/O goes through (MMMQ's `FileHandle`).
//!
//! Segments, indexes and checkpoints never touch `std::fs` directly: they hold a [`Vfs`]. The real
//! implementation is [`OsFs`]; tests put a wrapper under the storage layer that fails a write or an
//! fsync on demand (`fault::FaultyFs`, also under a broker started with `--fault-injection`), or a
//! simulated disk that forgets unsynced bytes at a power cut (`sim::SimFs`, with the
//! `test-support` feature).
//! All methods block: callers run them on blocking threads, never on the async executor.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use super::error::{IoContext, StorageError};
use super::lock::{LockError, RootLock};

/// How to open a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// An existing file, for reading only (`mmmq inspect` must never change what it inspects).
    ReadOnly,
    /// An existing file, for reading and writing.
    ReadWrite,
    /// A new file; fails if it exists, so a segment is never silently overwritten.
    CreateNew,
    /// A file created or truncated to zero (temporary files of atomic replacements).
    CreateTruncate,
}

/// A file system as the storage layer needs it.
pub trait Vfs: Send + Sync + fmt::Debug + 'static {
    /// Opens `path`.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn VfsFile>>;
    /// Takes the one-process lock on a root dir ([`RootLock`]). `None` where there is no other
    /// process to keep out: a simulated disk lives in one test's memory.
    fn lock_root(&self, _root: &Path) -> Result<Option<RootLock>, LockError> {
        Ok(None)
    }
    /// Names of the entries in `dir` (files and directories), in no particular order.
    fn read_dir(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Whether `path` names a directory.
    fn is_dir(&self, path: &Path) -> bool;
    /// Whether `path` exists.
    fn exists(&self, path: &Path) -> bool;
    /// Creates `dir` and its missing parents.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Removes the file `path`.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Renames `from` to `to`, atomically replacing `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes the directory `dir` and everything in it (a deleted topic, once it has been
    /// renamed out of the way).
    fn remove_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Makes the directory's entries (created, renamed, removed files) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// An open file with positional I/O, so that readers and the appender never share a cursor.
#[allow(clippy::len_without_is_empty)] // a file is not a collection
pub trait VfsFile: Send + Sync + fmt::Debug {
    /// Reads exactly `buf.len()` bytes at `pos`.
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()>;
    /// Writes all of `buf` at `pos`.
    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()>;
    /// Makes the file's data (and its length) durable: `fdatasync`.
    fn sync_data(&self) -> io::Result<()>;
    /// The file's current length.
    fn len(&self) -> io::Result<u64>;
    /// Truncates or extends the file.
    fn set_len(&self, len: u64) -> io::Result<()>;
}

/// The real file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct OsFs;

#[derive(Debug)]
struct OsFile(File);

impl Vfs for OsFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn VfsFile>> {
        let mut o = OpenOptions::new();
        match mode {
            OpenMode::ReadOnly => o.read(true),
            OpenMode::ReadWrite => o.read(true).write(true),
            OpenMode::CreateNew => o.read(true).write(true).create_new(true),
            OpenMode::CreateTruncate => o.read(true).write(true).create(true).truncate(true),
        };
        Ok(Arc::new(OsFile(o.open(path)?)))
    }

    fn lock_root(&self, root: &Path) -> Result<Option<RootLock>, LockError> {
        RootLock::acquire(root).map(Some)
    }

    fn read_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        fs::read_dir(dir)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect()
    }

    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::remove_dir_all(dir)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

impl VfsFile for OsFile {
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        self.0.read_exact_at(buf, pos)
    }
    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        self.0.write_all_at(buf, pos)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
}

/// Creates `dir` and any missing parents, and makes each new name durable by syncing the directory
/// that holds it, top down: a power cut after this returns never loses the directory. (A
/// `create_dir_all` alone leaves the new names in the page cache.)
pub fn create_dir_durably(vfs: &dyn Vfs, dir: &Path) -> Result<(), StorageError> {
    if vfs.is_dir(dir) {
        return Ok(());
    }
    let missing: Vec<&Path> = dir
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && !vfs.is_dir(a))
        .collect();
    vfs.create_dir_all(dir).at(dir)?;
    for created in missing.iter().rev() {
        if let Some(parent) = created.parent().filter(|p| !p.as_os_str().is_empty()) {
            vfs.sync_dir(parent).at(parent)?;
        }
    }
    Ok(())
}

/// Durably replaces the whole contents of `path` with `bytes`: a temporary file next to it is
/// written and fsynced, renamed over it, and the directory synced. A crash leaves the old contents
/// or the new ones, never a mix (checkpoints, `topic.json`).
pub fn replace_durably(vfs: &dyn Vfs, path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    create_dir_durably(vfs, dir)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let file = vfs.open(&tmp, OpenMode::CreateTruncate).at(&tmp)?;
    file.write_all_at(bytes, 0).at(&tmp)?;
    file.sync_data().at(&tmp)?;
    drop(file);
    vfs.rename(&tmp, path).at(path)?;
    vfs.sync_dir(dir).at(dir)
}

/// Appends `lines` (each ending in `\n`) to `path`, creating it, and syncs them. A last line a
/// crash left torn (without its `\n`) is cut first, so a new line never joins it. Blocking (one
/// fsync; two when the file is new).
pub fn append_lines_durably(vfs: &dyn Vfs, path: &Path, lines: &[u8]) -> Result<(), StorageError> {
    debug_assert!(lines.ends_with(b"\n"));
    let dir = path.parent().unwrap_or(Path::new("."));
    let created = !vfs.exists(path);
    if created {
        create_dir_durably(vfs, dir)?;
    }
    let mode = if created {
        OpenMode::CreateNew
    } else {
        OpenMode::ReadWrite
    };
    let file = vfs.open(path, mode).at(path)?;
    let mut len = file.len().at(path)?;
    if len > 0 {
        let mut whole = vec![0u8; len as usize];
        file.read_exact_at(&mut whole, 0).at(path)?;
        if whole.last() != Some(&b'\n') {
            len = whole
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |i| i as u64 + 1);
            file.set_len(len).at(path)?;
        }
    }
    file.write_all_at(lines, len).at(path)?;
    file.sync_data().at(path)?;
    if created {
        vfs.sync_dir(dir).at(dir)?;
    }
    Ok(())
}

/// The whole contents of `path`, or `None` if it does not exist.
pub fn read_whole(vfs: &dyn Vfs, path: &Path) -> Result<Option<Vec<u8>>, StorageError> {
    if !vfs.exists(path) {
        return Ok(None);
    }
    let file = vfs.open(path, OpenMode::ReadOnly).at(path)?;
    let mut raw = vec![0u8; file.len().at(path)? as usize];
    file.read_exact_at(&mut raw, 0).at(path)?;
    Ok(Some(raw))
}

/// A file system that fails chosen operations, for tests of what the storage does when the disk
/// says no (always built: `serve --fault-injection` runs a broker's storage on it).
pub mod fault;

// A simulated disk that forgets what was never synced, for power-loss tests (its own docs say
// more; an outer doc here would make rustdoc resolve their links from this module).
#[cfg(any(test, feature = "test-support"))]
pub mod sim;
