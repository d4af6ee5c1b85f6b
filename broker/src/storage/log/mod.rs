//! A log: a chain of segments with one writer and any number of readers. A topic is one log today;
//! when topics become partitions, each partition is one log. Nothing here knows about topics.
//!
//! # Group commit, one fsync
//! Appends queue up in the writer. Its one stage takes everything queued, gives it consecutive
//! offsets, writes it to the tail segment's data file (rotating as needed) and fsyncs the data —
//! the commit point (docs/storage.md, "Storage") — then makes the entries visible to readers, answers the
//! waiting appends, and writes their index entries without syncing. While one batch is being
//! synced the next one queues, so a closed loop of appenders shares each fsync. The index lags
//! the data: it is synced at most every [`LogConfig::index_sync_interval`], at rotation and at
//! close, and recovery re-indexes the CRC-valid frames past it. The tail's data file is
//! preallocated with zeros ahead of the writes, so that most fsyncs have no file size to write:
//! about as many as the tail holds data (4 KiB at first, at most
//! [`LogConfig::preallocate_bytes`]), so a barely used log costs a block, not the cap. Rotation
//! and close cut it back to its last entry. The stage exists only while there is work, so ten
//! thousand idle logs cost no thread. When appends come one at a time (commits lately held at
//! most [`LEAD_MAX_BATCH`] of them on average), the append that finds the log idle leads the commit itself,
//! on its own thread (`block_in_place`, on a multi-threaded runtime): it writes and fsyncs its
//! batch — with whatever queued meanwhile — and answers, with no hand-off to another thread and
//! back. Appends that arrive during that fsync queue; if any did, the leader hands them to a
//! blocking thread (`spawn_blocking`), which commits batch after batch until the queue is empty,
//! so no caller waits for more than the commit it joined and the one before it. Under
//! concurrency (bigger batches) an idle log's first append starts that blocking thread instead:
//! `block_in_place` moves the worker's other tasks to another thread, which costs more than the
//! hand-off saves when many requests wait on the same worker (docs/benchmarks.md, "The commit
//! path without hand-offs").
//!
//! # Failure
//! An error from a write or an fsync means the state of the file is unknown (after a failed fsync
//! Linux may already have dropped the dirty pages). The batch's appends fail, every queued append
//! fails, and the log is *poisoned*: it refuses appends for [`LogConfig::retry_after`]. The next
//! append after that first recovers in place, as a reopen would: segments created for batches that
//! never committed are removed, newest first, and the tail's index and then its data are cut back
//! to the commit point and synced, in an order that leaves a log that opens wherever a power cut
//! stops it. If that works the log takes appends again; if the disk still fails, it stays poisoned
//! for another `retry_after`. Reads of what was committed go on working throughout.

//! # Layout
//! - `config`: how a log writes ([`LogConfig`], [`FlushMode`]).
//! - `writer`: the group-commit writer and the commit; it calls into `heal` on a failure.
//! - `heal`: poison after a failure, and recovery in place.
//! - `state`: what both of those share (the queue of operations, the poison, the tail); it
//!   imports neither, and `heal` imports nothing of `writer`.
//! - `raft`: what a clustered partition's log does besides (docs/cluster.md, "Clustered
//!   partitions on disk"): appends that carry log ids, a visible end apart from the durable one,
//!   reads of the log ids, cutting back and starting over.
//! - `read`: reads of committed entries through the segment chain.
//! - this module: [`Log`], its recovery at open, and the segment chain.

mod config;
mod heal;
mod raft;
mod read;
mod state;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use parking_lot::{Mutex, RwLock};
use tokio::sync::{oneshot, watch};

use super::error::{IoContext, StorageError};
use super::frame::{self, MAX_PAYLOAD_LEN};
use super::scan::{self, ChainGap};
use super::segment::Segment;
use super::vfs::{Vfs, create_dir_durably};
pub use config::{CommitObserver, DEFAULT_FD_RESERVE, FlushMode, LogConfig, TailCheck};
pub use raft::{Committing, RaftFrame};
pub use state::Settle;
use state::{Op, Pending, Reply, Tail, Writer};
pub use writer::LEAD_MAX_BATCH;

/// One segment as retention sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentSummary {
    /// Its first offset.
    pub start: u64,
    /// The offset after its last committed entry.
    pub end: u64,
    /// Committed bytes.
    pub bytes: u64,
    /// Sealed: complete, never written again (every segment but the tail).
    pub sealed: bool,
}

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

struct Inner {
    dir: PathBuf,
    vfs: Arc<dyn Vfs>,
    config: LogConfig,
    runtime: tokio::runtime::Handle,
    segments: RwLock<Vec<Arc<Segment>>>,
    /// The next offset past the last entry readers may see; readers and subscribers watch it. In
    /// a single-node log that is the durable end; in a clustered log, the lower of the durable
    /// end and `applied`.
    committed: watch::Sender<u64>,
    /// The next offset past the last durable entry: the writer's commit point.
    durable: AtomicU64,
    /// A clustered log's end as its state machine applied it (entries a majority holds); readers
    /// see up to it once it is durable here too. Its lock orders the updates of `committed`.
    applied: Mutex<u64>,
    writer: Mutex<Writer>,
    tail: Mutex<Tail>,
    /// Commits an append led on its own thread (counted for the tests only).
    #[cfg(test)]
    led: std::sync::atomic::AtomicU64,
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
    /// Opens (or creates) the log in `dir`, recovering it as the docs/storage.md, "Storage" says: the tail
    /// is reconciled with its CRC-valid frames (entries past its index re-indexed, a torn write
    /// cut), sealed segments are trusted as their index says, and an index that points past its
    /// data is an error.
    ///
    /// Blocking; must be called from within a Tokio runtime (the log's stages run on its blocking
    /// pool), typically inside `spawn_blocking`.
    pub fn open(dir: &Path, vfs: Arc<dyn Vfs>, config: LogConfig) -> Result<Self, StorageError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| StorageError::io(dir, std::io::Error::other(e)))?;
        create_dir_durably(&*vfs, dir)?;
        let mut listing = scan::list_segments(&*vfs, dir)?;
        remove_deletion_remnants(&*vfs, dir, &mut listing)?;
        for stray in &listing.strays {
            tracing::warn!(dir = %dir.display(), file = %stray, "ignoring a file that is not named like a segment");
        }
        let mut scans = scan::scan_log(&*vfs, &listing, config.tail_check, false)?;
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
        // A clustered log shows nothing until its state machine says what was applied.
        let visible = if config.raft_header {
            segments[0].start()
        } else {
            next_offset
        };
        let tail = Tail {
            write_pos: tail_segment.committed_bytes(),
            segment: tail_segment,
            next_offset,
            index_synced: std::time::Instant::now(),
        };
        Ok(Self {
            inner: Arc::new(Inner {
                dir: dir.to_owned(),
                vfs,
                config,
                runtime,
                segments: RwLock::new(segments),
                committed: watch::Sender::new(visible),
                durable: AtomicU64::new(next_offset),
                applied: Mutex::new(visible),
                writer: Mutex::new(Writer::default()),
                tail: Mutex::new(tail),
                #[cfg(test)]
                led: std::sync::atomic::AtomicU64::new(0),
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
        self.refuse_if_clustered()?;
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
        self.submit(frames, lens, None, false).await
    }

    /// Appends one payload that `write` writes straight into the frame buffer (no copy of it
    /// is made on the way to the disk); resolves with its offset once it is durable. `settle`,
    /// if given, is called with the outcome exactly once, before this resolves, even if this
    /// future is dropped first.
    ///
    /// When the log is idle this may run the commit in the caller's own poll (see the module
    /// documentation): for a task that is one request, not for one that drives other futures
    /// beside this one (they would wait for the fsync). [`Log::append`] and
    /// [`Log::append_batch`] never do.
    pub async fn append_with(
        &self,
        capacity: usize,
        write: impl FnOnce(&mut Vec<u8>),
        settle: Option<Settle>,
    ) -> Result<u64, StorageError> {
        if let Err(error) = self.refuse_if_clustered() {
            if let Some(settle) = settle {
                settle(Err(&error));
            }
            return Err(error);
        }
        let mut frames = Vec::with_capacity(frame::HEADER_LEN + capacity);
        frames.resize(frame::HEADER_LEN, 0);
        write(&mut frames);
        let len = frames.len() - frame::HEADER_LEN;
        if len > MAX_PAYLOAD_LEN {
            let error = StorageError::PayloadTooLarge {
                len,
                max: MAX_PAYLOAD_LEN,
            };
            if let Some(settle) = settle {
                settle(Err(&error));
            }
            return Err(error);
        }
        frame::seal_header(&mut frames);
        self.submit(frames, vec![(len + frame::HEADER_LEN) as u32], settle, true)
            .await
    }

    /// Queues encoded frames and waits for their commit: led by this caller when the log was
    /// idle (see the module documentation).
    async fn submit(
        &self,
        frames: Vec<u8>,
        lens: Vec<u32>,
        settle: Option<Settle>,
        lead: bool,
    ) -> Result<u64, StorageError> {
        let (tx, rx) = oneshot::channel();
        let payload_bytes = frames.len() - lens.len() * frame::HEADER_LEN;
        let op = Op::Append(Pending {
            frames,
            lens,
            reply: Reply::new(tx, settle, payload_bytes),
        });
        if self.inner.submit(op, lead && may_lead()) {
            let inner = self.inner.clone();
            tokio::task::block_in_place(move || inner.lead());
        }
        rx.await.map_err(|_| StorageError::Closed)?
    }

    /// Seals the tail segment if it holds entries, and starts a new, empty one (so that retention
    /// can delete a tail that outlived its time). Waits for appends queued before it.
    pub async fn roll(&self) -> Result<(), StorageError> {
        let (done, rx) = oneshot::channel();
        self.inner.submit(Op::Roll(done), false);
        rx.await.map_err(|_| StorageError::Closed)?
    }

    /// Leaves the exact on-disk layout (the tail's index complete and synced, its preallocated
    /// zeros cut) once the appends queued before it are done, and refuses appends from then on.
    /// A clean shutdown closes every log; a log dropped without it recovers at the next open.
    pub async fn close(&self) -> Result<(), StorageError> {
        let (done, rx) = oneshot::channel();
        self.inner.submit(Op::Close(done), false);
        rx.await.map_err(|_| StorageError::Closed)?
    }

    /// How many commits an append led on its own thread.
    #[cfg(test)]
    pub(crate) fn led_commits(&self) -> u64 {
        self.inner.led.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The offset after the last committed entry: entries below it can be read. In a clustered
    /// log, the visible end: entries its state machine applied and that are durable here.
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

    /// Sizes for listings.
    pub fn stats(&self) -> LogStats {
        let segments = self.inner.segments.read();
        LogStats {
            next_offset: self.next_offset(),
            segments: segments.len(),
            bytes: segments.iter().map(|s| s.committed_bytes()).sum(),
        }
    }

    /// The offset of the first entry still stored (retention moves it).
    pub fn first_offset(&self) -> u64 {
        self.inner.segments.read().first().map_or(0, |s| s.start())
    }

    /// Every segment, oldest first.
    pub fn segments(&self) -> Vec<SegmentSummary> {
        self.inner
            .segments
            .read()
            .iter()
            .map(|s| SegmentSummary {
                start: s.start(),
                end: s.start() + s.committed_count(),
                bytes: s.committed_bytes(),
                sealed: s.sealed(),
            })
            .collect()
    }

    /// Deletes the sealed segments whose entries all lie before `offset`, oldest first (never the
    /// tail); returns how many. Readers see the new first offset at once. A crash part way leaves
    /// the oldest remaining segment with one of its two files, which the next open removes.
    /// Blocking.
    pub fn remove_segments_before(&self, offset: u64) -> Result<usize, StorageError> {
        let victims: Vec<Arc<Segment>> = {
            let mut segments = self.inner.segments.write();
            let n = segments
                .iter()
                .take_while(|s| s.sealed() && s.start() + s.committed_count() <= offset)
                .count()
                .min(segments.len() - 1);
            segments.drain(..n).collect()
        };
        let vfs = &self.inner.vfs;
        for s in &victims {
            // The index first: a remnant is then a data file alone, never an index whose entries
            // point into a missing file.
            for path in [&s.files.index, &s.files.data] {
                if let Err(e) = vfs.remove_file(path)
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    return Err(StorageError::io(path, e));
                }
            }
        }
        if !victims.is_empty() {
            vfs.sync_dir(&self.inner.dir).at(&self.inner.dir)?;
        }
        Ok(victims.len())
    }
}

/// Whether an append may run its commit on its own thread (in `block_in_place`): only on a
/// multi-threaded runtime, where the worker's other tasks move to another thread meanwhile; on a
/// current-thread runtime blocking would stall every task, so a blocking thread commits.
fn may_lead() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// Removes what an interrupted retention pass left at the head of a log: leading segments that
/// lack their index or their data file while a later segment is whole. (Anywhere else a missing
/// file is damage, and recovery refuses it.)
fn remove_deletion_remnants(
    vfs: &dyn Vfs,
    dir: &Path,
    listing: &mut scan::Listing,
) -> Result<(), StorageError> {
    let half = |f: &scan::SegmentFiles| vfs.exists(&f.data) != vfs.exists(&f.index);
    let n = listing
        .segments
        .iter()
        .take_while(|f| half(f))
        .count()
        .min(listing.segments.len().saturating_sub(1));
    if n == 0 {
        return Ok(());
    }
    for f in listing.segments.drain(..n) {
        for path in [&f.data, &f.index] {
            if vfs.exists(path) {
                tracing::warn!(file = %path.display(), "removing what an interrupted retention pass left");
                vfs.remove_file(path).at(path)?;
            }
        }
    }
    vfs.sync_dir(dir).at(dir)
}
