//! A worker's last problem, when it happened and whether delivery has worked since (docs/http-api.md,
//! "HTTP API", `GET /mmmq/dispatchers`): an error that stays on show after the consumer came back
//! reads as an outage that is not there.
//!
//! A problem is resolved by the ACK that shows it is over, never by one of a message handed over
//! before it: a problem that holds its lane (a communication failure retried, a dead-letter write
//! that waits for the disk) by the next ACK on that lane; a problem whose message was passed on
//! (dead-lettered, dropped, a corrupt entry skipped) or of the partition's reader (a read error)
//! by an ACK of a later offset on any lane. With `maxInFlight` > 1 one lane may be stuck while the
//! others deliver, so each lane's open problem is kept until its own ACK, and status shows the
//! newest open one.

use std::sync::atomic::{AtomicBool, Ordering};

use mmmq_core::now_ms;
use parking_lot::Mutex;

/// One problem as status shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastError {
    /// When it happened (milliseconds since the Unix epoch).
    pub at: u64,
    /// What happened, whole.
    pub message: String,
    /// The lane it holds until that lane's next ACK; `None`: any lane's ACK of `from` or later.
    pub lane: Option<u32>,
    /// The first offset whose ACK can resolve it.
    pub from: u64,
    /// When a later delivery was ACKed.
    pub resolved_at: Option<u64>,
}

/// What a worker's problems look like to status.
#[derive(Debug, Default)]
struct Problems {
    /// Unresolved: at most one per lane, and one of the partition (`lane: None`).
    open: Vec<LastError>,
    /// The newest resolved one.
    resolved: Option<LastError>,
}

/// The last problems of one worker.
#[derive(Debug, Default)]
pub struct LastErrorCell {
    problems: Mutex<Problems>,
    /// Some problem is open: each ACK checks this flag instead of taking the lock.
    open: AtomicBool,
}

/// How a problem ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ends {
    /// At the next ACK on this lane (the message is being retried in it).
    OnLane(u32),
    /// At any ACK of this offset or a later one.
    From(u64),
}

impl LastErrorCell {
    /// Records a problem, replacing the open one it stands in for: the same lane's, or the
    /// partition's. A lane has one delivery at a time, so the next ACK on a held lane is of the
    /// message retried or a later one: it needs no offset.
    pub fn record(&self, ends: Ends, message: String) {
        let (lane, from) = match ends {
            Ends::OnLane(lane) => (Some(lane), 0),
            Ends::From(from) => (None, from),
        };
        let mut p = self.problems.lock();
        p.open.retain(|e| e.lane != lane);
        p.open.push(LastError {
            at: now_ms(),
            message,
            lane,
            from,
            resolved_at: None,
        });
        self.open.store(true, Ordering::Release);
    }

    /// The delivery of `offset` on `lane` was ACKed: the problems it shows over are resolved.
    pub fn delivered(&self, lane: u32, offset: u64) {
        if !self.open.load(Ordering::Acquire) {
            return;
        }
        let mut p = self.problems.lock();
        let Problems { open, resolved } = &mut *p;
        let now = now_ms();
        open.retain(|e| {
            let over = offset >= e.from && e.lane.is_none_or(|l| l == lane);
            if over && resolved.as_ref().is_none_or(|r| r.at <= e.at) {
                *resolved = Some(LastError {
                    resolved_at: Some(now),
                    ..e.clone()
                });
            }
            !over
        });
        self.open.store(!open.is_empty(), Ordering::Release);
    }

    /// The problem status shows: the newest open one, else the newest resolved one.
    pub fn get(&self) -> Option<LastError> {
        let p = self.problems.lock();
        pick(p.open.iter().chain(&p.resolved).cloned())
    }
}

/// The problem that stands for several (a dispatcher's over its partitions, a redrive's): the
/// most recent one not resolved, else the most recent one, so that a resolved problem is never
/// shown while another one is still going on.
pub fn pick(errors: impl IntoIterator<Item = LastError>) -> Option<LastError> {
    errors
        .into_iter()
        .max_by_key(|e| (e.resolved_at.is_none(), e.at))
}

/// `(lastError, lastErrorAt, lastErrorResolvedAt)` as status shows them.
pub fn fields(e: Option<LastError>) -> (Option<String>, Option<u64>, Option<u64>) {
    match e {
        Some(e) => (Some(e.message), Some(e.at), e.resolved_at),
        None => (None, None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_is_resolved_by_the_ack_that_shows_it_is_over() {
        let cell = LastErrorCell::default();
        cell.record(Ends::OnLane(1), "refused".into());
        // Another lane delivering says nothing about lane 1.
        cell.delivered(0, 11);
        assert_eq!(cell.get().unwrap().resolved_at, None);
        // A message passed on in lane 2 is the newest open problem, lane 1 still stuck.
        cell.record(Ends::From(13), "offset 12 dead-lettered".into());
        // An ACK of a message handed over before the dead letter resolves nothing.
        cell.delivered(2, 11);
        let dead = cell.get().unwrap();
        assert_eq!(dead.message, "offset 12 dead-lettered");
        let dead_at = dead.at;
        // A later offset ends the dead letter, but lane 1 is still stuck: that one shows.
        cell.delivered(2, 14);
        let shown = cell.get().unwrap();
        assert_eq!(
            (shown.message.as_str(), shown.resolved_at),
            ("refused", None)
        );
        let refused_at = shown.at;
        cell.delivered(1, 10);
        let resolved = cell.get().unwrap().resolved_at.unwrap();
        // Both are over: the newer one shows (the two may fall in one millisecond, then the last
        // resolved).
        let newest = if dead_at > refused_at {
            "offset 12 dead-lettered"
        } else {
            "refused"
        };
        assert_eq!(cell.get().unwrap().message, newest);
        // A second ACK keeps the first one's time.
        cell.delivered(1, 15);
        assert_eq!(cell.get().unwrap().resolved_at, Some(resolved));
        // A read error at offset 20 is not over at an ACK of offset 19.
        cell.record(Ends::From(20), "reading offset 20".into());
        cell.delivered(3, 19);
        assert_eq!(cell.get().unwrap().resolved_at, None);
        cell.delivered(3, 20);
        assert!(cell.get().unwrap().resolved_at.is_some());
        assert_eq!(cell.get().unwrap().message, "reading offset 20");
    }

    #[test]
    fn the_problem_that_stands_for_several_is_the_newest_unresolved_one() {
        let e = |at, resolved_at: Option<u64>| LastError {
            at,
            message: format!("at {at}"),
            lane: None,
            from: 0,
            resolved_at,
        };
        let open_old = e(1, None);
        let resolved_new = e(5, Some(6));
        assert_eq!(
            pick([resolved_new.clone(), open_old.clone()]),
            Some(open_old)
        );
        assert_eq!(
            pick([e(1, Some(2)), resolved_new.clone()]),
            Some(resolved_new)
        );
        assert_eq!(pick([e(3, None), e(4, None)]), Some(e(4, None)));
        assert_eq!(pick([]), None);
    }
}
