//! What a member's poll reads from the partitions it owns (docs/topics-and-groups.md, "Consumer groups").

use std::sync::Arc;

use mmmq_core::{Envelope, StoredMessage};

use super::{GroupError, Key};
use crate::cluster::node::Cluster;
use crate::topics::Partition;

/// Reads up to `max` messages over the owned partitions, from each one's position: in rounds
/// that share what is left of `max` over the partitions that still have messages, so that one
/// busy partition neither starves the others nor is held to their share when they are idle.
#[allow(clippy::type_complexity)]
pub(super) async fn read_owned(
    owned: &[(Key, Arc<Partition>, u64)],
    max: usize,
    cluster: Option<&Cluster>,
) -> Result<(Vec<Envelope>, Vec<(Key, u64)>), GroupError> {
    let mut out = Vec::new();
    // Where each partition is read next, while it may have more; and where its reading ended.
    let mut next: Vec<Option<u64>> = owned.iter().map(|(_, _, at)| Some(*at)).collect();
    let mut ends: Vec<Option<u64>> = vec![None; owned.len()];
    // Rounds: what is left of `max` shared over the partitions that still have messages, so one
    // busy partition fills what idle ones leave (docs/topics-and-groups.md, "Consumer groups").
    while out.len() < max {
        let active = next.iter().filter(|n| n.is_some()).count();
        if active == 0 {
            break;
        }
        let per = ((max - out.len()) / active).max(1);
        for (i, (key, p, _)) in owned.iter().enumerate() {
            let Some(from) = next[i] else { continue };
            if out.len() >= max {
                break;
            }
            let want = per.min(max - out.len());
            // A cluster member reads a partition it holds no replica of through its leader
            // (`super::cluster`).
            if let Some(c) = cluster
                && !c.replicates(key.0.as_str(), key.2)
            {
                // A partition that cannot be read now (its leader is being elected, its only
                // replica is down) answers nothing this time; the member's other partitions
                // are not held up by it.
                let (envelopes, after) = match super::cluster::read_remote(c, key, from, want).await
                {
                    Ok(read) => read,
                    Err(e) => {
                        tracing::debug!(topic = %key.0, partition = key.2, error = %e, "a group's partition cannot be read through its leader now");
                        next[i] = None;
                        continue;
                    }
                };
                // Where the pull says to go on: past what it left out, too.
                let end = envelopes
                    .last()
                    .map(|last| last.offset + 1)
                    .max(after.filter(|n| *n > from));
                (next[i], ends[i]) = read_to_end(end, envelopes.len() >= want, ends[i]);
                out.extend(envelopes);
                continue;
            }
            let log = p.log.clone();
            let read = tokio::task::spawn_blocking(move || log.read_from(from, want, 8 << 20))
                .await
                .expect("read task panicked");
            let entries = match read {
                Ok(entries) => entries,
                // Retention deleted what was being read: nothing from this partition now; the
                // next poll goes on from the first offset still stored and counts the skip.
                Err(_) if p.log.first_offset() > from => {
                    next[i] = None;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let end = entries.last().map(|last| last.offset + 1);
            (next[i], ends[i]) = read_to_end(end, entries.len() >= want, ends[i]);
            // A corrupt entry is left out (the gap in offsets shows it), and passed.
            for e in entries {
                let Ok(bytes) = e.payload else { continue };
                if let Ok(m) = StoredMessage::from_payload(&bytes) {
                    out.push(m.into_envelope(key.0.clone(), key.1, key.2, e.offset));
                }
            }
        }
    }
    let read_to = owned
        .iter()
        .zip(ends)
        .filter_map(|((key, _, _), end)| Some((key.clone(), end?)))
        .collect();
    Ok((out, read_to))
}

/// Where a partition is read next in this poll and where its reading ended, after a read that
/// ended before `end` (nothing read: `None`) and returned all it was asked for (`full`): fewer
/// than asked is the partition's end (or its byte cap) for this poll.
fn read_to_end(end: Option<u64>, full: bool, ended: Option<u64>) -> (Option<u64>, Option<u64>) {
    match end {
        Some(end) => (full.then_some(end), Some(end)),
        None => (None, ended),
    }
}
