//! What a clustered partition's log does besides a single-node log's appends and reads
//! (docs/cluster.md, "Clustered partitions on disk"). Its segments are the partition's Raft log:
//!
//! - each frame's payload starts with the entry's log id (term, index), covered by the frame's
//!   length and CRC, so recovery, the index and `mmmq inspect` read it as any frame;
//! - entries become *visible* — to [`Log::next_offset`], [`Log::read_from`], subscribers — only
//!   once the state machine applied them ([`Log::advance_visible`]) and they are durable here; the
//!   Raft log store reads everything durable ([`Log::read_raft_from`]);
//! - an uncommitted tail can be cut back ([`Log::truncate`]), never below what readers see, and
//!   the whole log can start over at a later offset ([`Log::reset`], a snapshot installed).
//!
//! Both of those go through the writer's queue, behind the appends queued before them, and remove
//! files the way recovery in place does (newest first, each step durable), so a power cut at any
//! step leaves a log that opens and holds a prefix of what it held.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::oneshot;

use super::state::{Op, Pending, Reply, Tail};
use super::{Inner, Log};
use crate::storage::error::{CorruptEntry, StorageError};
use crate::storage::frame::{self, HEADER_LEN, LOG_ID_LEN, MAX_PAYLOAD_LEN};
use crate::storage::segment::{LogIdPart, Segment};

/// One entry of a clustered log read back with its log id.
#[derive(Debug)]
pub struct RaftFrame {
    /// The entry's offset.
    pub offset: u64,
    /// Its `(term, index)` and message, or the isolated corruption that replaces them.
    pub entry: Result<((u64, u64), Bytes), CorruptEntry>,
}

/// An append to a clustered log on its way to the disk: resolves with its first offset once it
/// is durable. It was queued when it was made, so appends land in the order they were made,
/// whenever this is polled.
#[derive(Debug)]
pub struct Committing(oneshot::Receiver<Result<u64, StorageError>>);

impl Future for Committing {
    type Output = Result<u64, StorageError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(StorageError::Closed)))
    }
}

impl Log {
    /// Whether this is a clustered log (its frames carry log ids).
    pub fn clustered(&self) -> bool {
        self.inner.config.raft_header
    }

    fn refused(&self, reason: String) -> StorageError {
        StorageError::Refused {
            dir: self.inner.dir.clone(),
            reason,
        }
    }

    /// Appends without a log id are a single-node log's only.
    pub(super) fn refuse_if_clustered(&self) -> Result<(), StorageError> {
        if self.clustered() {
            return Err(self.refused(
                "a clustered partition's log takes appends through Raft only".to_owned(),
            ));
        }
        Ok(())
    }

    fn refuse_unless_clustered(&self, what: &str) -> Result<(), StorageError> {
        if !self.clustered() {
            return Err(self.refused(format!("{what} is for clustered logs only")));
        }
        Ok(())
    }

    /// Queues `(term, index, message)` entries at consecutive offsets, all in one commit, and
    /// returns at once: the [`Committing`] resolves with the first offset once they are durable
    /// (one fsync for the batch and whatever else is queued). Never led on the caller's thread.
    pub fn append_raft<P: AsRef<[u8]>>(
        &self,
        entries: &[(u64, u64, P)],
    ) -> Result<Committing, StorageError> {
        self.refuse_unless_clustered("an append with log ids")?;
        let (tx, rx) = oneshot::channel();
        if entries.is_empty() {
            let _ = tx.send(Ok(self.durable_end()));
            return Ok(Committing(rx));
        }
        let size = entries
            .iter()
            .map(|(_, _, p)| HEADER_LEN + LOG_ID_LEN + p.as_ref().len())
            .sum();
        let mut frames = Vec::with_capacity(size);
        let mut lens = Vec::with_capacity(entries.len());
        for (term, index, p) in entries {
            let p = p.as_ref();
            if p.len() + LOG_ID_LEN > MAX_PAYLOAD_LEN {
                return Err(StorageError::PayloadTooLarge {
                    len: p.len(),
                    max: MAX_PAYLOAD_LEN - LOG_ID_LEN,
                });
            }
            frame::encode_with_log_id_into(*term, *index, p, &mut frames);
            lens.push((HEADER_LEN + LOG_ID_LEN + p.len()) as u32);
        }
        let payload_bytes = frames.len() - lens.len() * HEADER_LEN;
        let op = Op::Append(Pending {
            frames,
            lens,
            reply: Reply::new(tx, None, payload_bytes),
        });
        self.inner.submit(op, false);
        Ok(Committing(rx))
    }

    /// The offset after the last durable entry. In a clustered log readers may see less
    /// ([`Log::next_offset`]); its Raft log store reads up to here.
    pub fn durable_end(&self) -> u64 {
        self.inner.durable.load(Ordering::Acquire)
    }

    /// A clustered log's state machine applied every entry below `end`: readers see them as soon
    /// as they are durable here (at once if they are; a leader may apply what a majority of
    /// other replicas holds before its own fsync returns). Never moves the visible end back.
    pub fn advance_visible(&self, end: u64) {
        let mut applied = self.inner.applied.lock();
        if end > *applied {
            *applied = end;
        }
        let visible = (*applied).min(self.durable_end());
        self.inner.committed.send_if_modified(|v| {
            let moved = visible > *v;
            if moved {
                *v = visible;
            }
            moved
        });
    }

    /// The end its state machine applied up to (the floor of [`Log::truncate`]).
    pub fn applied_end(&self) -> u64 {
        *self.inner.applied.lock()
    }

    /// Reads up to `max_count` durable entries of a clustered log from `offset`, with their log
    /// ids, visible or not, stopping early after about `max_bytes`. Blocking.
    pub fn read_raft_from(
        &self,
        offset: u64,
        max_count: usize,
        max_bytes: usize,
    ) -> Result<Vec<RaftFrame>, StorageError> {
        self.refuse_unless_clustered("a read of log ids")?;
        let entries = self.read_below(
            self.durable_end(),
            offset,
            max_count,
            max_bytes,
            LogIdPart::Keep,
            true,
        )?;
        Ok(entries
            .into_iter()
            .map(|e| RaftFrame {
                offset: e.offset,
                entry: e.payload.map(|p| {
                    let (id, _) = frame::split_log_id(&p).expect("checked by the read");
                    (id, Bytes::from(p).slice(LOG_ID_LEN..))
                }),
            })
            .collect())
    }

    /// Removes every entry from offset `end` on, behind the appends queued before it, and makes
    /// the cut durable (a clustered log's uncommitted tail that a new leader overwrites). Refused
    /// below what its state machine applied. A power cut part way leaves a prefix of the log as
    /// it was, never less than what is kept.
    pub async fn truncate(&self, end: u64) -> Result<(), StorageError> {
        self.refuse_unless_clustered("cutting back")?;
        let (done, rx) = oneshot::channel();
        self.inner.submit(Op::Truncate(end, done), false);
        rx.await.map_err(|_| StorageError::Closed)?
    }

    /// Removes every entry and starts over, empty, at offset `next` (a clustered log that
    /// installed a snapshot: the messages before `next` are elsewhere). Visible and durable ends
    /// both become `next`. A power cut part way leaves a prefix of the old log or an empty one,
    /// which the Raft log store completes at its next open.
    pub async fn reset(&self, next: u64) -> Result<(), StorageError> {
        self.refuse_unless_clustered("starting over")?;
        let (done, rx) = oneshot::channel();
        self.inner.submit(Op::Reset(next, done), false);
        rx.await.map_err(|_| StorageError::Closed)?
    }
}

impl Inner {
    /// Publishes a new durable end to readers: all of it in a single-node log; in a clustered
    /// log, what the state machine applied of it.
    pub(super) fn publish(&self, durable: u64) {
        if !self.config.raft_header {
            self.committed.send_replace(durable);
            return;
        }
        let applied = self.applied.lock();
        let visible = (*applied).min(durable);
        self.committed.send_if_modified(|v| {
            let moved = visible > *v;
            if moved {
                *v = visible;
            }
            moved
        });
    }

    fn refused(&self, reason: String) -> StorageError {
        StorageError::Refused {
            dir: self.dir.clone(),
            reason,
        }
    }

    /// Cuts the log back to the entries before `end`. Runs on the writer. Memory first (readers
    /// and the next append see the cut log at once), then the files: segments after the one that
    /// keeps `end` go newest first, then that one's index and then its data are cut, each step
    /// durable, as [`Inner::heal`] does; a failure poisons the log and the heal finishes the cut.
    pub(super) fn truncate(&self, end: u64) -> Result<(), StorageError> {
        let mut tail = self.tail.lock();
        let durable = tail.next_offset;
        if end >= durable {
            if end == durable {
                return Ok(());
            }
            return Err(self.refused(format!(
                "cannot cut at offset {end}: the log ends at {durable}"
            )));
        }
        let applied = *self.applied.lock();
        if end < applied {
            return Err(self.refused(format!(
                "cannot cut at offset {end}: entries up to {applied} are applied"
            )));
        }
        let keep = {
            let segments = self.segments.read();
            let i = segments.partition_point(|s| s.start() <= end);
            let Some(i) = i.checked_sub(1) else {
                return Err(self.refused(format!(
                    "cannot cut at offset {end}: the log starts at {}",
                    segments[0].start()
                )));
            };
            segments[i].clone()
        };
        keep.forget_after(end - keep.start())?;
        self.segments.write().retain(|s| s.start() <= keep.start());
        self.durable.store(end, Ordering::Release);
        *tail = Tail {
            write_pos: keep.committed_bytes(),
            segment: keep.clone(),
            next_offset: end,
            index_synced: Instant::now(),
        };
        self.remove_segments_after(keep.start())?;
        keep.cut_uncommitted()
    }

    /// Removes every segment, newest first, and creates an empty one at `next`. Runs on the
    /// writer.
    pub(super) fn reset(&self, next: u64) -> Result<(), StorageError> {
        let mut tail = self.tail.lock();
        self.remove_segments_from(0)?;
        let fresh = Arc::new(Segment::create(
            &self.vfs,
            &self.config.files,
            &self.dir,
            next,
        )?);
        *self.segments.write() = vec![fresh.clone()];
        self.durable.store(next, Ordering::Release);
        {
            let mut applied = self.applied.lock();
            *applied = next;
            self.committed.send_replace(next);
        }
        *tail = Tail {
            segment: fresh,
            write_pos: 0,
            next_offset: next,
            index_synced: Instant::now(),
        };
        Ok(())
    }
}
