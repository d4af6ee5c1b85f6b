//! Idempotent produce (README, "Idempotent produce"): the ids a topic has seen within its
//! `dedupWindowMs`, per topic (a keyless retry may be routed to another partition), rebuilt from
//! the log at boot.
//!
//! A produce with an id claims it: the first claim appends and then publishes where the message
//! went; a claim of the same id meanwhile (a retry racing its original, a duplicate later in the
//! same batch) waits for that and answers the same position, appending nothing. A failed append
//! withdraws its claim, so a retry stores the message.

use std::collections::{HashMap, VecDeque};

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

/// Most ids a topic remembers: past it the oldest are forgotten early (the window shrinks under
/// a load that would otherwise hold more ids than this in memory), and a warning says so. About
/// 130 bytes an id with the tables' slack (docs/benchmarks.md, "Produce ids"): 2,000,000 ids are
/// ~250 MiB.
pub const MAX_IDS: usize = 2_000_000;

/// Shards of a topic's ids: claims of different ids rarely wait for each other.
const SHARDS: usize = 16;

/// The ids of one topic within its window, sharded by the id's hash.
#[derive(Debug)]
pub struct Dedup {
    shards: Vec<Shard>,
    seed: u64,
    /// Whether the cap was hit (logged once per topic).
    capped: std::sync::atomic::AtomicBool,
}

impl Default for Dedup {
    fn default() -> Self {
        use std::hash::BuildHasher;
        Self {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            seed: std::collections::hash_map::RandomState::new().hash_one(0u64),
            capped: Default::default(),
        }
    }
}

impl Dedup {
    fn key(&self, id: &str) -> Key {
        xxhash_rust::xxh3::xxh3_128_with_seed(id.as_bytes(), self.seed)
    }

    fn shard(&self, key: Key) -> &Shard {
        &self.shards[(key as usize) % SHARDS]
    }

    /// Claims `id` at `now_ms` with a window of `window_ms`.
    pub fn claim(&self, id: &str, now_ms: u64, window_ms: u64) -> Claim {
        let key = self.key(id);
        self.shard(key).claim(key, now_ms, window_ms, &self.capped)
    }

    /// The append of a new claim stored its message at (`partition`, `offset`).
    pub fn stored(&self, ticket: &Ticket, partition: u32, offset: u64) {
        self.shard(ticket.key).stored(ticket, partition, offset)
    }

    /// The append of a new claim failed: the id is free again.
    pub fn withdraw(&self, ticket: &Ticket) {
        self.shard(ticket.key).withdraw(ticket)
    }

    /// Where the message of a pending claim went, once its append is done; `None` if it failed
    /// (the id is free again).
    pub async fn wait(&self, ticket: &Ticket) -> Option<(u32, u64)> {
        self.shard(ticket.key).wait(ticket).await
    }

    /// Remembers an id found in the log at boot.
    pub fn remember(&self, id: &str, at_ms: u64, partition: u32, offset: u64) {
        let key = self.key(id);
        self.shard(key).remember(key, at_ms, partition, offset)
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

impl Shard {
    fn expire(inner: &mut Inner, horizon: u64, capped: &std::sync::atomic::AtomicBool) {
        let mut over = inner.order_at.len().saturating_sub(MAX_IDS / SHARDS);
        if over > 0 && !capped.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(
                max = MAX_IDS,
                "more produce ids than a topic remembers: the oldest are forgotten before their window ends"
            );
        }
        while let Some(&at) = inner.order_at.front() {
            if at >= horizon && over == 0 {
                break;
            }
            over = over.saturating_sub(1);
            inner.order_at.pop_front();
            let key = inner
                .order_key
                .pop_front()
                .expect("the queues have one length");
            if inner.ids.get(&key).is_some_and(|e| e.at_ms() == at) {
                inner.ids.remove(&key);
            }
        }
    }

    fn claim(
        &self,
        key: Key,
        now_ms: u64,
        window_ms: u64,
        capped: &std::sync::atomic::AtomicBool,
    ) -> Claim {
        let mut inner = self.inner.lock();
        Self::expire(&mut inner, now_ms.saturating_sub(window_ms), capped);
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
    fn withdraw(&self, ticket: &Ticket) {
        {
            let mut inner = self.inner.lock();
            if matches!(inner.ids.get(&ticket.key), Some(Entry::Pending { seq, .. }) if *seq == ticket.seq)
            {
                inner.ids.remove(&ticket.key);
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

    fn remember(&self, key: Key, at_ms: u64, partition: u32, offset: u64) {
        let mut inner = self.inner.lock();
        let entry = Entry::Stored {
            partition,
            offset,
            at: at_ms,
        };
        if inner.ids.insert(key, entry).is_none() {
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

    /// The cap (README, "Idempotent produce": at most 2,000,000 ids a topic, the oldest forgotten
    /// first, a warning once). Each of the shards keeps its share; a claim first forgets the
    /// oldest ids past the share, then looks its own up, then adds it if new: a shard holds at
    /// most its share + 1 (a topic 2,000,016, as docs/benchmarks.md, "Produce ids", measured).
    /// What a producer sees: a retry of a remembered id appends nothing and answers the first's
    /// position (`duplicate: true`); a retry of a forgotten one stores a second copy.
    #[test]
    fn past_the_cap_a_claim_forgets_the_oldest_ids_first() {
        use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
        const SHARE: Key = (MAX_IDS / SHARDS) as Key;
        // Ids of one shard, chosen by their keys; none expires by time.
        let (shard, capped, window) = (Shard::default(), AtomicBool::new(false), u64::MAX);
        let claim = |key: Key| shard.claim(key, 1, window, &capped);
        let store = |key: Key| {
            let Claim::New(t) = claim(key) else {
                panic!("{key} is new")
            };
            shard.stored(&t, 0, key as u64);
        };
        for key in 0..=SHARE {
            store(key);
        }
        assert_eq!(shard.len(), SHARE as usize + 1);
        assert!(!capped.load(Relaxed), "nothing forgotten yet");
        // Full: the next claim forgets the oldest (0) first, and warns.
        store(SHARE + 1);
        assert!(capped.load(Relaxed));
        assert_eq!(shard.len(), SHARE as usize + 1);
        // A retry of a remembered id is a duplicate (and forgets the oldest left, 1).
        assert!(matches!(claim(5), Claim::Stored(0, 5)));
        assert_eq!(shard.len(), SHARE as usize);
        // A retry of the forgotten 0 stores again; 1 is forgotten too.
        store(0);
        store(1);
        assert_eq!(shard.len(), SHARE as usize + 1);
        // Full, even a retry of the oldest remembered id (3) forgets it before looking it up.
        store(3);
        // Ids found in the log at boot are kept past the cap until the next claim trims them,
        // oldest first.
        let boot = Shard::default();
        for key in 0..SHARE + 10 {
            boot.remember(key, 1, 0, key as u64);
        }
        assert_eq!(boot.len(), SHARE as usize + 10);
        assert!(matches!(
            boot.claim(SHARE + 10, 1, window, &capped),
            Claim::New(_)
        ));
        assert_eq!(boot.len(), SHARE as usize + 1);
        assert!(matches!(
            boot.claim(11, 1, window, &capped),
            Claim::Stored(0, 11)
        ));
        assert!(matches!(boot.claim(9, 1, window, &capped), Claim::New(_)));
    }
}
