//! The produce ids every topic of a broker remembers, together (docs/delivery.md, "Idempotent produce":
//! `serve --max-produce-ids`), and each topic's account with that budget.
//!
//! A claim that would pass the budget makes its own topic forget its oldest ids first, before
//! their window ends — but only a topic that holds at least its fair share (the budget over the
//! topics holding ids): a busy topic's window shrinks, while a topic that starts later, or holds
//! few, keeps its window and is admitted past the budget, which the busy topic's next claims take
//! back. A producer is never refused for it (`mmmq-client` gives every message an id, so refusing
//! would cap the broker's throughput at the budget over the window). A claim whose append is in
//! progress is never forgotten early: the duplicates racing it wait for its position.

use std::hash::Hasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// The default of `serve --max-produce-ids`: about 130 bytes an id with the tables' slack
/// (docs/benchmarks.md, "Produce ids"), so 2,000,000 ids are ~250 MiB.
pub const MAX_IDS: usize = 2_000_000;

/// The broker-wide budget of remembered produce ids.
#[derive(Debug)]
pub struct IdBudget {
    max: AtomicUsize,
    used: AtomicUsize,
    /// Topics holding at least one id: the budget is shared among them.
    topics: AtomicUsize,
    forgotten_early: AtomicU64,
}

impl IdBudget {
    /// A budget of `max` ids.
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: AtomicUsize::new(max),
            used: AtomicUsize::new(0),
            topics: AtomicUsize::new(0),
            forgotten_early: AtomicU64::new(0),
        })
    }

    /// Sets the budget (after boot has remembered the ids found in the logs).
    pub fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::Relaxed);
    }

    /// The budget.
    pub fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }

    /// Ids remembered now, over every topic.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Ids forgotten before their window ended because the budget was full.
    pub fn forgotten_early(&self) -> u64 {
        self.forgotten_early.load(Ordering::Relaxed)
    }

    /// How many ids must go for one more to fit.
    fn over(&self) -> usize {
        (self.used() + 1).saturating_sub(self.max())
    }
}

/// One topic's account with the [`IdBudget`]: what it holds, and whether it was warned.
#[derive(Debug)]
pub(super) struct Account {
    budget: Arc<IdBudget>,
    held: AtomicUsize,
    warned: AtomicBool,
}

impl Account {
    pub(super) fn new(budget: Arc<IdBudget>) -> Self {
        Self {
            budget,
            held: AtomicUsize::new(0),
            warned: AtomicBool::new(false),
        }
    }

    /// One more id held.
    pub(super) fn add(&self) {
        if self.held.fetch_add(1, Ordering::Relaxed) == 0 {
            self.budget.topics.fetch_add(1, Ordering::Relaxed);
        }
        self.budget.used.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` ids fewer.
    pub(super) fn remove(&self, n: usize) {
        if n == 0 {
            return;
        }
        if self.held.fetch_sub(n, Ordering::Relaxed) == n {
            self.budget.topics.fetch_sub(1, Ordering::Relaxed);
        }
        self.budget.used.fetch_sub(n, Ordering::Relaxed);
    }

    /// Whether a claim of this topic must first forget one of its ids: the budget is full and
    /// the topic holds at least its fair share of it.
    pub(super) fn must_forget(&self) -> bool {
        if self.budget.over() == 0 {
            return false;
        }
        let share = self.budget.max() / self.budget.topics.load(Ordering::Relaxed).max(1);
        self.held.load(Ordering::Relaxed) >= share
    }

    /// An id was forgotten before its window ended (counted; warned once per topic).
    pub(super) fn forgot_early(&self) {
        self.budget.forgotten_early.fetch_add(1, Ordering::Relaxed);
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                max = self.budget.max(),
                "more produce ids than the broker remembers (--max-produce-ids): this topic's oldest are forgotten before their window ends"
            );
        }
    }

    /// Ids this topic holds.
    pub(super) fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

impl Drop for Account {
    /// A deleted topic's ids leave the budget with it.
    fn drop(&mut self) {
        self.remove(self.held.load(Ordering::Relaxed));
    }
}

/// Hashes a produce-id key ([`super::dedup::Key`]) by folding its two halves: a key is already a keyed 128-bit hash of the id
/// (xxh3 with the topic's secret seed), so hashing it again with SipHash bought nothing but
/// time — a boot that loads two million ids from a snapshot spent most of it there.
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u128 keys are hashed; this is for completeness.
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0 ^ u64::from_le_bytes(word)).rotate_left(29);
        }
    }

    fn write_u128(&mut self, key: u128) {
        self.0 = (key as u64) ^ ((key >> 64) as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::super::dedup::{Claim, Dedup};
    use super::*;

    /// A topic's ids leave the broker's budget when they expire or the topic goes.
    #[test]
    fn a_dropped_topic_gives_its_ids_back() {
        let budget = IdBudget::new(100);
        let d = Dedup::new(budget.clone());
        for n in 0..10 {
            let Claim::New(t) = d.claim(&format!("id-{n}"), 1, 1000) else {
                panic!()
            };
            d.stored(&t, 0, n);
        }
        assert_eq!(budget.used(), 10);
        d.expire(500, 1000);
        assert_eq!(budget.used(), 10, "inside their window");
        d.expire(1002, 1000);
        assert_eq!(budget.used(), 0, "past it");
        d.remember("x", 2000, 0, 1);
        assert_eq!(budget.used(), 1);
        drop(d);
        assert_eq!(budget.used(), 0);
    }
}
