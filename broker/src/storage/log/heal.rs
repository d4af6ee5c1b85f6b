//! Poison and heal: after a failed write or fsync the log refuses appends for a while, then cuts
//! back to its commit point in place, as a reopen would, and takes appends again.

use std::time::Instant;

use super::Inner;
use super::state::{Op, Poison, Reply, Tail};
use crate::storage::error::{IoContext, StorageError};
use crate::storage::scan;
use crate::storage::vfs::OpenMode;

impl Inner {
    pub(super) fn poisoned_error(&self, cause: &str) -> StorageError {
        StorageError::Poisoned {
            dir: self.dir.clone(),
            cause: cause.to_owned(),
        }
    }

    /// Cuts everything after the commit point, as recovery at open would, so that appends can
    /// resume without a restart. Runs on the writer.
    pub(super) fn heal(&self) -> Result<(), StorageError> {
        let mut tail = self.tail.lock();
        let committed = self.durable.load(std::sync::atomic::Ordering::Acquire);
        let last = {
            let mut segments = self.segments.write();
            // Segments that a failed batch rotated into hold nothing committed; the one before
            // them (sealed on disk by the failed batch, not yet for readers) becomes the tail
            // again. After a segment that is sealed for readers, an empty tail was not created by
            // a failed batch: it stays.
            while segments.len() > 1
                && segments.last().is_some_and(|s| s.committed_count() == 0)
                && !segments[segments.len() - 2].sealed()
            {
                segments.pop();
            }
            segments.last().expect("never empty").clone()
        };
        // The segments after the tail go first: cut first, the tail would end before the next
        // segment starts, a gap that stops the boot if a power cut comes in between.
        self.remove_segments_after(last.start())?;
        last.cut_uncommitted()?;
        *tail = Tail {
            write_pos: last.committed_bytes(),
            segment: last,
            next_offset: committed,
            index_synced: Instant::now(),
        };
        Ok(())
    }

    /// Removes the files of every segment after the one starting at `tail`: segments a failed
    /// batch rotated into, and any half-created by a rotation that failed between its two files.
    /// None holds a committed entry, but a power cut at any point must leave a log that opens,
    /// so each step leaves a shape recovery accepts (docs/storage.md, "Storage"):
    /// - newest first, each removal made durable before the next: what a cut leaves is always a
    ///   run of whole segments that follows the tail without a gap;
    /// - the index emptied and synced before either file goes: a segment the failed batch sealed
    ///   on its way holds synced index entries, and an index left without its data file, or a
    ///   data file without its index, would stop the boot. An empty index past the tail is an
    ///   empty segment, and its data, if the cut leaves it, is re-indexed like any tail's.
    ///
    /// A clustered log cut back or started over removes segments the same way, entries and all:
    /// what a cut leaves is then a prefix of the log (docs/cluster.md, "Clustered partitions on
    /// disk").
    pub(super) fn remove_segments_after(&self, tail: u64) -> Result<(), StorageError> {
        self.remove_segments_from(tail.saturating_add(1))
    }

    /// [`Inner::remove_segments_after`] for every segment that starts at `from` or later.
    pub(super) fn remove_segments_from(&self, from: u64) -> Result<(), StorageError> {
        let listing = scan::list_segments(&*self.vfs, &self.dir)?;
        for files in listing.segments.iter().rev().filter(|f| f.start >= from) {
            if self.vfs.exists(&files.index) {
                let index = self
                    .vfs
                    .open(&files.index, OpenMode::ReadWrite)
                    .at(&files.index)?;
                index.set_len(0).at(&files.index)?;
                index.sync_data().at(&files.index)?;
            }
            for path in [&files.data, &files.index] {
                if self.vfs.exists(path) {
                    self.vfs.remove_file(path).at(path)?;
                }
            }
            self.vfs.sync_dir(&self.dir).at(&self.dir)?;
        }
        Ok(())
    }

    /// After a failure that left every answered append durable (an index write or sync after the
    /// commit): the next batch first recovers in place, and new appends are refused until
    /// `retry_after`, but appends already queued are not failed: they wait for the recovery.
    pub(super) fn mark_for_healing(&self, error: &StorageError) {
        tracing::error!(dir = %self.dir.display(), %error, "index write failed after a commit; the log recovers in place before its next batch");
        let mut w = self.writer.lock();
        let retry_at = Instant::now() + self.config.retry_after;
        match &mut w.poisoned {
            Some(p) => p.retry_at = retry_at,
            None => {
                w.poisoned = Some(Poison {
                    cause: error.to_string(),
                    retry_at,
                })
            }
        }
    }

    /// Stops the log taking appends after `error`, failing `replies` and everything queued.
    pub(super) fn poison(&self, error: &StorageError, replies: impl IntoIterator<Item = Reply>) {
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
            // A close stays queued: it must still leave the layout exact.
            let (keep, queued): (Vec<_>, Vec<_>) = w
                .pending
                .drain(..)
                .partition(|op| matches!(op, Op::Close(_)));
            w.pending.extend(keep);
            (cause, queued)
        };
        self.fail(&cause, replies);
        for op in queued {
            op.fail(self.poisoned_error(&cause));
        }
    }

    pub(super) fn fail(&self, cause: &str, replies: impl IntoIterator<Item = Reply>) {
        for reply in replies {
            reply.send(Err(self.poisoned_error(cause)));
        }
    }
}
