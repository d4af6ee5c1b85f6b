//! A clustered partition's log at open (docs/cluster.md, "Clustered partitions on disk"): the
//! segment log has recovered its frames; this reads the sidecar, the vote and the purge point and
//! decides which indexes the log holds. The rule: the log is the longest run of consecutive
//! indexes, each a frame or a sidecar record, from the first after the purge point. Anything
//! past a gap is removed — a sidecar record written before the messages in front of it were
//! durable, which no acknowledgement covered (the append that wrote it had not reported flushed),
//! because each append writes its sidecar records before it queues its messages and reports
//! only when both are durable.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::files::{PURGED, Sidecar, VOTE, read_json};
use super::layout::{Entry, Layout};
use super::{PurgeFile, StoreError, Vote, log_id};
use crate::cluster::types::LogId;
use crate::storage::Log;
use crate::storage::vfs::Vfs;

/// What the segment log must still do before the store is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fix {
    /// Nothing.
    None,
    /// Remove the frames from this offset on (they follow a gap).
    Truncate(u64),
    /// Start over, empty, at this offset: the purge point says the log continues there, and it
    /// holds only what the purge point covers (a reset a power cut interrupted).
    Reset(u64),
}

/// What recovery found.
pub(super) struct Recovered {
    pub layout: Layout,
    pub vote: Option<Vote>,
    pub sidecar: Sidecar,
    pub fix: Fix,
}

/// The `(term, index)` of the frame at `offset`.
fn frame_at(log: &Log, offset: u64) -> Result<(u64, u64), StoreError> {
    let frame = log
        .read_raft_from(offset, 1, 1)?
        .pop()
        .filter(|f| f.offset == offset)
        .ok_or_else(|| StoreError::Inconsistent {
            dir: log.dir().to_owned(),
            reason: format!("no frame at offset {offset}"),
        })?;
    Ok(frame.entry.map_err(crate::storage::StorageError::from)?.0)
}

/// Reads what the files say and decides what the log holds; changes nothing but a torn sidecar
/// record and the sidecar records past a gap (the segment log's part is returned as a [`Fix`]).
/// Blocking.
pub(super) fn recover(
    log: &Log,
    vfs: &Arc<dyn Vfs>,
    raft_dir: &Path,
) -> Result<Recovered, StoreError> {
    let inconsistent = |reason: String| StoreError::Inconsistent {
        dir: log.dir().to_owned(),
        reason,
    };
    let vote: Option<Vote> = read_json(&**vfs, &raft_dir.join(VOTE))?;
    let purged =
        read_json::<PurgeFile>(&**vfs, &raft_dir.join(PURGED))?.map(|p| (p.log_id, p.next_offset));
    let (mut sidecar, entries) = Sidecar::load(vfs, raft_dir)?;
    let after_purge = |index: u64| purged.is_none_or(|(p, _)| index > p.index);
    let mut others: BTreeMap<u64, Entry> = entries
        .into_iter()
        .filter(|e| after_purge(e.log_id.index))
        .map(|e| (e.log_id.index, e))
        .collect();
    let durable = log.durable_end();
    let first_offset = log.first_offset();
    let last_frame = if durable > first_offset {
        Some(frame_at(log, durable - 1)?)
    } else {
        None
    };
    let mut fix = Fix::None;
    // The frames that belong to the log start at `from`, and at least the run of indexes at
    // `start`: the first entry after the purge point (the next index, unless the log started
    // later).
    let (from, after) = match purged {
        Some((p, n)) => {
            let only_purged = last_frame.is_none_or(|(_, index)| index <= p.index);
            if only_purged {
                if durable != n {
                    fix = Fix::Reset(n);
                }
            } else if n < first_offset || n >= durable || frame_at(log, n)?.1 <= p.index {
                return Err(inconsistent(format!(
                    "the purge point {p} says the next message is at offset {n}, but the log \
                     holds offsets {first_offset}..{durable} and entries after it"
                )));
            }
            (if only_purged { durable.max(n) } else { n }, p.index + 1)
        }
        None => (first_offset, 0),
    };
    let end = match fix {
        Fix::Reset(n) => n,
        _ => durable,
    };
    let first_frame = if from < end {
        Some(frame_at(log, from)?.1)
    } else {
        None
    };
    let start = match (first_frame, others.keys().next().copied()) {
        (Some(f), Some(o)) => f.min(o),
        (f, o) => f.or(o).unwrap_or(after),
    };
    let anchor = match purged {
        Some((_, n)) => Some((start, n)),
        None => first_frame.map(|f| (f, first_offset)),
    };
    // Walk the run: each index a sidecar record or the next frame.
    let walk = Walk {
        log,
        others: &others,
        from,
        end,
        start,
        fast: last_frame.filter(|_| from < end),
    };
    let (next, cut, last) = walk.run()?;
    if cut < end {
        tracing::warn!(dir = %log.dir().display(), offset = cut, frames = end - cut, "removing frames past a gap in the Raft log (never acknowledged)");
        fix = Fix::Truncate(cut);
    }
    let dropped = others.split_off(&next);
    if !dropped.is_empty() {
        tracing::warn!(dir = %log.dir().display(), index = next, records = dropped.len(), "removing sidecar entries past a gap in the Raft log (never acknowledged)");
        sidecar.cut_from(next)?;
    }
    let held = last.map(|last| (start, last));
    let end = cut.min(end);
    // Without a purge point, messages count from the first frame kept; with none kept, from the
    // end of the run.
    let anchor = match anchor {
        Some(a) if purged.is_some() || cut > from => a,
        _ => (next, end),
    };
    let layout = Layout::new(purged, anchor, others, held, end);
    Ok(Recovered {
        layout,
        vote,
        sidecar,
        fix,
    })
}

/// The walk over the indexes of the log from `start`: frames from offset `from` to `end`.
struct Walk<'a> {
    log: &'a Log,
    others: &'a BTreeMap<u64, Entry>,
    from: u64,
    end: u64,
    start: u64,
    /// The last frame's `(term, index)`, when there are frames: tried first, as the frames
    /// normally fill exactly the indexes the sidecar does not.
    fast: Option<(u64, u64)>,
}

impl Walk<'_> {
    /// The index after the run, the offset after its last frame, and its last log id.
    fn run(&self) -> Result<(u64, u64, Option<LogId>), StoreError> {
        let (mut index, mut offset, mut last) = match self.fast.filter(|&f| self.frames_fit(f)) {
            Some((term, b)) => (b + 1, self.end, Some(log_id(term, b))),
            None => self.walk_frames()?,
        };
        while let Some(e) = self.others.get(&index) {
            last = Some(e.log_id);
            index += 1;
        }
        if offset > self.end {
            offset = self.end;
        }
        Ok((index, offset, last))
    }

    /// Whether the frames are exactly the indexes from `start` to the last frame's that the
    /// sidecar does not hold: as many frames as such indexes, the first at the first of them
    /// (frames' indexes only grow, so that is all of them).
    fn frames_fit(&self, (_, last): (u64, u64)) -> bool {
        if last < self.start {
            return false;
        }
        let others = self.others.range(self.start..=last).count() as u64;
        let messages = last - self.start + 1 - others;
        if messages != self.end - self.from {
            return false;
        }
        let first_message = (self.start..=last).find(|i| !self.others.contains_key(i));
        first_message.is_some_and(|i| frame_at(self.log, self.from).is_ok_and(|(_, f)| f == i))
    }

    /// Reads the frames one by one (only when they do not fit at a glance).
    fn walk_frames(&self) -> Result<(u64, u64, Option<LogId>), StoreError> {
        let mut index = self.start;
        let mut offset = self.from;
        let mut last = None;
        'frames: while offset < self.end {
            let chunk = self.log.read_raft_from(offset, 4096, 8 << 20)?;
            if chunk.is_empty() {
                break;
            }
            for f in chunk {
                let ((term, i), _) = f.entry.map_err(crate::storage::StorageError::from)?;
                while let Some(e) = self.others.get(&index) {
                    last = Some(e.log_id);
                    index += 1;
                }
                if i != index {
                    break 'frames;
                }
                last = Some(log_id(term, i));
                index += 1;
                offset += 1;
            }
        }
        Ok((index, offset, last))
    }
}
