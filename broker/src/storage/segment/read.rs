//! The read side of a segment: positions from memory (the tail) or from the index file (sealed),
//! then one `pread` of the data for a run of entries.

use std::sync::atomic::Ordering;

use super::{Entry, Segment};
use crate::storage::error::{CorruptEntry, IoContext, StorageError};
use crate::storage::frame::{self, FrameFault, HEADER_LEN, MAX_PAYLOAD_LEN};
use crate::storage::index;

/// What a read does with the log id a clustered log's payloads start with (docs/cluster.md,
/// "Clustered partitions on disk").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogIdPart {
    /// A single-node log: payloads have none.
    Absent,
    /// Leave it out: what the log's readers above storage get.
    Strip,
    /// Keep it in front of the message: what the Raft log store reads.
    Keep,
}

impl Segment {
    /// The positions of entries `i..i + n` and where the last of them ends (`None` if `i` is not
    /// committed), from memory for the tail and from the index file for a sealed segment.
    pub(super) fn spans_of(&self, i: u64, n: u64) -> Result<Option<(Vec<u64>, u64)>, StorageError> {
        let committed = self.committed.read();
        if i >= committed.count {
            return Ok(None);
        }
        let n = n.min(committed.count - i);
        let end_all = self.committed_end.load(Ordering::Acquire);
        if !committed.sealed {
            let k = i as usize;
            let positions = committed.positions[k..k + n as usize].to_vec();
            let end = committed.positions.get(k + n as usize).copied();
            return Ok(Some((positions, end.unwrap_or(end_all))));
        }
        // One more entry than asked, where there is one, says where the last asked ends.
        let with_next = (n + 1).min(committed.count - i);
        drop(committed);
        let mut raw = vec![0u8; (with_next * index::ENTRY_LEN) as usize];
        self.index
            .get()
            .at(&self.files.index)?
            .read_exact_at(&mut raw, index::entry_pos(i))
            .at(&self.files.index)?;
        let mut positions = index::decode(&raw);
        let end = if with_next > n {
            positions.pop().expect("read n + 1")
        } else {
            end_all
        };
        Ok(Some((positions, end)))
    }

    /// Reads up to `max_count` committed entries from `offset`, stopping early once `max_bytes` of
    /// payload are gathered (with `at_least_one`, always returning at least one entry when there
    /// is one, however large). One `pread` of the data covers the whole run. `log_id` says what
    /// becomes of the log id a clustered log's payloads start with.
    pub fn read_from(
        &self,
        offset: u64,
        max_count: usize,
        max_bytes: usize,
        log_id: LogIdPart,
        at_least_one: bool,
    ) -> Result<Vec<Entry>, StorageError> {
        let Some(i) = offset.checked_sub(self.start()) else {
            return Ok(Vec::new());
        };
        let Some((positions, end_all)) = self.spans_of(i, max_count as u64)? else {
            return Ok(Vec::new());
        };
        let mut spans = Vec::with_capacity(positions.len());
        let mut total = 0usize;
        for (j, &start) in positions.iter().enumerate() {
            let end = positions.get(j + 1).copied().unwrap_or(end_all);
            let len = end.saturating_sub(start) as usize;
            if (!spans.is_empty() || !at_least_one) && total + len > max_bytes {
                break;
            }
            total += len;
            spans.push((start, end.max(start)));
        }
        let Some(&(lo, _)) = spans.first() else {
            return Ok(Vec::new());
        };
        let hi = spans.last().map(|s| s.1).unwrap_or(lo);
        let mut buf = vec![0u8; (hi.saturating_sub(lo)) as usize];
        self.data
            .get()
            .at(&self.files.data)?
            .read_exact_at(&mut buf, lo)
            .at(&self.files.data)?;
        Ok(spans
            .iter()
            .enumerate()
            .map(|(k, &(start, end))| {
                let offset = offset + k as u64;
                let bytes = buf
                    .get((start - lo) as usize..(end - lo) as usize)
                    .unwrap_or(&[]);
                Entry {
                    offset,
                    payload: self.decode(bytes, offset, start, log_id),
                }
            })
            .collect())
    }

    fn decode(
        &self,
        bytes: &[u8],
        offset: u64,
        position: u64,
        log_id: LogIdPart,
    ) -> Result<Vec<u8>, CorruptEntry> {
        let corrupt = |fault| CorruptEntry {
            path: self.files.data.clone(),
            offset,
            position,
            fault,
        };
        if let Some(h) = frame::Header::parse(bytes)
            && h.len as usize > MAX_PAYLOAD_LEN
        {
            return Err(corrupt(FrameFault::Truncated {
                declared: h.len,
                available: bytes.len().saturating_sub(HEADER_LEN),
            }));
        }
        let payload = frame::decode(bytes).map_err(corrupt)?;
        if log_id == LogIdPart::Absent {
            return Ok(payload.to_vec());
        }
        if payload.len() < frame::LOG_ID_LEN {
            return Err(corrupt(FrameFault::MissingLogId {
                len: payload.len() as u32,
            }));
        }
        Ok(match log_id {
            LogIdPart::Strip => payload[frame::LOG_ID_LEN..].to_vec(),
            _ => payload.to_vec(),
        })
    }
}
