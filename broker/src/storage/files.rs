//! A cap on open segment files, shared by every log of a broker.
//!
//! Each segment needs its data file (and the tail its index) for reads and appends, but a broker
//! with ten thousand mostly idle topics cannot keep two descriptors per topic open: the process
//! limit is often a few thousand, and sockets need descriptors too. A [`CachedFile`] holds its
//! file open while it is used and lets the [`FileCache`] close it when more than the cap are open,
//! least recently used first; the next use opens it again.
//!
//! Closing never loses a write: a caller holds the `Arc` it got from [`CachedFile::get`] across a
//! write and the fsync that makes it durable, so both go through one open file description and an
//! fsync error is reported to the writer that needs it. Eviction only drops the cache's
//! reference; the descriptor closes when the last user is done.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::vfs::{OpenMode, Vfs, VfsFile};

/// The open files of every log, bounded.
#[derive(Debug)]
pub struct FileCache {
    capacity: usize,
    /// Files that are open, in no order; eviction sorts them by last use. A slot is here exactly
    /// while its file is open (eviction removes it before closing it; a reopen adds it again), and
    /// a segment dropped by recovery in place leaves a dead entry until the next eviction.
    open: Mutex<Vec<Weak<Slot>>>,
    /// A logical clock of uses, for least-recently-used eviction without a lock per use.
    clock: AtomicU64,
}

/// One file that may be closed and reopened. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CachedFile {
    slot: Arc<Slot>,
    cache: Arc<FileCache>,
}

#[derive(Debug)]
struct Slot {
    path: PathBuf,
    vfs: Arc<dyn Vfs>,
    file: Mutex<Option<Arc<dyn VfsFile>>>,
    last_use: AtomicU64,
}

impl FileCache {
    /// A cache that keeps at most `capacity` files open (at least 2, so that a segment's two
    /// files can be open together).
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            capacity: capacity.max(2),
            open: Mutex::new(Vec::new()),
            clock: AtomicU64::new(0),
        })
    }

    /// A cache sized to this process's descriptor limit, leaving `reserve` descriptors for
    /// everything else (sockets, checkpoints, plugins) — but never less than a quarter of the
    /// limit, so that a low limit (1,024 is common) still leaves segment files a fair share.
    pub fn for_process(reserve: u64) -> Arc<Self> {
        let limit = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft);
        Self::new(capacity_for(limit, reserve))
    }

    /// The most files this cache keeps open.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Files open now (for metrics and tests).
    pub fn open_files(&self) -> usize {
        self.open
            .lock()
            .iter()
            .filter(|w| w.strong_count() > 0)
            .count()
    }

    /// Wraps a file that was just opened (or created) by the caller.
    pub fn adopt(
        self: &Arc<Self>,
        vfs: Arc<dyn Vfs>,
        path: &Path,
        file: Arc<dyn VfsFile>,
    ) -> CachedFile {
        let slot = Arc::new(Slot {
            path: path.to_owned(),
            vfs,
            file: Mutex::new(Some(file)),
            last_use: AtomicU64::new(self.tick()),
        });
        self.register(&slot);
        CachedFile {
            slot,
            cache: self.clone(),
        }
    }

    /// A file that is opened on its first use (a sealed segment's files, until a reader needs
    /// them).
    pub fn lazy(self: &Arc<Self>, vfs: Arc<dyn Vfs>, path: &Path) -> CachedFile {
        CachedFile {
            slot: Arc::new(Slot {
                path: path.to_owned(),
                vfs,
                file: Mutex::new(None),
                last_use: AtomicU64::new(self.tick()),
            }),
            cache: self.clone(),
        }
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    fn register(&self, slot: &Arc<Slot>) {
        // Room is made before the new file joins, under one lock, so the list never holds more
        // than the cap even while several logs open files at once.
        let victims = {
            let mut open = self.open.lock();
            let victims = if open.len() >= self.capacity {
                self.victims(&mut open)
            } else {
                Vec::new()
            };
            // Files of dropped segments (rotated away, deleted by retention) leave dead entries
            // that hold their slot's memory: swept now and then, not only when the cap is hit.
            if open.len() % 1024 == 1023 {
                open.retain(|w| w.strong_count() > 0);
            }
            open.push(Arc::downgrade(slot));
            victims
        };
        // Closed outside the list's lock, and never while holding another slot's lock: a slot
        // being opened takes its own lock, then this list's.
        for victim in victims {
            victim.file.lock().take();
        }
    }

    /// Takes the least recently used files out of the list until a tenth of the capacity is free
    /// (so that a broker just over its cap does not sort the list on every open); the caller
    /// closes them.
    fn victims(&self, open: &mut Vec<Weak<Slot>>) -> Vec<Arc<Slot>> {
        // Dead entries (dropped segments) go here too.
        let mut live: Vec<Arc<Slot>> = open.drain(..).filter_map(|w| w.upgrade()).collect();
        let target = self.capacity - (self.capacity / 10).max(1);
        if live.len() <= target {
            open.extend(live.iter().map(Arc::downgrade));
            return Vec::new();
        }
        live.sort_by_key(|s| s.last_use.load(Ordering::Relaxed));
        let keep = live.split_off(live.len() - target);
        open.extend(keep.iter().map(Arc::downgrade));
        live
    }
}

fn capacity_for(limit: u64, reserve: u64) -> usize {
    limit
        .saturating_sub(reserve)
        .max(limit / 4)
        .max(64)
        .min(usize::MAX as u64) as usize
}

impl CachedFile {
    /// The open file, reopened (read-write) if the cache closed it. Hold the returned `Arc`
    /// across a write and the fsync that covers it.
    pub fn get(&self) -> std::io::Result<Arc<dyn VfsFile>> {
        self.slot
            .last_use
            .store(self.cache.tick(), Ordering::Relaxed);
        let mut file = self.slot.file.lock();
        if let Some(f) = &*file {
            return Ok(f.clone());
        }
        let opened = self.slot.vfs.open(&self.slot.path, OpenMode::ReadWrite)?;
        *file = Some(opened.clone());
        drop(file);
        self.cache.register(&self.slot);
        Ok(opened)
    }

    /// Whether the file is open now (tests).
    pub fn is_open(&self) -> bool {
        self.slot.file.lock().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::OsFs;

    #[test]
    fn the_default_capacity_leaves_room_for_sockets_but_never_starves_segments() {
        assert_eq!(capacity_for(20_000, 4_608), 15_392);
        assert_eq!(capacity_for(1_024, 4_608), 256);
        assert_eq!(capacity_for(1_024, 1_024), 256);
        assert_eq!(capacity_for(100, 1_024), 64);
    }

    #[test]
    fn the_least_recently_used_files_are_closed_and_reopen_on_use() {
        let dir = tempfile::tempdir().unwrap();
        let vfs: Arc<dyn Vfs> = Arc::new(OsFs);
        let cache = FileCache::new(10);
        let files: Vec<CachedFile> = (0..30)
            .map(|i| {
                let path = dir.path().join(format!("f{i}"));
                let f = vfs.open(&path, OpenMode::CreateNew).unwrap();
                f.write_all_at(&[i as u8], 0).unwrap();
                cache.adopt(vfs.clone(), &path, f)
            })
            .collect();
        assert!(cache.open_files() <= 10, "{} open", cache.open_files());
        // The newest are open, the oldest were closed.
        assert!(files[29].is_open());
        assert!(!files[0].is_open());
        // A closed file reopens with its content, and stays writable.
        let f = files[0].get().unwrap();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, 0).unwrap();
        assert_eq!(b, [0]);
        f.write_all_at(&[7], 1).unwrap();
        f.sync_data().unwrap();
        assert!(files[0].is_open());
        assert!(cache.open_files() <= 10);
        // An evicted file held by a user stays usable until the user drops it.
        let held = files[1].get().unwrap();
        for f in &files[2..] {
            f.get().unwrap();
        }
        assert!(!files[1].is_open());
        held.write_all_at(&[9], 0).unwrap();
        held.sync_data().unwrap();
        drop(held);
        let mut b = [0u8; 1];
        files[1].get().unwrap().read_exact_at(&mut b, 0).unwrap();
        assert_eq!(b, [9]);
    }
}
