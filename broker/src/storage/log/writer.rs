//! The group-commit writer: appends queue up, the data stage writes and fsyncs their frames, the
//! index stage writes and fsyncs their index entries (the commit point) and answers them. See the
//! module documentation of [`super`] for how the two stages overlap.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;

use super::heal::Poison;
use super::{FlushMode, Inner};
use crate::storage::error::{IoContext, StorageError};
use crate::storage::segment::Segment;
use crate::storage::vfs::VfsFile;

pub(super) type Reply = oneshot::Sender<Result<u64, StorageError>>;

/// One append request: the frames of its payloads, already encoded (CRCs are computed on the
/// caller's thread, in parallel, not by the single writer).
pub(super) struct Pending {
    pub(super) frames: Vec<u8>,
    pub(super) lens: Vec<u32>,
    pub(super) reply: Reply,
}

/// A batch whose data is durable, waiting for its index.
pub(super) struct Staged {
    pub(super) pieces: Vec<Piece>,
    pub(super) next_offset: u64,
    pub(super) replies: Vec<(Reply, u64)>,
}

/// The part of a batch that landed in one segment.
pub(super) struct Piece {
    pub(super) segment: Arc<Segment>,
    /// The data file the piece was written through, held until its fsync.
    pub(super) data_file: Arc<dyn VfsFile>,
    pub(super) positions: Vec<u64>,
    pub(super) end: u64,
}

#[derive(Default)]
pub(super) struct Writer {
    pub(super) pending: VecDeque<Pending>,
    pub(super) data_running: bool,
    pub(super) indexing: VecDeque<Staged>,
    pub(super) index_running: bool,
    pub(super) poisoned: Option<Poison>,
}

/// Where the next entry goes. Only the data stage touches it.
pub(super) struct Tail {
    pub(super) segment: Arc<Segment>,
    pub(super) write_pos: u64,
    pub(super) next_offset: u64,
}

impl Inner {
    pub(super) fn submit(self: &Arc<Self>, pending: Pending) -> Result<(), StorageError> {
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
}
