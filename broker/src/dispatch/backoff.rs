//! The retry schedule while a consumer or the disk is down (docs/dispatchers.md, "Dispatchers"): 1 s, doubling,
//! at most 60 s, forever. One type for every loop that waits this way, so they cannot drift apart.

use std::time::Duration;

/// The first wait.
pub(super) const START: Duration = Duration::from_secs(1);
/// The longest wait.
pub(super) const MAX: Duration = Duration::from_secs(60);

/// Where a streak of failures is in the schedule.
#[derive(Debug, Clone)]
pub(super) struct Backoff {
    next: Duration,
    failures: u64,
}

impl Backoff {
    pub(super) fn new() -> Self {
        Self {
            next: START,
            failures: 0,
        }
    }

    /// Counts a failure and returns how long to wait before the next try.
    pub(super) fn failed(&mut self) -> Duration {
        let wait = self.next;
        self.next = (wait * 2).min(MAX);
        self.failures += 1;
        wait
    }

    /// Failures in this streak so far.
    pub(super) fn failures(&self) -> u64 {
        self.failures
    }

    /// Whether the failure just counted deserves a log line: the first of a streak, and each one
    /// at the longest wait (a consumer down for an hour logs once a minute, not once a second).
    pub(super) fn worth_logging(&self) -> bool {
        self.failures == 1 || self.next == MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_second_doubling_to_a_minute() {
        let mut b = Backoff::new();
        let waits: Vec<u64> = (0..9).map(|_| b.failed().as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(b.failures(), 9);
    }
}
