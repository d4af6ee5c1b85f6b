//! Reads of a log's committed entries: each goes to the segment that holds its offset, and on
//! across segments, without waiting for the writer.

use std::sync::Arc;

use super::{Inner, Log};
use crate::storage::error::StorageError;
use crate::storage::segment::{Entry, LogIdPart, Segment};

impl Log {
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
        self.read_visible(offset, max_count, max_bytes, true)
    }

    /// [`Log::read_from`] that returns nothing rather than an entry larger than `max_bytes`:
    /// for a reader sharing one budget among several logs, which must not go past it for a
    /// later one (a Kafka fetch's partitions after the first). Blocking.
    pub fn read_within(
        &self,
        offset: u64,
        max_count: usize,
        max_bytes: usize,
    ) -> Result<Vec<Entry>, StorageError> {
        self.read_visible(offset, max_count, max_bytes, false)
    }

    fn read_visible(
        &self,
        offset: u64,
        max_count: usize,
        max_bytes: usize,
        at_least_one: bool,
    ) -> Result<Vec<Entry>, StorageError> {
        let log_id = if self.inner.config.raft_header {
            LogIdPart::Strip
        } else {
            LogIdPart::Absent
        };
        self.read_below(
            self.next_offset(),
            offset,
            max_count,
            max_bytes,
            log_id,
            at_least_one,
        )
    }

    /// [`Log::read_from`] up to `committed` (the visible end, or a clustered log's durable end).
    /// `at_least_one`: the first entry is returned even when larger than `max_bytes` (never a
    /// later one, also across segments).
    pub(super) fn read_below(
        &self,
        committed: u64,
        offset: u64,
        max_count: usize,
        max_bytes: usize,
        log_id: LogIdPart,
        at_least_one: bool,
    ) -> Result<Vec<Entry>, StorageError> {
        let mut out = Vec::new();
        let mut at = offset;
        let mut budget = max_bytes;
        while at < committed && out.len() < max_count && budget > 0 {
            let Some(segment) = self.inner.segment_for(at) else {
                break;
            };
            let want = (max_count - out.len()).min((committed - at) as usize);
            let first = at_least_one && out.is_empty();
            let got = match segment.read_from(at, want, budget, log_id, first) {
                Ok(got) => got,
                // Retention deleted the segment under the read (its files went after it was
                // found): what was read before it is answered. A read that found nothing yet
                // fails, and its caller goes on from the first offset still stored (docs/topics-and-groups.md,
                // "Retention": behind the horizon), counting what it skipped.
                Err(_) if !out.is_empty() && self.first_offset() > at => break,
                Err(e) => return Err(e),
            };
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
}

impl Inner {
    pub(super) fn segment_for(&self, offset: u64) -> Option<Arc<Segment>> {
        let segments = self.segments.read();
        let i = segments.partition_point(|s| s.start() <= offset);
        i.checked_sub(1).map(|i| segments[i].clone())
    }
}
