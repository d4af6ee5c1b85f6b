//! The group-commit writer: appends queue up; one stage takes everything queued, writes its frames
//! to the tail's data file, fsyncs it — the commit point — makes the entries visible and answers;
//! then writes their index entries without syncing. See the module documentation of [`super`].

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::state::{Op, Pending, Writer};
use super::{FlushMode, Inner};
use crate::storage::error::{IoContext, StorageError};
use crate::storage::segment::Segment;

/// The part of a batch that landed in one segment.
struct Piece {
    segment: Arc<Segment>,
    positions: Vec<u64>,
    end: u64,
    /// The batch went on into a new segment: this one was sealed on the way.
    sealed: bool,
}

/// An idle log's next append leads its commit on its own thread when its commits lately held at
/// most this many appends on average (see the module documentation of [`super`]).
pub const LEAD_MAX_BATCH: usize = 2;

impl Inner {
    /// Queues `op`. When the log was idle, someone must run the writer: with `may_lead` the
    /// caller does (it gets `true` and must call [`Inner::lead`] at once), else a blocking thread
    /// is started.
    pub(super) fn submit(self: &Arc<Self>, op: Op, may_lead: bool) -> bool {
        let mut w = self.writer.lock();
        if w.closed {
            drop(w);
            op.fail(StorageError::Closed);
            return false;
        }
        if let Op::Append(_) = op
            && let Some(p) = &w.poisoned
            && Instant::now() < p.retry_at
        {
            let error = self.poisoned_error(&p.cause);
            drop(w);
            op.fail(error);
            return false;
        }
        if let Op::Close(_) = op {
            w.closed = true;
        }
        w.pending.push_back(op);
        if w.running {
            return false;
        }
        w.running = true;
        if may_lead && w.batch_x16 <= LEAD_MAX_BATCH * 16 {
            return true;
        }
        drop(w);
        self.hand_on();
        false
    }

    /// Runs the writer on a blocking thread until the queue is empty.
    fn hand_on(self: &Arc<Self>) {
        let this = self.clone();
        self.runtime.spawn_blocking(move || this.run());
    }

    /// The commit led by the append that found the log idle, on its own thread (the caller is in
    /// `block_in_place`): one batch — its own append and whatever queued meanwhile — then, if
    /// more queued during that fsync, the rest goes to a blocking thread, so that this caller
    /// answers after one fsync and no request waits behind two. An idle log's append thus costs
    /// no hand-off to another thread and back (docs/storage.md, "Storage", group commit).
    pub(super) fn lead(self: &Arc<Self>) {
        let Some(work) = self.next_work() else {
            return;
        };
        #[cfg(test)]
        self.led.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.step(work);
        let mut w = self.writer.lock();
        if w.pending.is_empty() {
            w.running = false;
        } else {
            drop(w);
            self.hand_on();
        }
    }

    /// Takes the next thing to do: queued appends up to the batch size (always at least one), or
    /// the roll or close at the front of the queue.
    fn take(&self, w: &mut Writer) -> Option<Result<Vec<Pending>, Op>> {
        let limit = match self.config.flush {
            FlushMode::PerAppend => 1,
            _ => usize::MAX,
        };
        let mut bytes = 0;
        let mut batch = Vec::new();
        while let Some(op) = w.pending.front() {
            let Op::Append(p) = op else {
                if batch.is_empty() {
                    return w.pending.pop_front().map(Err);
                }
                break;
            };
            if !batch.is_empty()
                && (batch.len() >= limit || bytes + p.frames.len() > self.config.max_batch_bytes)
            {
                break;
            }
            bytes += p.frames.len();
            let Some(Op::Append(p)) = w.pending.pop_front() else {
                unreachable!("front is an append")
            };
            batch.push(p);
        }
        if !batch.is_empty() {
            w.batch_x16 = (w.batch_x16 * 7 + batch.len().min(1 << 20) * 16) / 8;
        }
        (!batch.is_empty()).then_some(Ok(batch))
    }

    /// The writer: runs while there is work, on a blocking thread.
    fn run(self: Arc<Self>) {
        while let Some(work) = self.next_work() {
            self.step(work);
        }
    }

    /// The next thing to do and whether the log must heal first; `None` (and the writer marked
    /// not running) when the queue is empty.
    fn next_work(&self) -> Option<(Result<Vec<Pending>, Op>, bool)> {
        let mut w = self.writer.lock();
        match self.take(&mut w) {
            None => {
                w.running = false;
                None
            }
            Some(work) => Some((work, w.poisoned.is_some())),
        }
    }

    /// Does one thing the queue asked for: heals first if an earlier failure poisoned the log.
    fn step(&self, (work, heal): (Result<Vec<Pending>, Op>, bool)) {
        if heal {
            if let Err(e) = self.heal() {
                match work {
                    Ok(batch) => self.poison(&e, batch.into_iter().map(|p| p.reply)),
                    Err(op) => {
                        self.poison(&e, []);
                        op.fail(self.poisoned_error(&e.to_string()));
                    }
                }
                return;
            }
            let cause = self.writer.lock().poisoned.take().map(|p| p.cause);
            tracing::info!(dir = %self.dir.display(), cause = ?cause, "log recovered in place after a write failure; taking appends again");
        }
        match work {
            Ok(batch) => self.commit(batch),
            Err(Op::Roll(done)) => {
                let result = self.roll();
                if let Err(e) = &result {
                    self.poison(e, []);
                }
                let _ = done.send(result);
            }
            Err(Op::Close(done)) => {
                let _ = done.send(self.tail.lock().segment.close());
            }
            Err(Op::Truncate(end, done)) => {
                let result = self.truncate(end);
                if let Err(e) = &result
                    && !matches!(e, StorageError::Refused { .. })
                {
                    self.poison(e, []);
                }
                let _ = done.send(result);
            }
            Err(Op::Reset(next, done)) => {
                let result = self.reset(next);
                if let Err(e) = &result {
                    self.poison(e, []);
                }
                let _ = done.send(result);
            }
            Err(Op::Append(_)) => unreachable!("appends come as a batch"),
        }
    }

    /// Writes a batch, makes it durable, publishes and answers it, then indexes it.
    fn commit(&self, batch: Vec<Pending>) {
        let pieces = match self.write_data(&batch) {
            Ok(pieces) => pieces,
            Err(e) => return self.poison(&e, batch.into_iter().map(|p| p.reply)),
        };
        let mut tail = self.tail.lock();
        for piece in &pieces {
            piece.segment.publish(&piece.positions, piece.end);
            if piece.sealed {
                piece.segment.publish_sealed();
            }
        }
        let next = tail.next_offset;
        let before = self.durable.swap(next, Ordering::AcqRel);
        self.publish(next);
        if let Some(observe) = &self.config.on_commit {
            observe(next - before);
        }
        // The index entries are written (not synced) before the answers go out: a write to the
        // page cache costs microseconds, and an answered append then has no work left behind it
        // but the occasional index sync.
        let indexed = tail.segment.index_lazily();
        let mut first = before;
        for p in batch {
            p.reply.send(Ok(first));
            first += p.lens.len() as u64;
        }
        let now = Instant::now();
        let sync = self.config.flush == FlushMode::PerAppend
            || (self.config.flush == FlushMode::GroupCommit
                && now.duration_since(tail.index_synced) >= self.config.index_sync_interval);
        let indexed = indexed.and_then(|()| {
            if sync {
                tail.index_synced = now;
                tail.segment.sync_index()
            } else {
                Ok(())
            }
        });
        drop(tail);
        if let Err(e) = indexed {
            self.mark_for_healing(&e);
        }
    }

    /// Writes the batch's frames to the data file(s), sealing and rotating as needed, and makes
    /// them durable: the data fsync is the commit point.
    fn write_data(&self, batch: &[Pending]) -> Result<Vec<Piece>, StorageError> {
        let mut tail = self.tail.lock();
        let max = self.config.segment_max_bytes;
        let total: usize = batch.iter().map(|p| p.frames.len()).sum();
        let mut pieces = Vec::new();
        let mut segment = tail.segment.clone();
        let mut base = tail.write_pos;
        let mut buf = Vec::with_capacity(total);
        let mut positions = Vec::new();
        let mut offset = tail.next_offset;
        for p in batch {
            let mut at = 0usize;
            for &len in &p.lens {
                let here = base + buf.len() as u64;
                if here > 0 && here >= max {
                    if !buf.is_empty() {
                        segment.write_data(&buf, base, 0)?;
                    }
                    // The next segment is created only once this one is complete and durable.
                    segment.seal_durably(&positions, here)?;
                    pieces.push(Piece {
                        segment: segment.clone(),
                        positions: std::mem::take(&mut positions),
                        end: here,
                        sealed: true,
                    });
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
        let end = base + buf.len() as u64;
        if !positions.is_empty() {
            let preallocate = self.config.preallocate_bytes.min(max);
            let data_file = segment.write_data(&buf, base, preallocate)?;
            if self.config.flush != FlushMode::NoSync {
                data_file.sync_data().at(&segment.files.data)?;
            }
            pieces.push(Piece {
                segment: segment.clone(),
                positions,
                end,
                sealed: false,
            });
        }
        tail.write_pos = end;
        tail.segment = segment;
        tail.next_offset = offset;
        Ok(pieces)
    }

    /// Seals the tail now and starts a new, empty one, so that retention can remove the old one.
    fn roll(&self) -> Result<(), StorageError> {
        let mut tail = self.tail.lock();
        if tail.segment.committed_count() == 0 {
            return Ok(());
        }
        tail.segment.seal_durably(&[], tail.write_pos)?;
        let next = Arc::new(Segment::create(
            &self.vfs,
            &self.config.files,
            &self.dir,
            tail.next_offset,
        )?);
        self.segments.write().push(next.clone());
        tail.segment.publish_sealed();
        tail.segment = next;
        tail.write_pos = 0;
        Ok(())
    }
}
