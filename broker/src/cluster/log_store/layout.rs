//! Where each Raft index of a partition's log is (docs/cluster.md, "Clustered partitions on
//! disk"): a message entry is a frame of the segment log at an offset, every other entry (blank,
//! membership) a record of the sidecar. Offsets are dense — only messages take one — so an
//! index's offset follows from one anchor and the few other entries after it, all in memory.
//! Pure: no files, so each rule is tested on its own.

use std::collections::BTreeMap;

use crate::cluster::types::LogId;

/// An entry of the log, as openraft hands it over.
pub(crate) type Entry = openraft::alias::EntryOf<crate::cluster::types::Raft>;

/// Where one index of a read is.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Slot {
    /// A message, in the frame at this offset.
    Message(u64),
    /// An entry the sidecar holds.
    Other(Entry),
}

/// The indexes a partition's log holds and where each is.
#[derive(Debug, Clone, Default)]
pub(super) struct Layout {
    /// The last purged log id and the offset the first message after it takes (persisted with
    /// it: the entries before are gone, so nothing else says).
    purged: Option<(LogId, u64)>,
    /// `(a, o)`: a message at index `i ≥ a` has offset `o + (i − a) −` the other entries in
    /// `[a, i)`. The first message's index and offset, or the purge point's next index and
    /// offset, or (no message) the next index and the log's end.
    anchor: (u64, u64),
    /// The entries that carry no message, after the purge point, by index.
    others: BTreeMap<u64, Entry>,
    /// The first index held and the last log id, while any entry is held.
    held: Option<(u64, LogId)>,
    /// The offset the next message takes: the end of the log with what is queued.
    end: u64,
}

/// Why entries cannot join the log where they are offered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an entry at index {got} cannot follow the log, which expects index {expected}")]
pub struct NotNext {
    /// The index offered.
    pub got: u64,
    /// The index the log expects.
    pub expected: u64,
}

impl Layout {
    /// The layout of a log whose purge point, anchor, other entries, last log id and end
    /// recovery found.
    pub(super) fn new(
        purged: Option<(LogId, u64)>,
        anchor: (u64, u64),
        others: BTreeMap<u64, Entry>,
        held: Option<(u64, LogId)>,
        end: u64,
    ) -> Self {
        Self {
            purged,
            anchor,
            others,
            held,
            end,
        }
    }

    /// An empty log whose next message takes offset `end`.
    #[cfg(test)]
    pub(super) fn empty(end: u64) -> Self {
        Self {
            anchor: (0, end),
            end,
            ..Self::default()
        }
    }

    pub(super) fn purged(&self) -> Option<(LogId, u64)> {
        self.purged
    }

    /// The last log id: of the last entry held, else the purge point.
    pub(super) fn last_log_id(&self) -> Option<LogId> {
        self.held.map(|(_, last)| last).or(self.purged.map(|p| p.0))
    }

    /// The first index held, while any is.
    #[cfg(test)]
    pub(super) fn first_index(&self) -> Option<u64> {
        self.held.map(|(first, _)| first)
    }

    /// The offset the next message takes.
    pub(super) fn end(&self) -> u64 {
        self.end
    }

    /// The index the next entry must have (`None`: an empty log takes any).
    fn next_index(&self) -> Option<u64> {
        self.last_log_id().map(|l| l.index + 1)
    }

    /// The entry the sidecar holds at `index`, if it holds one.
    #[cfg(test)]
    pub(super) fn other(&self, index: u64) -> Option<&Entry> {
        self.others.get(&index)
    }

    /// The offset of the message at `index`, if the log holds a message there.
    pub(super) fn message_offset(&self, index: u64) -> Option<u64> {
        let (first, last) = self.held?;
        (first <= index && index <= last.index && !self.others.contains_key(&index))
            .then(|| self.offset_at(index))
    }

    /// The offset a message at `index` has (or would have, as the next entry): `index` at most
    /// the next index. Entries before the anchor are gone, so their offsets are the anchor's.
    pub(super) fn offset_at(&self, index: u64) -> u64 {
        if self.held.is_none() {
            return self.end;
        }
        let (a, o) = self.anchor;
        if index <= a {
            return o;
        }
        let index = self.next_index().map_or(index, |n| index.min(n));
        o + (index - a) - self.others.range(a..index).count() as u64
    }

    /// Takes `entries` after the last one (`is_message` says which are messages: each takes the
    /// next offset). On `Err` nothing changed.
    pub(super) fn append(
        &mut self,
        entries: &[Entry],
        is_message: impl Fn(&Entry) -> bool,
    ) -> Result<(), NotNext> {
        let mut expected = self.next_index();
        for e in entries {
            let got = e.log_id.index;
            if let Some(expected) = expected.filter(|&x| x != got) {
                return Err(NotNext { got, expected });
            }
            expected = Some(got + 1);
        }
        let Some(first) = entries.first() else {
            return Ok(());
        };
        if self.held.is_none() && self.purged.is_none() {
            // The first entry of a log that never held one: messages count from it.
            self.anchor = (first.log_id.index, self.end);
        }
        for e in entries {
            if is_message(e) {
                self.end += 1;
            } else {
                self.others.insert(e.log_id.index, e.clone());
            }
        }
        let start = self.held.map_or(first.log_id.index, |(f, _)| f);
        self.held = Some((start, entries[entries.len() - 1].log_id));
        Ok(())
    }

    /// Drops every entry after `last` (all, for `None`): returns the offset the log's messages
    /// end at now.
    pub(super) fn truncate_after(&mut self, last: Option<LogId>) -> u64 {
        let keep = last.map_or(0, |l| l.index + 1);
        if self.next_index().is_none_or(|next| keep >= next) {
            return self.end;
        }
        let end = self.offset_at(keep);
        self.others.split_off(&keep);
        self.end = end.min(self.end);
        self.held = match self.held {
            Some((first, _)) if keep > first => Some((first, last.expect("keep > first ≥ 0"))),
            _ => None,
        };
        if self.held.is_none() && self.purged.is_none() {
            self.anchor = (keep, self.end);
        }
        self.end
    }

    /// Marks every entry up to `upto` purged: returns the purge point and the offset of the first
    /// message after it. Entries past the last one held are purged too (the log is then empty
    /// and continues after `upto`).
    /// `None` when the purge point is already there or later.
    pub(super) fn purge(&mut self, upto: LogId) -> Option<(LogId, u64)> {
        if self.purged.is_some_and(|(p, _)| p.index >= upto.index) {
            return None;
        }
        let next = upto.index + 1;
        let offset = self.offset_at(next);
        self.others = self.others.split_off(&next);
        // A log that starts after the purge point keeps its start (nothing between takes an
        // offset).
        self.held = match self.held {
            Some((first, last)) if last.index >= next => Some((first.max(next), last)),
            _ => None,
        };
        self.anchor = (self.held.map_or(next, |(first, _)| first), offset);
        self.purged = Some((upto, offset));
        Some((upto, offset))
    }

    /// The last membership entry at or before `index` that the log holds (after its purge
    /// point): what a snapshot at `index` records as its membership, if the log holds it.
    pub(super) fn membership_upto(&self, index: u64) -> Option<&Entry> {
        self.others
            .range(..=index)
            .rev()
            .map(|(_, e)| e)
            .find(|e| matches!(e.payload, openraft::EntryPayload::Membership(_)))
    }

    /// Where each index of `[from, to)` (clamped to what is held) is, in order.
    pub(super) fn plan(&self, from: u64, to: u64) -> Vec<(u64, Slot)> {
        let Some((first, last)) = self.held else {
            return Vec::new();
        };
        let from = from.max(first);
        let to = to.min(last.index + 1);
        if from >= to {
            return Vec::new();
        }
        let mut offset = self.offset_at(from);
        let mut out = Vec::with_capacity((to - from) as usize);
        for i in from..to {
            match self.others.get(&i) {
                Some(e) => out.push((i, Slot::Other(e.clone()))),
                None => {
                    out.push((i, Slot::Message(offset)));
                    offset += 1;
                }
            }
        }
        out
    }

    /// Starts over, empty, after a snapshot's last log id, the next message at `next_offset`.
    pub(super) fn reset(&mut self, last: LogId, next_offset: u64) {
        *self = Self {
            purged: Some((last, next_offset)),
            anchor: (last.index + 1, next_offset),
            end: next_offset,
            ..Self::default()
        };
    }

    /// Whether the log holds `id` (an entry at its index with its term).
    pub(super) fn holds(&self, id: &LogId, term_of_message: impl Fn(u64) -> Option<u64>) -> bool {
        let Some((first, last)) = self.held else {
            return false;
        };
        if id.index < first || id.index > last.index {
            return false;
        }
        match self.others.get(&id.index) {
            Some(e) => e.log_id == *id,
            None => term_of_message(id.index) == Some(id.leader_id.term),
        }
    }
}

#[cfg(test)]
mod tests {
    use openraft::entry::RaftEntry;

    use super::*;
    use crate::cluster::log_store::log_id as id;
    use crate::cluster::types::Command;

    fn msg(term: u64, index: u64) -> Entry {
        Entry::new_normal(
            id(term, index),
            Command::Message(bytes::Bytes::from_static(b"{}")),
        )
    }

    fn blank(term: u64, index: u64) -> Entry {
        Entry::new_blank(id(term, index))
    }

    fn is_message(e: &Entry) -> bool {
        matches!(e.payload, openraft::EntryPayload::Normal(_))
    }

    fn offsets(l: &Layout, from: u64, to: u64) -> Vec<(u64, Option<u64>)> {
        l.plan(from, to)
            .into_iter()
            .map(|(i, s)| {
                (
                    i,
                    match s {
                        Slot::Message(o) => Some(o),
                        Slot::Other(_) => None,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn messages_take_dense_offsets_and_other_entries_none() {
        let mut l = Layout::empty(0);
        l.append(
            &[blank(1, 1), msg(1, 2), msg(1, 3), blank(2, 4), msg(2, 5)],
            is_message,
        )
        .unwrap();
        assert_eq!(
            offsets(&l, 0, 10),
            [
                (1, None),
                (2, Some(0)),
                (3, Some(1)),
                (4, None),
                (5, Some(2))
            ]
        );
        assert_eq!(l.end(), 3);
        assert_eq!(l.offset_at(6), 3, "the next message");
        assert_eq!(
            l.offset_at(60),
            3,
            "past the next index: nothing between takes one"
        );
        assert_eq!(l.last_log_id(), Some(id(2, 5)));
        let e = l.append(&[msg(2, 7)], is_message).unwrap_err();
        assert_eq!(
            e,
            NotNext {
                got: 7,
                expected: 6
            }
        );
        assert_eq!(l.end(), 3, "nothing changed");
    }

    #[test]
    fn a_cut_gives_back_the_offsets_of_what_it_removes() {
        let mut l = Layout::empty(10);
        l.append(
            &[msg(1, 0), msg(1, 1), blank(2, 2), msg(2, 3), msg(2, 4)],
            is_message,
        )
        .unwrap();
        assert_eq!(l.truncate_after(Some(id(2, 2))), 12);
        assert_eq!(l.last_log_id(), Some(id(2, 2)));
        l.append(&[msg(3, 3), blank(3, 4), msg(3, 5)], is_message)
            .unwrap();
        assert_eq!(offsets(&l, 3, 6), [(3, Some(12)), (4, None), (5, Some(13))]);
        assert_eq!(l.truncate_after(None), 10);
        assert_eq!((l.last_log_id(), l.first_index()), (None, None));
        l.append(&[blank(4, 7), msg(4, 8)], is_message).unwrap();
        assert_eq!(offsets(&l, 0, 9), [(7, None), (8, Some(10))]);
    }

    #[test]
    fn a_purge_keeps_the_offsets_of_what_follows() {
        let mut l = Layout::empty(0);
        l.append(
            &[
                msg(1, 0),
                blank(1, 1),
                msg(1, 2),
                msg(1, 3),
                blank(1, 4),
                msg(1, 5),
            ],
            is_message,
        )
        .unwrap();
        assert_eq!(l.purge(id(1, 2)), Some((id(1, 2), 2)));
        assert_eq!(l.first_index(), Some(3));
        assert_eq!(offsets(&l, 0, 9), [(3, Some(2)), (4, None), (5, Some(3))]);
        assert!(l.other(1).is_none(), "purged");
        // A purge point is never moved back.
        assert_eq!(l.purge(id(1, 1)), None);
        // Past the last entry: empty, and the next entry continues after the purge point.
        assert_eq!(l.purge(id(2, 9)), Some((id(2, 9), 4)));
        assert_eq!((l.first_index(), l.last_log_id()), (None, Some(id(2, 9))));
        assert!(l.append(&[msg(2, 6)], is_message).is_err());
        l.append(&[msg(2, 10)], is_message).unwrap();
        assert_eq!(offsets(&l, 0, 20), [(10, Some(4))]);
        // Below a log that starts later: it keeps its start.
        let mut l = Layout::empty(0);
        l.append(&[msg(1, 5), blank(1, 6), msg(1, 7)], is_message)
            .unwrap();
        assert_eq!(l.purge(id(1, 2)), Some((id(1, 2), 0)));
        assert_eq!(l.first_index(), Some(5));
        assert_eq!(offsets(&l, 0, 9), [(5, Some(0)), (6, None), (7, Some(1))]);
    }

    #[test]
    fn a_reset_starts_after_the_snapshot() {
        let mut l = Layout::empty(0);
        l.append(&[msg(1, 0), msg(1, 1)], is_message).unwrap();
        l.reset(id(5, 40), 1000);
        assert_eq!(
            (l.first_index(), l.last_log_id(), l.end()),
            (None, Some(id(5, 40)), 1000)
        );
        l.append(&[blank(6, 41), msg(6, 42)], is_message).unwrap();
        assert_eq!(offsets(&l, 0, 50), [(41, None), (42, Some(1000))]);
        assert!(l.holds(&id(6, 41), |_| None));
        assert!(!l.holds(&id(5, 41), |_| None));
        assert!(l.holds(&id(6, 42), |i| (i == 42).then_some(6)));
        assert!(!l.holds(&id(5, 40), |_| Some(5)), "purged, not held");
    }
}
