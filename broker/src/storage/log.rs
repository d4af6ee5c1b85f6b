//! A log: a chain of segments with one writer and any number of readers. A topic is one log today;
//! when topics become partitions, each partition is one log. Nothing here knows about topics.
//!
//! # Group commit, pipelined
//! Appends queue up in [`Writer::pending`]. The *data stage* takes everything queued, gives it
//! consecutive offsets, writes it to the tail segment's data file (rotating as needed) and fsyncs
//! the data. It hands the batch to the *index stage*, which appends the positions to the index,
//! fsyncs the index — the commit point — then makes the entries visible to readers and answers the
//! waiting appends. The two stages run on separate blocking threads, so the data fsync of one batch
//! overlaps the index fsync of the batch before: a closed loop of appenders keeps both files' syncs
//! in flight. Neither stage exists while a log is idle: each is a `spawn_blocking` task started when
//! work arrives and finished when the queue is empty, so ten thousand idle logs cost no thread.
//!
//! # Failure
//! An error from a write or an fsync means the state of the file is unknown (after a failed fsync
//! Linux may already have dropped the dirty pages). The batch's appends fail, every queued append
//! fails, and the log is *poisoned*: it refuses appends for [`LogConfig::retry_after`]. The next
//! append after that first recovers in place, as a reopen would: segments created for batches that
//! never committed are removed, the tail's data and index are cut back to the commit point and
//! synced. If that works the log takes appends again; if the disk still fails, it stays poisoned
//! for another `retry_after`. Reads of what was committed go on working throughout.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use tokio::sync::{oneshot, watch};

use super::error::{IoContext, StorageError};
use super::files::FileCache;
use super::frame::{self, MAX_PAYLOAD_LEN};
use super::scan::{self, ChainGap};
use super::segment::{Entry, Segment};
use super::vfs::{Vfs, VfsFile};

/// When an append counts as durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlushMode {
    /// Many concurrent appends share one data fsync and one index fsync (the default).
    #[default]
    GroupCommit,
    /// Every append gets its own data fsync and index fsync, one after another (MMMQ's behaviour;
    /// kept for comparison).
    PerAppend,
    /// No fsync at all: an append is acknowledged once it is in the page cache. A power cut can
    /// lose acknowledged messages; a process crash cannot.
    NoSync,
}

impl std::str::FromStr for FlushMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "group" | "group-commit" => Ok(Self::GroupCommit),
            "per-append" | "always" => Ok(Self::PerAppend),
            "none" | "no-sync" => Ok(Self::NoSync),
            _ => Err(format!(
                "unknown flush mode {s:?}: use group, per-append or none"
            )),
        }
    }
}

/// Called after every commit with the number of entries it made durable (for metrics).
pub type CommitObserver = Arc<dyn Fn(u64) + Send + Sync>;

/// How a log writes.
#[derive(Clone)]
pub struct LogConfig {
    /// A new segment starts when the tail has reached this many bytes before an append (a soft
    /// cap: an entry is never split).
    pub segment_max_bytes: u64,
    /// When an append counts as durable.
    pub flush: FlushMode,
    /// Upper bound on the bytes one group commit writes, so that one huge burst does not hold
    /// every waiting append behind a single enormous write.
    pub max_batch_bytes: usize,
    /// Told about every commit.
    pub on_commit: Option<CommitObserver>,
    /// After a failed write, how long appends are refused before the log tries to recover in
    /// place (so that a failing disk is not hammered by every client's retry).
    pub retry_after: Duration,
    /// The open-file cap shared by every log of a broker (each segment's files are closed when
    /// unused for longest and the cap is reached, and reopened on the next use).
    pub files: Arc<FileCache>,
}

impl std::fmt::Debug for LogConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogConfig")
            .field("segment_max_bytes", &self.segment_max_bytes)
            .field("flush", &self.flush)
            .field("max_batch_bytes", &self.max_batch_bytes)
            .field("retry_after", &self.retry_after)
            .field("max_open_files", &self.files.capacity())
            .finish_non_exhaustive()
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_max_bytes: 64 * 1024 * 1024,
            flush: FlushMode::GroupCommit,
            max_batch_bytes: 8 * 1024 * 1024,
            on_commit: None,
            retry_after: Duration::from_secs(1),
            files: FileCache::for_process(DEFAULT_FD_RESERVE),
        }
    }
}

/// Descriptors a default [`LogConfig`] leaves outside its file cache (sockets, checkpoints,
/// plugins, the runtime's own).
pub const DEFAULT_FD_RESERVE: u64 = 1024;

/// Sizes for the topic list and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogStats {
    /// The offset the next append will get, counting only committed entries.
    pub next_offset: u64,
    /// Segment files (pairs).
    pub segments: usize,
    /// Committed bytes in the data files.
    pub bytes: u64,
}

type Reply = oneshot::Sender<Result<u64, StorageError>>;

/// One append request: the frames of its payloads, already encoded (CRCs are computed on the
/// caller's thread, in parallel, not by the single writer).
struct Pending {
    frames: Vec<u8>,
    lens: Vec<u32>,
    reply: Reply,
}

/// A batch whose data is durable, waiting for its index.
struct Staged {
    pieces: Vec<Piece>,
    next_offset: u64,
    replies: Vec<(Reply, u64)>,
}

/// The part of a batch that landed in one segment.
struct Piece {
    segment: Arc<Segment>,
    /// The data file the piece was written through, held until its fsync.
    data_file: Arc<dyn VfsFile>,
    positions: Vec<u64>,
    end: u64,
}

#[derive(Default)]
struct Writer {
    pending: VecDeque<Pending>,
    data_running: bool,
    indexing: VecDeque<Staged>,
    index_running: bool,
    poisoned: Option<Poison>,
}

/// Why a log refuses appends, and from when it will try to recover.
struct Poison {
    cause: String,
    retry_at: Instant,
}

/// Where the next entry goes. Only the data stage touches it.
struct Tail {
    segment: Arc<Segment>,
    write_pos: u64,
    next_offset: u64,
}

struct Inner {
    dir: PathBuf,
    vfs: Arc<dyn Vfs>,
    config: LogConfig,
    runtime: tokio::runtime::Handle,
    segments: RwLock<Vec<Arc<Segment>>>,
    /// The next offset past the last committed entry; readers and subscribers watch it.
    committed: watch::Sender<u64>,
    writer: Mutex<Writer>,
    /// Signalled when the index stage finishes (recovery in place waits for it).
    index_idle: Condvar,
    tail: Mutex<Tail>,
}

/// A durable, append-only log of payloads addressed by offset. Cheap to clone.
#[derive(Clone)]
pub struct Log {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log")
            .field("dir", &self.inner.dir)
            .field("next_offset", &self.next_offset())
            .finish()
    }
}

impl Log {
    /// Opens (or creates) the log in `dir`, recovering it as the README's "Storage" says: the index is the
    /// truth, uncommitted data is cut, an index that points past its data is an error.
    ///
    /// Blocking; must be called from within a Tokio runtime (the log's stages run on its blocking
    /// pool), typically inside `spawn_blocking`.
    pub fn open(dir: &Path, vfs: Arc<dyn Vfs>, config: LogConfig) -> Result<Self, StorageError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| StorageError::io(dir, std::io::Error::other(e)))?;
        if !vfs.is_dir(dir) {
            vfs.create_dir_all(dir).at(dir)?;
            if let Some(parent) = dir.parent() {
                vfs.sync_dir(parent).at(parent)?;
            }
        }
        let listing = scan::list_segments(&*vfs, dir)?;
        for stray in &listing.strays {
            tracing::warn!(dir = %dir.display(), file = %stray, "ignoring a file that is not named like a segment");
        }
        let mut scans = scan::scan_log(&*vfs, &listing)?;
        if let Some(bad) = scans.iter().find(|s| s.inconsistency.is_some()) {
            return Err(StorageError::Inconsistent {
                path: bad.files.index.clone(),
                reason: bad.inconsistency.clone().unwrap_or_default(),
            });
        }
        match scan::check_chain(&scans) {
            None => {}
            Some(ChainGap::EmptyTail { index }) => {
                for s in scans.drain(index..) {
                    tracing::warn!(file = %s.files.data.display(), "removing an empty segment left by an interrupted rotation");
                    for path in [&s.files.data, &s.files.index] {
                        if vfs.exists(path) {
                            vfs.remove_file(path).at(path)?;
                        }
                    }
                }
                vfs.sync_dir(dir).at(dir)?;
            }
            Some(ChainGap::Broken { index, reason }) => {
                return Err(StorageError::Inconsistent {
                    path: scans[index].files.index.clone(),
                    reason,
                });
            }
        }
        let mut segments = Vec::with_capacity(scans.len().max(1));
        let last = scans.len().saturating_sub(1);
        for (i, scan) in scans.into_iter().enumerate() {
            segments.push(Arc::new(Segment::recover(
                &vfs,
                &config.files,
                scan,
                i == last,
            )?));
        }
        if segments.is_empty() {
            segments.push(Arc::new(Segment::create(&vfs, &config.files, dir, 0)?));
        }
        let tail_segment = segments.last().expect("at least one segment").clone();
        let next_offset = tail_segment.start() + tail_segment.committed_count();
        let tail = Tail {
            write_pos: tail_segment.committed_bytes(),
            segment: tail_segment,
            next_offset,
        };
        Ok(Self {
            inner: Arc::new(Inner {
                dir: dir.to_owned(),
                vfs,
                config,
                runtime,
                segments: RwLock::new(segments),
                committed: watch::Sender::new(next_offset),
                writer: Mutex::new(Writer::default()),
                index_idle: Condvar::new(),
                tail: Mutex::new(tail),
            }),
        })
    }

    /// The log's directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Appends one payload; resolves with its offset once it is durable (per the flush mode).
    pub async fn append(&self, payload: &[u8]) -> Result<u64, StorageError> {
        self.append_batch(&[payload]).await
    }

    /// Appends payloads at consecutive offsets, all in the same commit; resolves with the first
    /// offset. An empty batch resolves at once with the next offset.
    pub async fn append_batch<P: AsRef<[u8]>>(&self, payloads: &[P]) -> Result<u64, StorageError> {
        if payloads.is_empty() {
            return Ok(self.next_offset());
        }
        let mut frames = Vec::with_capacity(
            payloads
                .iter()
                .map(|p| p.as_ref().len() + frame::HEADER_LEN)
                .sum(),
        );
        let mut lens = Vec::with_capacity(payloads.len());
        for p in payloads {
            let p = p.as_ref();
            if p.len() > MAX_PAYLOAD_LEN {
                return Err(StorageError::PayloadTooLarge {
                    len: p.len(),
                    max: MAX_PAYLOAD_LEN,
                });
            }
            frame::encode_into(p, &mut frames);
            lens.push((p.len() + frame::HEADER_LEN) as u32);
        }
        let (reply, rx) = oneshot::channel();
        self.inner.submit(Pending {
            frames,
            lens,
            reply,
        })?;
        rx.await.map_err(|_| StorageError::Closed)?
    }

    /// The offset after the last committed entry: entries below it can be read.
    pub fn next_offset(&self) -> u64 {
        *self.inner.committed.borrow()
    }

    /// A receiver of the committed next offset, for subscribers that wait for new entries without
    /// polling (`changed().await`, `wait_for(|&n| n > offset)`).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.committed.subscribe()
    }

    /// Waits until the entry at `offset` is committed.
    pub async fn wait_for(&self, offset: u64) {
        let mut rx = self.subscribe();
        // The sender lives as long as `self`, so this cannot fail while we hold `self`.
        let _ = rx.wait_for(|&next| next > offset).await;
    }

    /// Whether an earlier failure stopped this log taking appends.
    pub fn poisoned(&self) -> Option<String> {
        self.inner
            .writer
            .lock()
            .poisoned
            .as_ref()
            .map(|p| p.cause.clone())
    }

    /// Reads the committed entry at `offset`: `Ok(None)` if it is not committed yet, a
    /// [`StorageError::Corrupt`] if its checksum fails. Blocking (one `pread`).
    pub fn read(&self, offset: u64) -> Result<Option<Vec<u8>>, StorageError> {
        match self.read_from(offset, 1, usize::MAX)?.pop() {
            Some(entry) => Ok(Some(entry.payload?)),
            None => Ok(None),
        }
    }

    /// Reads up to `max_count` consecutive committed entries from `offset`, stopping early after
    /// about `max_bytes` (at least one entry is returned when there is one). A corrupt entry is
    /// returned as such, in place, so it never hides its neighbours. Blocking.
    pub fn read_from(
        &self,
        offset: u64,
        max_count: usize,
        max_bytes: usize,
    ) -> Result<Vec<Entry>, StorageError> {
        let committed = self.next_offset();
        let mut out = Vec::new();
        let mut at = offset;
        let mut budget = max_bytes;
        while at < committed && out.len() < max_count && budget > 0 {
            let Some(segment) = self.inner.segment_for(at) else {
                break;
            };
            let want = (max_count - out.len()).min((committed - at) as usize);
            let got = segment.read_from(at, want, budget)?;
            if got.is_empty() {
                break;
            }
            at = got.last().expect("non-empty").offset + 1;
            let bytes: usize = got
                .iter()
                .map(|e| e.payload.as_ref().map_or(0, Vec::len))
                .sum();
            budget = budget.saturating_sub(bytes.max(1));
            out.extend(got);
        }
        Ok(out)
    }

    /// Sizes for listings.
    pub fn stats(&self) -> LogStats {
        let segments = self.inner.segments.read();
        LogStats {
            next_offset: self.next_offset(),
            segments: segments.len(),
            bytes: segments.iter().map(|s| s.committed_bytes()).sum(),
        }
    }

    /// The offset of the first entry still stored (0 until retention exists).
    pub fn first_offset(&self) -> u64 {
        self.inner.segments.read().first().map_or(0, |s| s.start())
    }
}

impl Inner {
    fn submit(self: &Arc<Self>, pending: Pending) -> Result<(), StorageError> {
        let mut w = self.writer.lock();
        if let Some(p) = &w.poisoned
            && Instant::now() < p.retry_at
        {
            return Err(self.poisoned_error(&p.cause));
        }
        w.pending.push_back(pending);
        if !w.data_running {
            w.data_running = true;
            let this = self.clone();
            self.runtime.spawn_blocking(move || this.data_stage());
        }
        Ok(())
    }

    fn poisoned_error(&self, cause: &str) -> StorageError {
        StorageError::Poisoned {
            dir: self.dir.clone(),
            cause: cause.to_owned(),
        }
    }

    fn segment_for(&self, offset: u64) -> Option<Arc<Segment>> {
        let segments = self.segments.read();
        let i = segments.partition_point(|s| s.start() <= offset);
        i.checked_sub(1).map(|i| segments[i].clone())
    }

    /// Takes queued appends, up to the batch size (always at least one).
    fn take_batch(&self, w: &mut Writer) -> Vec<Pending> {
        let limit = match self.config.flush {
            FlushMode::PerAppend => 1,
            _ => usize::MAX,
        };
        let mut bytes = 0;
        let mut batch = Vec::new();
        while let Some(p) = w.pending.front() {
            if !batch.is_empty()
                && (batch.len() >= limit || bytes + p.frames.len() > self.config.max_batch_bytes)
            {
                break;
            }
            bytes += p.frames.len();
            batch.push(w.pending.pop_front().expect("front exists"));
        }
        batch
    }

    fn data_stage(self: Arc<Self>) {
        loop {
            let (batch, heal) = {
                let mut w = self.writer.lock();
                if w.pending.is_empty() {
                    w.data_running = false;
                    return;
                }
                let heal = w.poisoned.is_some();
                if heal {
                    // The index stage may still be finishing batches of before the failure (no new
                    // ones reach it while the log is poisoned); recovery in place needs it idle.
                    while w.index_running {
                        self.index_idle.wait(&mut w);
                    }
                }
                (self.take_batch(&mut w), heal)
            };
            if heal {
                if let Err(e) = self.heal() {
                    self.poison(&e, batch.into_iter().map(|p| p.reply));
                    continue;
                }
                let cause = self.writer.lock().poisoned.take().map(|p| p.cause);
                tracing::info!(dir = %self.dir.display(), cause = ?cause, "log recovered in place after a write failure; taking appends again");
            }
            let staged = match self.write_data(&batch) {
                Ok((pieces, firsts, next_offset)) => Staged {
                    pieces,
                    next_offset,
                    replies: batch.into_iter().map(|p| p.reply).zip(firsts).collect(),
                },
                Err(e) => {
                    self.poison(&e, batch.into_iter().map(|p| p.reply));
                    continue;
                }
            };
            if self.config.flush == FlushMode::GroupCommit {
                let mut w = self.writer.lock();
                if let Some(cause) = w.poisoned.as_ref().map(|p| p.cause.clone()) {
                    drop(w);
                    self.fail(&cause, staged.replies.into_iter().map(|r| r.0));
                    continue;
                }
                w.indexing.push_back(staged);
                if !w.index_running {
                    w.index_running = true;
                    let this = self.clone();
                    self.runtime.spawn_blocking(move || this.index_stage());
                }
            } else {
                // Per-append and no-sync gain nothing from a second thread.
                self.commit_and_reply(vec![staged], false);
            }
        }
    }

    fn index_stage(self: Arc<Self>) {
        loop {
            let staged: Vec<Staged> = {
                let mut w = self.writer.lock();
                if w.indexing.is_empty() {
                    w.index_running = false;
                    self.index_idle.notify_all();
                    return;
                }
                w.indexing.drain(..).collect()
            };
            if !self.commit_and_reply(staged, true) {
                return;
            }
        }
    }

    /// Commits and answers the staged batches; on failure poisons the log (and, when called by
    /// the index stage, marks that stage finished in the same critical section, so that the first
    /// append after the failure already finds it idle). Returns whether the commit succeeded.
    fn commit_and_reply(&self, staged: Vec<Staged>, index_stage: bool) -> bool {
        match self.commit(&staged) {
            Ok(()) => {
                for s in staged {
                    for (reply, first) in s.replies {
                        let _ = reply.send(Ok(first));
                    }
                }
                true
            }
            Err(e) => {
                let replies = staged.into_iter().flat_map(|s| s.replies).map(|r| r.0);
                self.poison_and(&e, replies, |w| {
                    if index_stage {
                        w.index_running = false;
                        self.index_idle.notify_all();
                    }
                });
                false
            }
        }
    }

    /// Writes the batch's frames to the data file(s) and makes them durable. Returns the pieces
    /// per segment, the first offset of each pending append and the next offset after the batch.
    #[allow(clippy::type_complexity)]
    fn write_data(&self, batch: &[Pending]) -> Result<(Vec<Piece>, Vec<u64>, u64), StorageError> {
        let mut tail = self.tail.lock();
        let max = self.config.segment_max_bytes;
        let total: usize = batch.iter().map(|p| p.frames.len()).sum();
        let mut pieces = Vec::new();
        let mut segment = tail.segment.clone();
        let mut base = tail.write_pos;
        let mut buf = Vec::with_capacity(total);
        let mut positions = Vec::new();
        let mut offset = tail.next_offset;
        let mut firsts = Vec::with_capacity(batch.len());
        for p in batch {
            firsts.push(offset);
            let mut at = 0usize;
            for &len in &p.lens {
                let here = base + buf.len() as u64;
                if here > 0 && here >= max {
                    if !positions.is_empty() {
                        let data_file = segment.write_data(&buf, base)?;
                        pieces.push(Piece {
                            segment: segment.clone(),
                            data_file,
                            positions: std::mem::take(&mut positions),
                            end: here,
                        });
                    }
                    let next = Arc::new(Segment::create(
                        &self.vfs,
                        &self.config.files,
                        &self.dir,
                        offset,
                    )?);
                    self.segments.write().push(next.clone());
                    segment = next;
                    base = 0;
                    buf.clear();
                }
                positions.push(base + buf.len() as u64);
                buf.extend_from_slice(&p.frames[at..at + len as usize]);
                at += len as usize;
                offset += 1;
            }
        }
        if !positions.is_empty() {
            let data_file = segment.write_data(&buf, base)?;
            pieces.push(Piece {
                segment: segment.clone(),
                data_file,
                positions,
                end: base + buf.len() as u64,
            });
        }
        if self.config.flush != FlushMode::NoSync {
            // Each piece is a different segment: a rotation starts a new piece.
            for piece in &pieces {
                piece.data_file.sync_data().at(&piece.segment.files.data)?;
            }
        }
        tail.write_pos = base + buf.len() as u64;
        tail.segment = segment;
        tail.next_offset = offset;
        Ok((pieces, firsts, offset))
    }

    /// Appends the index entries of durable batches, fsyncs the index (the commit point) and makes
    /// the entries visible.
    ///
    /// When the batches span segments, each segment's index entries are written only after the
    /// previous segment's are synced: the indexes of two files are not synced atomically, and a
    /// power cut must never keep a later segment's entries without an earlier one's (the log would
    /// have a gap, and refuse to open).
    fn commit(&self, staged: &[Staged]) -> Result<(), StorageError> {
        let mut pieces = staged.iter().flat_map(|s| &s.pieces).peekable();
        // Every file the segment's entries were written through stays open until the fsync.
        let mut unsynced = Vec::new();
        while let Some(piece) = pieces.next() {
            let index = piece.segment.write_index(&piece.positions)?;
            unsynced.push(index.clone());
            let segment_done = pieces
                .peek()
                .is_none_or(|next| !Arc::ptr_eq(&next.segment, &piece.segment));
            if segment_done {
                if self.config.flush != FlushMode::NoSync {
                    index.sync_data().at(&piece.segment.files.index)?;
                }
                unsynced.clear();
            }
        }
        for piece in staged.iter().flat_map(|s| &s.pieces) {
            piece.segment.publish(&piece.positions, piece.end);
        }
        if let Some(last) = staged.last() {
            let before = self.committed.send_replace(last.next_offset);
            if let Some(observe) = &self.config.on_commit {
                observe(last.next_offset - before);
            }
        }
        Ok(())
    }

    /// Cuts everything after the commit point, as recovery at open would, so that appends can
    /// resume without a restart. Runs on the data stage with the index stage idle.
    fn heal(&self) -> Result<(), StorageError> {
        let mut tail = self.tail.lock();
        let committed = *self.committed.borrow();
        let last = {
            let mut segments = self.segments.write();
            // Segments that a failed batch rotated into hold nothing committed; the one before
            // them becomes the tail again. A segment sealed before this process started is never
            // written, so an empty tail after it was not created by a failed batch: it stays.
            while segments.len() > 1
                && segments.last().is_some_and(|s| s.committed_count() == 0)
                && segments[segments.len() - 2].writable()
            {
                segments.pop();
            }
            segments.last().expect("never empty").clone()
        };
        // Files of every segment after the tail: the ones just dropped, and any half-created by a
        // rotation that failed between its two files.
        let mut stale = false;
        for files in scan::list_segments(&*self.vfs, &self.dir)?.segments {
            if files.start <= last.start() {
                continue;
            }
            for path in [&files.data, &files.index] {
                if self.vfs.exists(path) {
                    self.vfs.remove_file(path).at(path)?;
                    stale = true;
                }
            }
        }
        if stale {
            self.vfs.sync_dir(&self.dir).at(&self.dir)?;
        }
        last.cut_uncommitted()?;
        *tail = Tail {
            write_pos: last.committed_bytes(),
            segment: last,
            next_offset: committed,
        };
        Ok(())
    }

    /// Stops the log taking appends after `error`, failing `replies` and everything queued.
    fn poison(&self, error: &StorageError, replies: impl IntoIterator<Item = Reply>) {
        self.poison_and(error, replies, |_| {});
    }

    /// [`Inner::poison`], also changing the writer state under the same lock.
    fn poison_and(
        &self,
        error: &StorageError,
        replies: impl IntoIterator<Item = Reply>,
        also: impl FnOnce(&mut Writer),
    ) {
        tracing::error!(dir = %self.dir.display(), %error, retry_after_ms = self.config.retry_after.as_millis() as u64, "log write failed; refusing appends, then recovering in place");
        let (cause, queued) = {
            let mut w = self.writer.lock();
            let retry_at = Instant::now() + self.config.retry_after;
            let cause = match &mut w.poisoned {
                Some(p) => {
                    p.retry_at = retry_at;
                    p.cause.clone()
                }
                None => {
                    let cause = error.to_string();
                    w.poisoned = Some(Poison {
                        cause: cause.clone(),
                        retry_at,
                    });
                    cause
                }
            };
            let mut queued: Vec<Reply> = w.pending.drain(..).map(|p| p.reply).collect();
            queued.extend(w.indexing.drain(..).flat_map(|s| s.replies).map(|r| r.0));
            also(&mut w);
            (cause, queued)
        };
        self.fail(&cause, replies.into_iter().chain(queued));
    }

    fn fail(&self, cause: &str, replies: impl IntoIterator<Item = Reply>) {
        for reply in replies {
            let _ = reply.send(Err(self.poisoned_error(cause)));
        }
    }
}
