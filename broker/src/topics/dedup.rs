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
use std::sync::atomic::{AtomicUsize, Ordering};

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

    /// Remembers the id of a message a cluster's partition applied (docs/cluster.md, "Produce
    /// ids in a cluster"), past the window forgetting what is older and, past the budget, making
    /// room as a claim does: a replica that leads none of the topic's partitions claims nothing,
    /// and would otherwise never trim.
    pub fn remember_applied(
        &self,
        id: &str,
        at_ms: u64,
        (partition, offset): (u32, u64),
        now_ms: u64,
        window_ms: u64,
    ) {
        let key = self.key(id);
        let shard = self.shard(key);
        {
            let mut inner = shard.inner.lock();
            Shard::expire(
                &mut inner,
                now_ms.saturating_sub(window_ms),
                &self.account,
                true,
            );
        }
        shard.remember(key, at_ms, partition, offset, &self.account);
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
    /// How many [`Shard::wait`]s are under way: a store wakes `done` only if some are.
    waiting: AtomicUsize,
}

impl Shard {
    /// Forgets the ids claimed before `horizon`; with `make_room`, while the topic must make
    /// room in the budget ([`Account::must_forget`]), also the oldest of this shard however
    /// young (each counted as forgotten early) — up to the first claim still being appended,
    /// which its duplicates are waiting on.
    fn expire(inner: &mut Inner, horizon: u64, account: &Account, make_room: bool) {
        while let (Some(&at), Some(&key)) = (inner.order_at.front(), inner.order_key.front()) {
            let early = at >= horizon;
            // The common case, decided without a lookup: the oldest id is inside its window
            // and no room must be made.
            if early && (!make_room || !account.must_forget()) {
                break;
            }
            let current = inner.ids.get(&key).filter(|e| e.at_ms() == at);
            if early && matches!(current, Some(Entry::Pending { .. })) {
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
        let horizon = now_ms.saturating_sub(window_ms);
        Self::expire(&mut inner, horizon, account, false);
        if let Some(e) = inner.ids.get(&key) {
            return match *e {
                Entry::Pending { seq, .. } => Claim::Pending(Ticket { key, seq }),
                Entry::Stored {
                    partition, offset, ..
                } => Claim::Stored(partition, offset),
            };
        }
        // Room is made for a new id only: a repeat that made room first could forget the very
        // id it repeats (the shard's oldest when the shard holds few), and store it twice.
        Self::expire(&mut inner, horizon, account, true);
        let seq = inner.seq + 1;
        inner.ids.insert(key, Entry::Pending { seq, at: now_ms });
        inner.seq = seq;
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
        self.wake_waiters();
    }

    /// Wakes the duplicates waiting on this shard's pending claims, if any wait: a claim's
    /// store is on every produce with an id, a wait only on a retry racing its original, and
    /// waking nobody still takes the `Notify`'s lock.
    fn wake_waiters(&self) {
        // Pairs with the increment in `wait`, which comes before its look at the table: either
        // this sees the waiter, or the waiter's look (under the shard's lock, taken after this
        // store's) sees the entry resolved.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.done.notify_waiters();
        }
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
        self.wake_waiters();
    }

    async fn wait(&self, ticket: &Ticket) -> Option<(u32, u64)> {
        /// Counts this wait in [`Shard::waiting`] for as long as it lasts (also if dropped).
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.waiting);
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
    ///
    /// A cluster's replica remembers what it applies (docs/cluster.md, "Produce ids in a
    /// cluster"), also an id its leader claimed for that very message: the claim is then stored
    /// (keeping its time, so it is queued once) and its waiters woken.
    fn remember(&self, key: Key, at_ms: u64, partition: u32, offset: u64, account: &Account) {
        let was_pending = {
            let mut inner = self.inner.lock();
            let at = match inner.ids.get(&key) {
                Some(Entry::Pending { at, .. }) => *at,
                _ => at_ms,
            };
            let entry = Entry::Stored {
                partition,
                offset,
                at,
            };
            let (queue, was_pending) = match inner.ids.insert(key, entry) {
                None => {
                    account.add();
                    (true, false)
                }
                Some(old @ Entry::Pending { .. }) => (old.at_ms() != at, true),
                // An id stored twice in the window (after it was forgotten early): its old queue
                // entry no longer matches it, so without a new one it would never expire.
                Some(old) => (old.at_ms() != at, false),
            };
            if queue {
                inner.order_at.push_back(at);
                inner.order_key.push_back(key);
            }
            was_pending
        };
        if was_pending {
            self.wake_waiters();
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().ids.len()
    }
}

#[cfg(test)]
#[path = "dedup_tests.rs"]
mod tests;
