//! Idempotent produce (README, "Idempotent produce"): the ids a topic has seen within its
//! `dedupWindowMs`, per topic (a keyless retry may be routed to another partition), rebuilt from
//! the log at boot.
//!
//! A produce with an id claims it: the first claim appends and then publishes where the message
//! went; a claim of the same id meanwhile (a retry racing its original, a duplicate later in the
//! same batch) waits for that and answers the same position, appending nothing. A failed append
//! withdraws its claim, so a retry stores the message.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

/// An id as it is remembered: its 128-bit hash (xxh3 with a seed chosen at start), not its text.
/// Two different ids of one topic within one window collide with a probability far below a disk
/// error's; the seed keeps anyone from choosing ids that collide on purpose without knowing it.
type Key = u128;

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
    ids: HashMap<Key, Entry>,
    /// Ids in claim order, for expiry: when each was claimed, and which (two queues: 24 bytes an
    /// id instead of a padded 32).
    order_at: VecDeque<u64>,
    order_key: VecDeque<Key>,
    /// Numbers claims, so that a stale ticket never completes a newer claim of its id.
    seq: u64,
}

/// The default of `serve --max-produce-ids`: about 130 bytes an id with the tables' slack
/// (docs/benchmarks.md, "Produce ids"), so 2,000,000 ids are ~250 MiB.
pub const MAX_IDS: usize = 2_000_000;

/// The ids every topic of a broker remembers, together (README, "Idempotent produce":
/// `serve --max-produce-ids`). A claim that would pass it makes its own topic forget its oldest
/// ids first, before their window ends: the window shrinks for the topic that grows, and a
/// producer is never refused for it (`mmmq-client` gives every message an id, so refusing would
/// cap the broker's throughput at the budget over the window). Ids past their window are freed
/// at the next claim of their shard, and by the retention pass for topics nobody produces to.
#[derive(Debug)]
pub struct IdBudget {
    max: AtomicUsize,
    used: AtomicUsize,
    forgotten_early: AtomicU64,
}

impl IdBudget {
    /// A budget of `max` ids.
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: AtomicUsize::new(max),
            used: AtomicUsize::new(0),
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

    fn add(&self) {
        self.used.fetch_add(1, Ordering::Relaxed);
    }

    fn remove(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}

/// Shards of a topic's ids: claims of different ids rarely wait for each other.
const SHARDS: usize = 16;

/// The ids of one topic within its window, sharded by the id's hash.
#[derive(Debug)]
pub struct Dedup {
    shards: Vec<Shard>,
    seed: u64,
    budget: Arc<IdBudget>,
    /// Whether the budget made this topic forget ids early (logged once per topic).
    capped: AtomicBool,
}

impl Default for Dedup {
    /// A topic alone with the default budget (tests, benchmarks).
    fn default() -> Self {
        Self::new(IdBudget::new(MAX_IDS))
    }
}

impl Drop for Dedup {
    /// A deleted topic's ids leave the budget with it.
    fn drop(&mut self) {
        self.budget.remove(self.len());
    }
}

impl Dedup {
    /// No ids yet; what it remembers counts against `budget`.
    pub fn new(budget: Arc<IdBudget>) -> Self {
        use std::hash::BuildHasher;
        Self {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            seed: std::collections::hash_map::RandomState::new().hash_one(0u64),
            budget,
            capped: AtomicBool::new(false),
        }
    }

    /// Forgets the ids past their window (`window_ms` before `now_ms`) in every shard: the
    /// retention pass frees the ids of topics nobody produces to.
    pub fn expire(&self, now_ms: u64, window_ms: u64) {
        let ctx = self.ctx();
        for s in &self.shards {
            Shard::expire(&mut s.inner.lock(), now_ms.saturating_sub(window_ms), &ctx);
        }
    }

    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            budget: &self.budget,
            capped: &self.capped,
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
        self.shard(key).claim(key, now_ms, window_ms, &self.ctx())
    }

    /// The append of a new claim stored its message at (`partition`, `offset`).
    pub fn stored(&self, ticket: &Ticket, partition: u32, offset: u64) {
        self.shard(ticket.key).stored(ticket, partition, offset)
    }

    /// The append of a new claim failed: the id is free again.
    pub fn withdraw(&self, ticket: &Ticket) {
        self.shard(ticket.key).withdraw(ticket, &self.budget)
    }

    /// Where the message of a pending claim went, once its append is done; `None` if it failed
    /// (the id is free again).
    pub async fn wait(&self, ticket: &Ticket) -> Option<(u32, u64)> {
        self.shard(ticket.key).wait(ticket).await
    }

    /// Remembers an id found in the log at boot.
    pub fn remember(&self, id: &str, at_ms: u64, partition: u32, offset: u64) {
        let key = self.key(id);
        self.shard(key)
            .remember(key, at_ms, partition, offset, &self.budget)
    }

    /// How many ids are remembered (tests, metrics).
    pub fn len(&self) -> usize {
        self.shards.iter().map(Shard::len).sum()
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

/// What a shard's expiry answers to: the broker's budget, and the topic's warned-once flag.
struct Ctx<'a> {
    budget: &'a IdBudget,
    capped: &'a AtomicBool,
}

impl Shard {
    /// Forgets the ids claimed before `horizon`, and, while the budget is full, the oldest of
    /// this shard however young (each one counted as forgotten early).
    fn expire(inner: &mut Inner, horizon: u64, ctx: &Ctx) {
        while let Some(&at) = inner.order_at.front() {
            let early = at >= horizon;
            if early && (ctx.budget.over() == 0 || inner.ids.is_empty()) {
                break;
            }
            inner.order_at.pop_front();
            let key = inner
                .order_key
                .pop_front()
                .expect("the queues have one length");
            if inner.ids.get(&key).is_some_and(|e| e.at_ms() == at) {
                inner.ids.remove(&key);
                ctx.budget.remove(1);
                if early {
                    ctx.budget.forgotten_early.fetch_add(1, Ordering::Relaxed);
                    if !ctx.capped.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            max = ctx.budget.max(),
                            "more produce ids than the broker remembers (--max-produce-ids): this topic's oldest are forgotten before their window ends"
                        );
                    }
                }
            }
        }
    }

    fn claim(&self, key: Key, now_ms: u64, window_ms: u64, ctx: &Ctx) -> Claim {
        let mut inner = self.inner.lock();
        Self::expire(&mut inner, now_ms.saturating_sub(window_ms), ctx);
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
        ctx.budget.add();
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
    fn withdraw(&self, ticket: &Ticket, budget: &IdBudget) {
        {
            let mut inner = self.inner.lock();
            if matches!(inner.ids.get(&ticket.key), Some(Entry::Pending { seq, .. }) if *seq == ticket.seq)
            {
                inner.ids.remove(&ticket.key);
                budget.remove(1);
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
    fn remember(&self, key: Key, at_ms: u64, partition: u32, offset: u64, budget: &IdBudget) {
        let mut inner = self.inner.lock();
        let entry = Entry::Stored {
            partition,
            offset,
            at: at_ms,
        };
        if inner.ids.insert(key, entry).is_none() {
            budget.add();
            inner.order_at.push_back(at_ms);
            inner.order_key.push_back(key);
        }
    }

    fn len(&self) -> usize {
        self.inner.lock().ids.len()
    }
}

/// Rebuilds `dedup` from what `partition` stored within the last `window_ms` (at boot: the ids of
/// a window survive a restart or a crash). Reads only the segments whose newest message is inside
/// the window. Blocking.
pub fn rebuild(
    dedup: &Dedup,
    partition: &super::Partition,
    window_ms: u64,
    now_ms: u64,
) -> Result<(), crate::storage::StorageError> {
    #[derive(serde::Deserialize)]
    struct IdAndTime {
        timestamp: u64,
        #[serde(default)]
        id: Option<String>,
    }
    let horizon = now_ms.saturating_sub(window_ms);
    let log = &partition.log;
    let segments = log.segments();
    let mut from = None;
    for s in segments.iter().rev().filter(|s| s.end > s.start) {
        let newest = log
            .read(s.end - 1)
            .ok()
            .flatten()
            .and_then(|p| serde_json::from_slice::<IdAndTime>(&p).ok());
        match newest {
            Some(m) if m.timestamp >= horizon => from = Some(s.start),
            _ => break,
        }
    }
    let Some(mut at) = from else {
        return Ok(());
    };
    let end = log.next_offset();
    while at < end {
        let entries = log.read_from(at, 1000, 8 << 20)?;
        let Some(last) = entries.last() else { break };
        at = last.offset + 1;
        for e in entries {
            let Ok(payload) = e.payload else { continue };
            if let Ok(IdAndTime {
                timestamp,
                id: Some(id),
            }) = serde_json::from_slice(&payload)
                && timestamp >= horizon
            {
                dedup.remember(&id, timestamp, partition.number, e.offset);
            }
        }
    }
    Ok(())
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

    /// The budget (README, "Idempotent produce": `--max-produce-ids`), over the shards of every
    /// topic: a claim that would pass it first forgets the oldest ids of its own shard, however
    /// young (counted, and warned once per topic); a shard with nothing to forget admits its
    /// claim. What a producer sees: a retry of a remembered id appends nothing and answers the
    /// first's position (`duplicate: true`); a retry of a forgotten one stores a second copy.
    /// Ids past their window are freed by [`Dedup::expire`], so an idle topic's do not hold the
    /// budget; a deleted topic's leave it.
    #[test]
    fn past_the_budget_a_claim_forgets_the_oldest_ids_of_its_shard_first() {
        let budget = IdBudget::new(4);
        let (capped, other_capped) = (AtomicBool::new(false), AtomicBool::new(false));
        let ctx = Ctx {
            budget: &budget,
            capped: &capped,
        };
        let window = u64::MAX;
        let (shard, other) = (Shard::default(), Shard::default());
        let store = |shard: &Shard, key: Key, ctx: &Ctx| {
            let Claim::New(t) = shard.claim(key, key as u64, window, ctx) else {
                panic!("{key} is new")
            };
            shard.stored(&t, 0, key as u64);
        };
        for key in 0..4 {
            store(&shard, key, &ctx);
        }
        assert_eq!((budget.used(), budget.forgotten_early()), (4, 0));
        assert!(!capped.load(Ordering::Relaxed), "nothing forgotten yet");
        // Full: the next claim forgets the oldest (0) first, and warns.
        store(&shard, 4, &ctx);
        assert_eq!((budget.used(), budget.forgotten_early()), (4, 1));
        assert!(capped.load(Ordering::Relaxed));
        // A retry of a remembered id is a duplicate (and makes room for one: 1 goes).
        assert!(matches!(
            shard.claim(3, 9, window, &ctx),
            Claim::Stored(0, 3)
        ));
        assert_eq!((shard.len(), budget.forgotten_early()), (3, 2));
        // A retry of the forgotten 0 stores it again.
        store(&shard, 0, &ctx);
        assert_eq!(budget.used(), 4);
        // Another topic's shard with nothing to forget admits its claim (one past the budget);
        // its next claim forgets its own oldest, not the first topic's ids.
        let other_ctx = Ctx {
            budget: &budget,
            capped: &other_capped,
        };
        store(&other, 100, &other_ctx);
        assert_eq!((budget.used(), other.len()), (5, 1));
        store(&other, 101, &other_ctx);
        assert_eq!((budget.used(), other.len(), shard.len()), (5, 1, 4));
        // Expiry by time frees the budget: all of the first shard's ids are older than 50.
        Shard::expire(&mut shard.inner.lock(), 50, &ctx);
        assert_eq!((budget.used(), shard.len()), (1, 0));
        // Ids found in the log at boot are kept past the budget until claims trim them.
        for key in 200..210 {
            shard.remember(key, 60, 0, key as u64, &budget);
        }
        assert_eq!(budget.used(), 11);
        store(&shard, 300, &ctx);
        assert_eq!((budget.used(), shard.len()), (4, 3));
    }

    /// A topic's ids leave the broker's budget when the topic goes (deleted, or closed).
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
        drop(d);
        assert_eq!(budget.used(), 0);
    }
}
