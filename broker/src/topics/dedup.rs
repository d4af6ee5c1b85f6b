//! Idempotent produce (docs/delivery.md, "Idempotent produce"): the ids a topic has seen within its
//! `dedupWindowMs`, per topic (a keyless retry may be routed to another partition), rebuilt from
//! the log at boot.
//!
//! Boot restores it from the topic's snapshot of it and the log written since (`id_restore`,
//! `id_snapshot`).
//!
//! A produce with an id claims it: the first claim appends and then publishes where the message
//! went; a claim of the same id meanwhile (a retry racing its original, a duplicate later in the
//! same batch) waits for that and answers the same position, appending nothing. A failed append
//! withdraws its claim, so a retry stores the message.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use parking_lot::Mutex;

use super::id_budget::{Account, KeyHasher};
pub use super::id_budget::{IdBudget, MAX_IDS};

/// An id as it is remembered: its 128-bit hash (xxh3 with a seed chosen at start), not its text.
/// Two different ids of one topic within one window collide with a probability far below a disk
/// error's; the seed keeps anyone from choosing ids that collide on purpose without knowing it.
/// The seed is kept in the topic's id snapshot, so the keys it holds stay valid after a restart.
pub type Key = u128;

/// The result of claiming an id.
#[derive(Debug)]
pub enum Claim {
    /// First seen: append, then [`Dedup::stored`] (or [`Dedup::withdraw`] on failure).
    New(Ticket),
    /// Being appended by an earlier claim: [`Dedup::wait`] for where it went.
    Pending(Ticket),
    /// Stored at (partition, offset).
    Stored(u32, u64),
}

/// One claim of an id: which id, and which claim of it (an id expired and claimed again is a new
/// claim).
#[derive(Debug, Clone, Copy)]
pub struct Ticket {
    key: Key,
    seq: u64,
}

impl Ticket {
    /// The id's key.
    pub fn key(&self) -> Key {
        self.key
    }
}

/// What is remembered of one id: a claim in progress, or where its message went; 24 bytes next
/// to its 16-byte key.
#[derive(Debug, Clone, Copy)]
enum Entry {
    Pending {
        seq: u64,
        at: u64,
    },
    Stored {
        partition: u32,
        offset: u64,
        at: u64,
    },
}

impl Entry {
    fn at_ms(&self) -> u64 {
        match self {
            Entry::Pending { at, .. } | Entry::Stored { at, .. } => *at,
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    ids: HashMap<Key, Entry, BuildHasherDefault<KeyHasher>>,
    /// Ids in claim order, for expiry: when each was claimed, and which (two queues: 24 bytes an
    /// id instead of a padded 32).
    order_at: VecDeque<u64>,
    order_key: VecDeque<Key>,
    /// Numbers claims, so that a stale ticket never completes a newer claim of its id.
    seq: u64,
}

/// Shards of a topic's ids: claims of different ids rarely wait for each other.
const SHARDS: usize = 16;

/// The ids of one topic within its window, sharded by the id's hash.
#[derive(Debug)]
pub struct Dedup {
    shards: Vec<Shard>,
    seed: u64,
    /// What it holds of the broker's budget of ids.
    account: Account,
}

impl Default for Dedup {
    /// A topic alone with the default budget (tests, benchmarks).
    fn default() -> Self {
        Self::new(IdBudget::new(MAX_IDS))
    }
}

impl Dedup {
    /// No ids yet; what it remembers counts against `budget`.
    pub fn new(budget: Arc<IdBudget>) -> Self {
        Self::with_seed(budget, None)
    }

    /// As [`Dedup::new`], hashing ids with `seed` (a snapshot's, whose keys were made with it)
    /// or, without one, a random seed.
    pub fn with_seed(budget: Arc<IdBudget>, seed: Option<u64>) -> Self {
        use std::hash::BuildHasher;
        Self {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            seed: seed
                .unwrap_or_else(|| std::collections::hash_map::RandomState::new().hash_one(0u64)),
            account: Account::new(budget),
        }
    }

    /// The seed its keys are made with (kept in the topic's id snapshot).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Forgets the ids past their window (`window_ms` before `now_ms`) in every shard: the
    /// retention pass frees the ids of topics nobody produces to.
    pub fn expire(&self, now_ms: u64, window_ms: u64) {
        for s in &self.shards {
            let horizon = now_ms.saturating_sub(window_ms);
            Shard::expire(&mut s.inner.lock(), horizon, &self.account, false);
        }
    }

    fn key(&self, id: &str) -> Key {
        xxhash_rust::xxh3::xxh3_128_with_seed(id.as_bytes(), self.seed)
    }

    fn shard(&self, key: Key) -> &Shard {
        &self.shards[(key as usize) % SHARDS]
    }

    /// Claims `id` at `now_ms` with a window of `window_ms`.
    pub fn claim(&self, id: &str, now_ms: u64, window_ms: u64) -> Claim {
        let key = self.key(id);
        self.shard(key).claim(key, now_ms, window_ms, &self.account)
    }

    /// The append of a new claim stored its message at (`partition`, `offset`).
    pub fn stored(&self, ticket: &Ticket, partition: u32, offset: u64) {
        self.shard(ticket.key).stored(ticket, partition, offset)
    }

    /// The append of a new claim failed: the id is free again.
    pub fn withdraw(&self, ticket: &Ticket) {
        self.shard(ticket.key).withdraw(ticket, &self.account)
    }

    /// Where the message of a pending claim went, once its append is done; `None` if it failed
    /// (the id is free again).
    pub async fn wait(&self, ticket: &Ticket) -> Option<(u32, u64)> {
        self.shard(ticket.key).wait(ticket).await
    }

    /// Remembers an id found in the log at boot.
    pub fn remember(&self, id: &str, at_ms: u64, partition: u32, offset: u64) {
        self.remember_key(self.key(id), at_ms, partition, offset)
    }

    /// Makes room for `n` more ids at once (a snapshot's, at boot) rather than growing step by
    /// step.
    pub fn reserve(&self, n: usize) {
        for s in &self.shards {
            let mut inner = s.inner.lock();
            let share = n / SHARDS + 1;
            inner.ids.reserve(share);
            inner.order_at.reserve(share);
            inner.order_key.reserve(share);
        }
    }

    /// Remembers an id by its key (one of the topic's snapshot, made with [`Dedup::seed`]).
    pub fn remember_key(&self, key: Key, at_ms: u64, partition: u32, offset: u64) {
        self.shard(key)
            .remember(key, at_ms, partition, offset, &self.account)
    }

    /// Shows every id it holds, shard by shard under that shard's lock, each shard's in claim
    /// order: `stored(key, partition, offset, at_ms)` for an id whose message is stored,
    /// `pending(ticket, at_ms)` for one whose append is still under way ([`Dedup::wait`] tells
    /// where it goes). Claims and stores of other shards go on meanwhile.
    pub fn visit(
        &self,
        mut stored: impl FnMut(Key, u32, u64, u64),
        mut pending: impl FnMut(Ticket, u64),
    ) {
        for s in &self.shards {
            let inner = s.inner.lock();
            for (&at, &key) in inner.order_at.iter().zip(&inner.order_key) {
                // A queue entry whose id was since withdrawn, expired or claimed again at
                // another time is not the id's current one.
                match inner.ids.get(&key) {
                    Some(&Entry::Stored {
                        partition,
                        offset,
                        at: a,
                    }) if a == at => stored(key, partition, offset, at),
                    Some(&Entry::Pending { seq, at: a }) if a == at => {
                        pending(Ticket { key, seq }, at)
                    }
                    _ => {}
                }
            }
        }
    }

    /// How many ids are remembered (tests, metrics).
    pub fn len(&self) -> usize {
        self.account.held()
    }

    /// Whether no id is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One shard of a topic's ids.
#[derive(Debug, Default)]
struct Shard {
    inner: Mutex<Inner>,
    /// Woken when a pending claim of this shard is done (stored or withdrawn). Duplicates racing
    /// their original are rare, so one shared wake-up costs less than a channel per claim.
    done: tokio::sync::Notify,
}

impl Shard {
    /// Forgets the ids claimed before `horizon`; with `make_room`, while the topic must make
    /// room in the budget ([`Account::must_forget`]), also the oldest of this shard however
    /// young (each counted as forgotten early) — up to the first claim still being appended,
    /// which its duplicates are waiting on.
    fn expire(inner: &mut Inner, horizon: u64, account: &Account, make_room: bool) {
        while let (Some(&at), Some(&key)) = (inner.order_at.front(), inner.order_key.front()) {
            let current = inner.ids.get(&key).filter(|e| e.at_ms() == at);
            let early = at >= horizon;
            if early
                && (!make_room
                    || !account.must_forget()
                    || matches!(current, Some(Entry::Pending { .. })))
            {
                break;
            }
            inner.order_at.pop_front();
            inner.order_key.pop_front();
            if current.is_some() {
                inner.ids.remove(&key);
                account.remove(1);
                if early {
                    account.forgot_early();
                }
            }
        }
    }

    fn claim(&self, key: Key, now_ms: u64, window_ms: u64, account: &Account) -> Claim {
        let mut inner = self.inner.lock();
        Self::expire(&mut inner, now_ms.saturating_sub(window_ms), account, true);
        match inner.ids.get(&key) {
            Some(Entry::Pending { seq, .. }) => return Claim::Pending(Ticket { key, seq: *seq }),
            Some(Entry::Stored {
                partition, offset, ..
            }) => return Claim::Stored(*partition, *offset),
            None => {}
        }
        inner.seq += 1;
        let seq = inner.seq;
        inner.ids.insert(key, Entry::Pending { seq, at: now_ms });
        account.add();
        inner.order_at.push_back(now_ms);
        inner.order_key.push_back(key);
        Claim::New(Ticket { key, seq })
    }

    fn stored(&self, ticket: &Ticket, partition: u32, offset: u64) {
        {
            let mut inner = self.inner.lock();
            if let Some(e) = inner.ids.get_mut(&ticket.key)
                && let Entry::Pending { seq, at } = *e
                && seq == ticket.seq
            {
                *e = Entry::Stored {
                    partition,
                    offset,
                    at,
                };
            }
        }
        self.done.notify_waiters();
    }

    /// Frees the id (waiters see the failure and claim it themselves).
    fn withdraw(&self, ticket: &Ticket, account: &Account) {
        {
            let mut inner = self.inner.lock();
            if matches!(inner.ids.get(&ticket.key), Some(Entry::Pending { seq, .. }) if *seq == ticket.seq)
            {
                inner.ids.remove(&ticket.key);
                account.remove(1);
            }
        }
        self.done.notify_waiters();
    }

    async fn wait(&self, ticket: &Ticket) -> Option<(u32, u64)> {
        loop {
            let done = self.done.notified();
            match self.inner.lock().ids.get(&ticket.key) {
                Some(Entry::Pending { seq, .. }) if *seq == ticket.seq => {}
                Some(Entry::Stored {
                    partition, offset, ..
                }) => return Some((*partition, *offset)),
                // Withdrawn (or expired, or claimed again since): the first append failed.
                _ => return None,
            }
            done.await;
        }
    }

    /// Boot keeps every id of the window found in the log, past the budget too (the next claims
    /// trim it).
    fn remember(&self, key: Key, at_ms: u64, partition: u32, offset: u64, account: &Account) {
        let mut inner = self.inner.lock();
        let entry = Entry::Stored {
            partition,
            offset,
            at: at_ms,
        };
        let queue = match inner.ids.insert(key, entry) {
            None => {
                account.add();
                true
            }
            // An id stored twice in the window (after it was forgotten early): its old queue
            // entry no longer matches it, so without a new one it would never expire.
            Some(old) => old.at_ms() != at_ms,
        };
        if queue {
            inner.order_at.push_back(at_ms);
            inner.order_key.push_back(key);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().ids.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_second_claim_waits_for_the_first_and_gets_its_position() {
        let d = Dedup::default();
        let Claim::New(first) = d.claim("a", 1000, 100) else {
            panic!("first claim")
        };
        let Claim::Pending(second) = d.claim("a", 1010, 100) else {
            panic!("second claim")
        };
        let waiting = async { d.wait(&second).await };
        let storing = async {
            tokio::task::yield_now().await;
            d.stored(&first, 2, 7);
        };
        let (got, ()) = tokio::join!(waiting, storing);
        assert_eq!(got, Some((2, 7)));
        assert!(matches!(d.claim("a", 1020, 100), Claim::Stored(2, 7)));
        // Past the window the id is new again.
        assert!(matches!(d.claim("a", 1101, 100), Claim::New(_)));
        assert!(matches!(d.claim("b", 1101, 100), Claim::New(_)));
    }

    #[tokio::test]
    async fn a_failed_append_frees_the_id() {
        let d = Dedup::default();
        let Claim::New(first) = d.claim("a", 0, 100) else {
            panic!()
        };
        let Claim::Pending(waiter) = d.claim("a", 1, 100) else {
            panic!()
        };
        d.withdraw(&first);
        assert_eq!(d.wait(&waiter).await, None);
        let Claim::New(again) = d.claim("a", 2, 100) else {
            panic!()
        };
        // A stale ticket does not complete the newer claim.
        d.stored(&first, 9, 9);
        assert!(matches!(d.claim("a", 3, 100), Claim::Pending(_)));
        d.stored(&again, 0, 4);
        assert!(matches!(d.claim("a", 4, 100), Claim::Stored(0, 4)));
        d.remember("b", 5, 1, 3);
        assert!(matches!(d.claim("b", 6, 100), Claim::Stored(1, 3)));
    }

    fn stored_claim(shard: &Shard, key: Key, now: u64, account: &Account) {
        let Claim::New(t) = shard.claim(key, now, u64::MAX, account) else {
            panic!("{key} is new")
        };
        shard.stored(&t, 0, key as u64);
    }

    /// The budget (docs/delivery.md, "Idempotent produce": `--max-produce-ids`), over every topic: a claim
    /// that would pass it first forgets the oldest ids of its own shard, however young (counted,
    /// warned once per topic) — if its topic holds at least its fair share (the budget over the
    /// topics holding ids); a topic below it is admitted past the budget, which the other's next
    /// claims take back. What a producer sees: a retry of a remembered id appends nothing and
    /// answers the first's position (`duplicate: true`); a retry of a forgotten one stores a
    /// second copy.
    #[test]
    fn past_the_budget_a_claim_forgets_the_oldest_ids_of_its_topic_first() {
        let budget = IdBudget::new(4);
        let (busy, late) = (Account::new(budget.clone()), Account::new(budget.clone()));
        let (shard, other) = (Shard::default(), Shard::default());
        for key in 0..4 {
            stored_claim(&shard, key, key as u64, &busy);
        }
        assert_eq!((budget.used(), budget.forgotten_early()), (4, 0));
        // Full: the next claim forgets the oldest (0) first.
        stored_claim(&shard, 4, 4, &busy);
        assert_eq!((budget.used(), budget.forgotten_early()), (4, 1));
        // A retry of a remembered id is a duplicate (and makes room for one: 1 goes).
        assert!(matches!(
            shard.claim(3, 9, u64::MAX, &busy),
            Claim::Stored(0, 3)
        ));
        assert_eq!((shard.len(), budget.forgotten_early()), (3, 2));
        // A retry of the forgotten 0 stores it again.
        stored_claim(&shard, 0, 10, &busy);
        assert_eq!(budget.used(), 4);
        // A topic that starts later holds less than its share (4 / 2): admitted past the budget,
        // its ids all kept ...
        stored_claim(&other, 100, 11, &late);
        stored_claim(&other, 101, 12, &late);
        assert_eq!((budget.used(), late.held(), busy.held()), (6, 2, 4));
        // ... and the busy topic's next claim gives back what was passed: it holds 4 ≥ 2.
        stored_claim(&shard, 5, 13, &busy);
        assert_eq!((budget.used(), late.held(), busy.held()), (4, 2, 2));
        // Expiry by time frees the budget, and the sweep never forgets a young id early.
        Shard::expire(&mut shard.inner.lock(), 10, &busy, false);
        assert_eq!(
            (budget.used(), busy.held()),
            (4, 2),
            "young: kept by the sweep"
        );
        Shard::expire(&mut shard.inner.lock(), 50, &busy, false);
        assert_eq!((budget.used(), busy.held(), shard.len()), (2, 0, 0));
        // Ids found in the log at boot are kept past the budget until claims trim them.
        for key in 200..210 {
            shard.remember(key, 60, 0, key as u64, &busy);
        }
        assert_eq!(budget.used(), 12);
        stored_claim(&shard, 300, 61, &busy);
        assert_eq!((budget.used(), shard.len()), (4, 2));
    }

    /// A claim whose append is in progress is never forgotten early, so a duplicate racing it
    /// (a retry, the same id later in one batch) waits for its position instead of storing a
    /// second copy.
    #[test]
    fn a_claim_being_appended_is_not_forgotten_to_make_room() {
        let budget = IdBudget::new(2);
        let account = Account::new(budget.clone());
        let shard = Shard::default();
        let Claim::New(_pending) = shard.claim(1, 1, u64::MAX, &account) else {
            panic!()
        };
        stored_claim(&shard, 2, 2, &account);
        stored_claim(&shard, 3, 3, &account);
        assert_eq!(
            budget.used(),
            3,
            "admitted past the budget: the oldest is being appended"
        );
        assert!(matches!(
            shard.claim(1, 4, u64::MAX, &account),
            Claim::Pending(_)
        ));
    }
}
