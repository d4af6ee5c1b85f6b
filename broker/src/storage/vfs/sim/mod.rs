//! A simulated disk for power-loss tests.
//!
//! A SIGKILL leaves the page cache intact, so a crash test with real files never notices a missing
//! fsync. [`SimFs`] keeps every file twice: what a reader sees now, and what would survive a power
//! cut now. A write or a truncation changes only the first; `sync_data` copies it to the second.
//! Names work the same way per directory: creating, removing and renaming a file change only the
//! current namespace until the parent directory is synced.
//!
//! [`SimFs::power_cut`] is the cut: each file keeps its durable content plus a seeded choice of its
//! unsynced changes, and each directory its durable entries plus a prefix of its unsynced changes.
//! [`SimFs::die_after`] makes the machine stop part-way through what the storage is doing: after
//! that many more mutating operations every call fails, as on a machine whose power is gone.
//!
//! Handles opened before a cut fail with `EIO` afterwards: they belong to the process that died.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{OpenMode, Vfs, VfsFile};

/// What a power cut keeps of the bytes that were written but not synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutMode {
    /// Nothing unsynced survives.
    SyncedOnly,
    /// Per file, the unsynced writes in the order they were made, up to a random point, the last
    /// one cut at a random byte (a disk that writes in order).
    Prefix,
    /// Per file, each 512-byte sector of each unsynced write survives or not at random (a disk that
    /// reorders). The file's length is what the surviving sectors and truncations make it.
    TornSectors,
}

const SECTOR: u64 = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    Dir,
    File(u64),
}

#[derive(Debug, Clone)]
enum FileOp {
    Write { pos: u64, bytes: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Clone)]
enum DirOp {
    Link(PathBuf, Node),
    Unlink(PathBuf),
    Rename(PathBuf, PathBuf),
}

#[derive(Debug, Default)]
struct Inode {
    /// What readers see.
    data: Vec<u8>,
    /// What survives a power cut with nothing unsynced.
    durable: Vec<u8>,
    /// Changes since the last sync, in order.
    unsynced: Vec<FileOp>,
}

#[derive(Debug, Default)]
struct State {
    /// Bumped by every power cut; handles of an older generation are dead.
    generation: u64,
    next_inode: u64,
    inodes: HashMap<u64, Inode>,
    /// The namespace as processes see it.
    current: BTreeMap<PathBuf, Node>,
    /// The namespace a power cut with nothing unsynced would leave.
    durable: BTreeMap<PathBuf, Node>,
    /// Namespace changes not yet synced, per parent directory, in order.
    dir_log: BTreeMap<PathBuf, Vec<DirOp>>,
    /// Mutating operations left before the machine dies (`None`: it never does).
    ops_left: Option<u64>,
    /// Mutating operations so far (to choose `die_after` points).
    ops_done: u64,
}

/// The simulated disk. Cheap to clone; clones share the disk.
#[derive(Debug, Clone, Default)]
pub struct SimFs {
    state: Arc<Mutex<State>>,
}

fn dead() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file", path.display()),
    )
}

fn parent(path: &Path) -> PathBuf {
    path.parent().map(Path::to_owned).unwrap_or_default()
}

fn apply_file_op(data: &mut Vec<u8>, op: &FileOp) {
    match op {
        FileOp::Write { pos, bytes } => {
            let end = *pos as usize + bytes.len();
            if data.len() < end {
                data.resize(end, 0);
            }
            data[*pos as usize..end].copy_from_slice(bytes);
        }
        FileOp::SetLen(len) => data.resize(*len as usize, 0),
    }
}

fn apply_dir_op(ns: &mut BTreeMap<PathBuf, Node>, op: &DirOp) {
    match op {
        DirOp::Link(path, node) => {
            ns.insert(path.clone(), *node);
        }
        DirOp::Unlink(path) => {
            ns.remove(path);
        }
        DirOp::Rename(from, to) => {
            if let Some(node) = ns.remove(from) {
                ns.insert(to.clone(), node);
            }
        }
    }
}

impl State {
    /// Counts one mutating operation, failing once the machine is dead.
    fn tick(&mut self) -> io::Result<()> {
        match &mut self.ops_left {
            Some(0) => Err(dead()),
            Some(n) => {
                *n -= 1;
                self.ops_done += 1;
                Ok(())
            }
            None => {
                self.ops_done += 1;
                Ok(())
            }
        }
    }

    fn alive(&self) -> io::Result<()> {
        if self.ops_left == Some(0) {
            Err(dead())
        } else {
            Ok(())
        }
    }

    fn change_dir(&mut self, op: DirOp) {
        let dir = match &op {
            DirOp::Link(p, _) | DirOp::Unlink(p) => parent(p),
            DirOp::Rename(from, _) => parent(from),
        };
        apply_dir_op(&mut self.current, &op);
        self.dir_log.entry(dir).or_default().push(op);
    }

    fn file(&self, path: &Path) -> io::Result<u64> {
        match self.current.get(path) {
            Some(Node::File(ino)) => Ok(*ino),
            Some(Node::Dir) => Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("{} is a directory", path.display()),
            )),
            None => Err(not_found(path)),
        }
    }
}

impl SimFs {
    /// An empty disk.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes the machine die after `ops` more mutating operations (writes, truncations, syncs,
    /// creations, renames, removals): that one and every later call fail with `EIO` until
    /// [`SimFs::power_cut`].
    pub fn die_after(&self, ops: u64) {
        self.state.lock().ops_left = Some(ops);
    }

    /// Brings a dead disk back without a power cut (a transient fault that cleared): what it
    /// failed stays failed, what it did stays done.
    pub fn revive(&self) {
        self.state.lock().ops_left = None;
    }

    /// Mutating operations performed so far.
    pub fn ops_done(&self) -> u64 {
        self.state.lock().ops_done
    }

    /// Cuts the power: every file and directory keeps what was synced plus what `mode` keeps of
    /// the rest, chosen by `seed`; open handles die; the machine comes back up.
    pub fn power_cut(&self, seed: u64, mode: CutMode) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut st = self.state.lock();
        let st = &mut *st;
        for ops in std::mem::take(&mut st.dir_log).into_values() {
            let keep = match mode {
                CutMode::SyncedOnly => 0,
                _ => rng.random_range(0..=ops.len()),
            };
            for op in &ops[..keep] {
                apply_dir_op(&mut st.durable, op);
            }
        }
        st.current = st.durable.clone();
        let live: std::collections::HashSet<u64> = st
            .current
            .values()
            .filter_map(|n| match n {
                Node::File(ino) => Some(*ino),
                Node::Dir => None,
            })
            .collect();
        st.inodes.retain(|ino, _| live.contains(ino));
        let mut inos: Vec<u64> = st.inodes.keys().copied().collect();
        inos.sort_unstable();
        for ino in inos {
            let inode = st.inodes.get_mut(&ino).expect("listed");
            let mut data = inode.durable.clone();
            let ops = std::mem::take(&mut inode.unsynced);
            match mode {
                CutMode::SyncedOnly => {}
                CutMode::Prefix => {
                    let keep = rng.random_range(0..=ops.len());
                    for op in &ops[..keep] {
                        apply_file_op(&mut data, op);
                    }
                    if let Some(FileOp::Write { pos, bytes }) = ops.get(keep) {
                        let part = rng.random_range(0..=bytes.len());
                        apply_file_op(
                            &mut data,
                            &FileOp::Write {
                                pos: *pos,
                                bytes: bytes[..part].to_vec(),
                            },
                        );
                    }
                }
                CutMode::TornSectors => {
                    for op in &ops {
                        match op {
                            FileOp::SetLen(_) => {
                                if rng.random_bool(0.5) {
                                    apply_file_op(&mut data, op);
                                }
                            }
                            FileOp::Write { pos, bytes } => {
                                let end = pos + bytes.len() as u64;
                                let mut at = *pos;
                                while at < end {
                                    let next = ((at / SECTOR) + 1) * SECTOR;
                                    let stop = next.min(end);
                                    if rng.random_bool(0.5) {
                                        let lo = (at - pos) as usize;
                                        let hi = (stop - pos) as usize;
                                        apply_file_op(
                                            &mut data,
                                            &FileOp::Write {
                                                pos: at,
                                                bytes: bytes[lo..hi].to_vec(),
                                            },
                                        );
                                    }
                                    at = stop;
                                }
                            }
                        }
                    }
                }
            }
            inode.durable = data.clone();
            inode.data = data;
        }
        st.generation += 1;
        st.ops_left = None;
    }

    /// Creates `dir` and its parents durably, as a test's fixture (a root directory that exists
    /// before the broker starts).
    pub fn mkdir_durable(&self, dir: &Path) {
        let mut st = self.state.lock();
        for a in dir.ancestors() {
            if a.as_os_str().is_empty() {
                continue;
            }
            st.current.insert(a.to_owned(), Node::Dir);
            st.durable.insert(a.to_owned(), Node::Dir);
        }
    }

    /// The current content of a file (for tests that look at bytes).
    pub fn contents(&self, path: &Path) -> io::Result<Vec<u8>> {
        let st = self.state.lock();
        let ino = st.file(path)?;
        Ok(st.inodes[&ino].data.clone())
    }
}

#[derive(Debug)]
struct SimFile {
    fs: SimFs,
    ino: u64,
    generation: u64,
    writable: bool,
}

impl SimFile {
    fn with<T>(&self, f: impl FnOnce(&mut State, u64) -> io::Result<T>) -> io::Result<T> {
        let mut st = self.fs.state.lock();
        if st.generation != self.generation || !st.inodes.contains_key(&self.ino) {
            return Err(dead());
        }
        f(&mut st, self.ino)
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(libc::EBADF))
        }
    }
}

impl Vfs for SimFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn VfsFile>> {
        let mut st = self.state.lock();
        st.alive()?;
        let existing = st.current.get(path).copied();
        let ino = match (mode, existing) {
            (_, Some(Node::Dir)) => return Err(st.file(path).unwrap_err()),
            (OpenMode::CreateNew, Some(_)) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists", path.display()),
                ));
            }
            (OpenMode::ReadOnly | OpenMode::ReadWrite, None) => return Err(not_found(path)),
            (OpenMode::ReadOnly | OpenMode::ReadWrite, Some(Node::File(ino))) => ino,
            (OpenMode::CreateTruncate, Some(Node::File(ino))) => {
                st.tick()?;
                let inode = st.inodes.get_mut(&ino).expect("linked inode");
                inode.data.clear();
                inode.unsynced.push(FileOp::SetLen(0));
                ino
            }
            (OpenMode::CreateNew | OpenMode::CreateTruncate, None) => {
                if st.current.get(&parent(path)) != Some(&Node::Dir) {
                    return Err(not_found(&parent(path)));
                }
                st.tick()?;
                let ino = st.next_inode;
                st.next_inode += 1;
                st.inodes.insert(ino, Inode::default());
                st.change_dir(DirOp::Link(path.to_owned(), Node::File(ino)));
                ino
            }
        };
        Ok(Arc::new(SimFile {
            fs: self.clone(),
            ino,
            generation: st.generation,
            writable: mode != OpenMode::ReadOnly,
        }))
    }

    fn read_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let st = self.state.lock();
        if st.current.get(dir) != Some(&Node::Dir) {
            return Err(not_found(dir));
        }
        Ok(st
            .current
            .range(dir.to_owned()..)
            .skip_while(|(p, _)| p.as_path() == dir)
            .take_while(|(p, _)| p.starts_with(dir))
            .filter(|(p, _)| p.parent() == Some(dir))
            .filter_map(|(p, _)| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect())
    }

    fn is_dir(&self, path: &Path) -> bool {
        self.state.lock().current.get(path) == Some(&Node::Dir)
    }

    fn exists(&self, path: &Path) -> bool {
        self.state.lock().current.contains_key(path)
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        let mut missing: Vec<&Path> = dir
            .ancestors()
            .filter(|a| !a.as_os_str().is_empty())
            .take_while(|a| !st.current.contains_key(*a))
            .collect();
        missing.reverse();
        for d in missing {
            st.tick()?;
            st.change_dir(DirOp::Link(d.to_owned(), Node::Dir));
        }
        match st.current.get(dir) {
            Some(Node::Dir) => Ok(()),
            _ => Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
        }
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        st.file(path)?;
        st.tick()?;
        st.change_dir(DirOp::Unlink(path.to_owned()));
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        assert_eq!(
            parent(from),
            parent(to),
            "the simulated disk renames within a directory only"
        );
        let mut st = self.state.lock();
        st.file(from)?;
        st.tick()?;
        st.change_dir(DirOp::Rename(from.to_owned(), to.to_owned()));
        Ok(())
    }

    fn remove_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        if st.current.get(dir) != Some(&Node::Dir) {
            return Err(not_found(dir));
        }
        // Deepest first, each an unlink in its own directory, as `rm -r` does.
        let doomed: Vec<PathBuf> = st
            .current
            .keys()
            .filter(|p| p.starts_with(dir))
            .rev()
            .cloned()
            .collect();
        for path in doomed {
            st.tick()?;
            st.change_dir(DirOp::Unlink(path));
        }
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        if st.current.get(dir) != Some(&Node::Dir) {
            return Err(not_found(dir));
        }
        st.tick()?;
        let ops = st.dir_log.remove(dir).unwrap_or_default();
        for op in &ops {
            apply_dir_op(&mut st.durable, op);
        }
        Ok(())
    }
}

impl VfsFile for SimFile {
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        self.with(|st, ino| {
            let data = &st.inodes[&ino].data;
            let end = pos as usize + buf.len();
            if end > data.len() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "read past the end of the file",
                ));
            }
            buf.copy_from_slice(&data[pos as usize..end]);
            Ok(())
        })
    }

    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        self.check_writable()?;
        self.with(|st, ino| {
            st.tick()?;
            let op = FileOp::Write {
                pos,
                bytes: buf.to_vec(),
            };
            let inode = st.inodes.get_mut(&ino).expect("checked");
            apply_file_op(&mut inode.data, &op);
            inode.unsynced.push(op);
            Ok(())
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        self.with(|st, ino| {
            st.tick()?;
            let inode = st.inodes.get_mut(&ino).expect("checked");
            inode.durable = inode.data.clone();
            inode.unsynced.clear();
            Ok(())
        })
    }

    fn len(&self) -> io::Result<u64> {
        self.with(|st, ino| Ok(st.inodes[&ino].data.len() as u64))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.check_writable()?;
        self.with(|st, ino| {
            st.tick()?;
            let op = FileOp::SetLen(len);
            let inode = st.inodes.get_mut(&ino).expect("checked");
            apply_file_op(&mut inode.data, &op);
            inode.unsynced.push(op);
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests;
