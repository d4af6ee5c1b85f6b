//! The cap on partitions over all topics (`serve --max-partitions`, docs/operations.md, "`mmmq serve`").
//!
//! `--max-topics` counts topics, but a topic may have up to 1,024 partitions and each partition
//! is a log: its files, its tail's positions in memory, a writer thread while it writes, a worker
//! per matching dispatcher. The budget counts partitions instead.
//!
//! Topics are created under the registry's creation lock, but grown under their own topic's lock
//! only, so two topics may grow (or one grow while another is created) at the same time. Each
//! takes a [`Reservation`] first, under this budget's own lock, and only then opens its
//! partitions: two of them can never both see room for the last free partitions. A reservation
//! that is dropped (the creation failed) gives its partitions back; one that is kept counts the
//! partitions actually opened.

use parking_lot::Mutex;

use crate::storage::Limit;

/// Partitions in use over all topics, against the cap.
#[derive(Debug)]
pub(super) struct PartitionBudget {
    /// The cap (`usize::MAX`: none).
    max: usize,
    /// Partitions that exist, plus those reserved by creations under way.
    used: Mutex<usize>,
}

impl PartitionBudget {
    /// A budget with `used` partitions already in use (those found at boot, kept even past the
    /// cap) and no cap yet.
    pub fn new(used: usize) -> Self {
        Self {
            max: usize::MAX,
            used: Mutex::new(used),
        }
    }

    /// Sets the cap.
    pub fn with_max(self, max: usize) -> Self {
        Self { max, ..self }
    }

    /// The cap.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Partitions in use, creations under way included.
    pub fn used(&self) -> usize {
        *self.used.lock()
    }

    /// Reserves `n` partitions, refused when they would pass the cap, unless `forced` (a
    /// dead-letter or plugin-log topic the broker makes for a dispatcher: refusing it would stall
    /// the dispatcher; it is one partition and counts all the same).
    pub fn reserve(&self, n: usize, forced: bool) -> Result<Reservation<'_>, Limit> {
        let mut used = self.used.lock();
        if !forced && used.saturating_add(n) > self.max {
            return Err(Limit::Partitions {
                used: *used,
                asked: n,
                max: self.max,
            });
        }
        *used = used.saturating_add(n);
        Ok(Reservation { budget: self, n })
    }

    /// Gives back `n` partitions (a deleted topic's).
    pub fn release(&self, n: usize) {
        let mut used = self.used.lock();
        *used = used.saturating_sub(n);
    }
}

/// Partitions reserved for a creation under way; given back when dropped, unless kept.
#[must_use = "a reservation dropped at once gives its partitions back"]
#[derive(Debug)]
pub(super) struct Reservation<'a> {
    budget: &'a PartitionBudget,
    n: usize,
}

impl Reservation<'_> {
    /// The partitions exist now: `opened` of them stay counted (more than reserved when the disk
    /// already held more, which are kept as a boot would keep them).
    pub fn keep(mut self, opened: usize) {
        let mut used = self.budget.used.lock();
        *used = used.saturating_sub(self.n).saturating_add(opened);
        self.n = 0;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.n > 0 {
            self.budget.release(self.n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_never_pass_the_cap_and_give_back_what_is_not_kept() {
        let budget = PartitionBudget::new(2).with_max(8);
        let a = budget.reserve(4, false).unwrap();
        assert_eq!(
            budget.reserve(3, false).unwrap_err(),
            Limit::Partitions {
                used: 6,
                asked: 3,
                max: 8
            }
        );
        let b = budget.reserve(2, false).unwrap();
        assert_eq!(budget.used(), 8);
        drop(b);
        assert_eq!(budget.used(), 6);
        a.keep(4);
        assert_eq!(budget.used(), 6);
        // A dispatcher's dead-letter topic is never refused, and counts.
        budget.reserve(1, false).unwrap().keep(1);
        budget.reserve(1, true).unwrap().keep(1);
        assert_eq!(budget.used(), 8);
        budget.release(5);
        assert_eq!(budget.used(), 3);
    }
}
