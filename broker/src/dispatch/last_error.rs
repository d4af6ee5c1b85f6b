//! A worker's last problem, when it happened and whether delivery has worked since (docs/http-api.md,
//! "HTTP API", `GET /mmmq/dispatchers`): an error that stays on show after the consumer came back
//! reads as an outage that is not there.
//!
//! A problem is resolved by the next ACK: on any lane for a problem of the partition's reader (a
//! read error, a corrupt entry), on its own lane for a problem of one delivery (a communication
//! failure, a dead letter), because with `maxInFlight` > 1 one lane may be stuck while the others
//! deliver.

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
    /// The lane of the delivery it is about; `None`: the partition's reader.
    pub lane: Option<u32>,
    /// When a later delivery was ACKed.
    pub resolved_at: Option<u64>,
}

/// The last problem of one worker.
#[derive(Debug, Default)]
pub struct LastErrorCell {
    error: Mutex<Option<LastError>>,
    /// An unresolved problem is stored: each ACK checks this flag instead of taking the lock.
    open: AtomicBool,
}

impl LastErrorCell {
    /// Records a problem of `lane` (`None`: of the whole partition).
    pub fn record(&self, lane: Option<u32>, message: String) {
        let mut e = self.error.lock();
        *e = Some(LastError {
            at: now_ms(),
            message,
            lane,
            resolved_at: None,
        });
        self.open.store(true, Ordering::Release);
    }

    /// A delivery on `lane` was ACKed: the last problem is over if it was this lane's or the
    /// partition's.
    pub fn delivered(&self, lane: u32) {
        if !self.open.load(Ordering::Acquire) {
            return;
        }
        let mut e = self.error.lock();
        if let Some(e) = e.as_mut()
            && e.resolved_at.is_none()
            && e.lane.is_none_or(|l| l == lane)
        {
            e.resolved_at = Some(now_ms());
            self.open.store(false, Ordering::Release);
        }
    }

    /// The last problem, if any.
    pub fn get(&self) -> Option<LastError> {
        self.error.lock().clone()
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
    fn an_ack_on_the_lane_of_the_problem_or_any_ack_for_the_partitions_resolves_it() {
        let cell = LastErrorCell::default();
        cell.record(Some(1), "refused".into());
        // Another lane delivering says nothing about lane 1.
        cell.delivered(0);
        assert_eq!(cell.get().unwrap().resolved_at, None);
        cell.delivered(1);
        let resolved = cell.get().unwrap().resolved_at.unwrap();
        // A second ACK keeps the first one's time.
        cell.delivered(1);
        assert_eq!(cell.get().unwrap().resolved_at, Some(resolved));
        // A problem of the reader is over at any ACK; a new one is open again.
        cell.record(None, "corrupt entry".into());
        assert_eq!(cell.get().unwrap().resolved_at, None);
        cell.delivered(3);
        assert!(cell.get().unwrap().resolved_at.is_some());
        assert_eq!(cell.get().unwrap().message, "corrupt entry");
    }

    #[test]
    fn the_problem_that_stands_for_several_is_the_newest_unresolved_one() {
        let e = |at, resolved_at: Option<u64>| LastError {
            at,
            message: format!("at {at}"),
            lane: None,
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
