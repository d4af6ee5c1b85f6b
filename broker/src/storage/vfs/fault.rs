//! A file system that fails chosen operations, for tests of what the storage does when the disk
//! says no: in-process tests, and a broker started with `--fault-injection`, whose storage runs
//! on one so that a test can make its disk refuse writes (docs/cluster.md, "Testing faults").

use super::*;
use parking_lot::Mutex;
use std::path::PathBuf;

/// The operations a fault can hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `write_all_at`.
    Write,
    /// `sync_data` and `sync_dir`.
    Sync,
    /// `open` (descriptors exhausted: `EMFILE`, `ENFILE`).
    Open,
}

#[derive(Debug)]
struct Fault {
    op: Op,
    path_contains: String,
    errno: i32,
}

/// Wraps a file system ([`OsFs`] unless told otherwise); every armed fault fails the matching
/// operations until [`FaultyFs::clear`]. Made by [`FaultyFs::new`], it also remembers which paths
/// were synced, so that tests can count the fsyncs a behaviour costs.
#[derive(Debug, Clone)]
pub struct FaultyFs {
    inner: Arc<dyn Vfs>,
    faults: Arc<Mutex<Vec<Fault>>>,
    /// `None`: not counted (a broker that runs for long would grow the list without end).
    synced: Option<Arc<Mutex<Vec<PathBuf>>>>,
}

impl Default for FaultyFs {
    fn default() -> Self {
        Self::new()
    }
}

impl FaultyFs {
    /// The real file system with no faults armed, counting syncs.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(OsFs),
            faults: Arc::default(),
            synced: Some(Arc::default()),
        }
    }

    /// `inner` with no faults armed, not counting syncs (a broker's storage under
    /// `--fault-injection`).
    pub fn over(inner: Arc<dyn Vfs>) -> Self {
        Self {
            inner,
            faults: Arc::default(),
            synced: None,
        }
    }

    /// Fails `op` on every path containing `path_contains` with the OS error `errno`
    /// (`libc::EIO`, `libc::ENOSPC`, …).
    pub fn fail(&self, op: Op, path_contains: &str, errno: i32) {
        self.faults.lock().push(Fault {
            op,
            path_contains: path_contains.to_owned(),
            errno,
        });
    }

    /// Disarms every fault: the disk is healthy again.
    pub fn clear(&self) {
        self.faults.lock().clear();
    }

    /// How many successful `sync_data`/`sync_dir` calls hit a path containing `path_contains`.
    /// Always 0 on one made by [`FaultyFs::over`].
    pub fn syncs(&self, path_contains: &str) -> usize {
        self.synced.as_ref().map_or(0, |synced| {
            synced
                .lock()
                .iter()
                .filter(|p| p.to_string_lossy().contains(path_contains))
                .count()
        })
    }

    fn synced(&self, path: &Path) {
        if let Some(synced) = &self.synced {
            synced.lock().push(path.to_owned());
        }
    }

    fn check(&self, op: Op, path: &Path) -> io::Result<()> {
        let faults = self.faults.lock();
        let hit = faults
            .iter()
            .find(|f| f.op == op && path.to_string_lossy().contains(&f.path_contains));
        match hit {
            Some(f) => Err(io::Error::from_raw_os_error(f.errno)),
            None => Ok(()),
        }
    }
}

#[derive(Debug)]
struct FaultyFile {
    fs: FaultyFs,
    path: PathBuf,
    inner: Arc<dyn VfsFile>,
}

impl Vfs for FaultyFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn VfsFile>> {
        self.check(Op::Open, path)?;
        Ok(Arc::new(FaultyFile {
            fs: self.clone(),
            path: path.to_owned(),
            inner: self.inner.open(path, mode)?,
        }))
    }
    fn lock_root(
        &self,
        root: &Path,
    ) -> Result<Option<crate::storage::lock::RootLock>, crate::storage::lock::LockError> {
        self.inner.lock_root(root)
    }
    fn read_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.read_dir(dir)
    }
    fn is_dir(&self, path: &Path) -> bool {
        self.inner.is_dir(path)
    }
    fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path)
    }
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.inner.create_dir_all(dir)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.check(Op::Write, to)?;
        self.inner.rename(from, to)
    }
    fn remove_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.inner.remove_dir_all(dir)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.check(Op::Sync, dir)?;
        self.inner.sync_dir(dir)?;
        self.synced(dir);
        Ok(())
    }
}

impl VfsFile for FaultyFile {
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        self.inner.read_exact_at(buf, pos)
    }
    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        self.fs.check(Op::Write, &self.path)?;
        self.inner.write_all_at(buf, pos)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.fs.check(Op::Sync, &self.path)?;
        self.inner.sync_data()?;
        self.fs.synced(&self.path);
        Ok(())
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
}
