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

use parking_lot::Mutex;
use tokio::sync::watch;

/// Where a message went, once its append is done (`None` while it runs).
pub type Outcome = Option<Option<(u32, u64)>>;

/// A claim in progress: its appender publishes where the message went (or that it failed).
#[derive(Debug)]
pub struct Slot {
    outcome: watch::Sender<Outcome>,
}

impl Slot {
    /// The append stored the message at (`partition`, `offset`).
    pub fn stored(&self, partition: u32, offset: u64) {
        self.outcome.send_replace(Some(Some((partition, offset))));
    }

    /// Where the message of the first claim went, once known; `None` if its append failed.
    pub async fn wait(&self) -> Option<(u32, u64)> {
        let mut rx = self.outcome.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(v) => v.flatten(),
            Err(_) => None,
        }
    }
}

/// The result of claiming an id.
#[derive(Debug)]
pub enum Claim {
    /// First seen: append, then [`Dedup::stored`] (or [`Dedup::withdraw`] on failure).
    New(Arc<Slot>),
    /// Being appended by an earlier claim: [`Slot::wait`] for where it went.
    Pending(Arc<Slot>),
    /// Stored at (partition, offset).
    Stored(u32, u64),
}

/// What is remembered of one id: a claim in progress, or where its message went. A stored id
/// costs its string and 16 bytes.
#[derive(Debug)]
enum Entry {
    Pending(Arc<Slot>, u64),
    Stored(u32, u64, u64),
}

impl Entry {
    fn at_ms(&self) -> u64 {
        match self {
            Entry::Pending(_, at) | Entry::Stored(_, _, at) => *at,
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    ids: HashMap<String, Entry>,
    /// Ids in claim order, for expiry.
    order: VecDeque<(u64, String)>,
    /// Whether the cap was hit (it is logged once).
    capped: bool,
}

/// Most ids a topic remembers: past it the oldest are forgotten early (the window shrinks under
/// a load that would otherwise hold more ids than this in memory), and a warning says so.
pub const MAX_IDS: usize = 2_000_000;

/// Shards of a topic's ids: claims of different ids rarely wait for each other.
const SHARDS: usize = 16;

/// The ids of one topic within its window, sharded by the id's hash.
#[derive(Debug)]
pub struct Dedup {
    shards: Vec<Shard>,
    hasher: std::collections::hash_map::RandomState,
}

impl Default for Dedup {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            hasher: Default::default(),
        }
    }
}

impl Dedup {
    fn shard(&self, id: &str) -> &Shard {
        use std::hash::BuildHasher;
        &self.shards[(self.hasher.hash_one(id) % SHARDS as u64) as usize]
    }

    /// Claims `id` at `now_ms` with a window of `window_ms`.
    pub fn claim(&self, id: &str, now_ms: u64, window_ms: u64) -> Claim {
        self.shard(id).claim(id, now_ms, window_ms)
    }

    /// The append of a new claim stored its message at (`partition`, `offset`).
    pub fn stored(&self, id: &str, slot: &Arc<Slot>, partition: u32, offset: u64) {
        self.shard(id).stored(id, slot, partition, offset)
    }

    /// The append of a new claim failed: the id is free again.
    pub fn withdraw(&self, id: &str, slot: &Arc<Slot>) {
        self.shard(id).withdraw(id, slot)
    }

    /// Remembers an id found in the log at boot.
    pub fn remember(&self, id: String, at_ms: u64, partition: u32, offset: u64) {
        self.shard(&id).remember(id, at_ms, partition, offset)
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
}

impl Shard {
    fn expire(inner: &mut Inner, horizon: u64) {
        let mut over = inner.order.len().saturating_sub(MAX_IDS / SHARDS);
        if over > 0 && !inner.capped {
            inner.capped = true;
            tracing::warn!(
                ids = inner.order.len(),
                max = MAX_IDS,
                "more produce ids than a topic remembers: the oldest are forgotten before their window ends"
            );
        }
        while let Some((at, _)) = inner.order.front() {
            if *at >= horizon && over == 0 {
                break;
            }
            over = over.saturating_sub(1);
            let (at, id) = inner.order.pop_front().expect("front exists");
            if inner.ids.get(&id).is_some_and(|e| e.at_ms() == at) {
                inner.ids.remove(&id);
            }
        }
    }

    /// Claims `id` at `now_ms` with a window of `window_ms`.
    pub fn claim(&self, id: &str, now_ms: u64, window_ms: u64) -> Claim {
        let mut inner = self.inner.lock();
        Self::expire(&mut inner, now_ms.saturating_sub(window_ms));
        match inner.ids.get(id) {
            Some(Entry::Pending(slot, _)) => return Claim::Pending(slot.clone()),
            Some(Entry::Stored(p, o, _)) => return Claim::Stored(*p, *o),
            None => {}
        }
        let slot = Arc::new(Slot {
            outcome: watch::Sender::new(None),
        });
        inner
            .ids
            .insert(id.to_owned(), Entry::Pending(slot.clone(), now_ms));
        inner.order.push_back((now_ms, id.to_owned()));
        Claim::New(slot)
    }

    /// The append of a new claim stored its message at (`partition`, `offset`).
    pub fn stored(&self, id: &str, slot: &Arc<Slot>, partition: u32, offset: u64) {
        slot.stored(partition, offset);
        let mut inner = self.inner.lock();
        if let Some(e) = inner.ids.get_mut(id)
            && let Entry::Pending(s, at) = e
            && Arc::ptr_eq(s, slot)
        {
            *e = Entry::Stored(partition, offset, *at);
        }
    }

    /// The append of a new claim failed: the id is free again (waiters see the failure and
    /// claim it themselves).
    pub fn withdraw(&self, id: &str, slot: &Arc<Slot>) {
        slot.outcome.send_replace(Some(None));
        let mut inner = self.inner.lock();
        if matches!(inner.ids.get(id), Some(Entry::Pending(s, _)) if Arc::ptr_eq(s, slot)) {
            inner.ids.remove(id);
        }
    }

    /// Remembers an id found in the log at boot.
    pub fn remember(&self, id: String, at_ms: u64, partition: u32, offset: u64) {
        let mut inner = self.inner.lock();
        if inner
            .ids
            .insert(id.clone(), Entry::Stored(partition, offset, at_ms))
            .is_none()
        {
            inner.order.push_back((at_ms, id));
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
                dedup.remember(id, timestamp, partition.number, e.offset);
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
        d.stored("a", &first, 2, 7);
        assert_eq!(second.wait().await, Some((2, 7)));
        assert!(matches!(d.claim("a", 1020, 100), Claim::Stored(2, 7)));
        // Past the window the id is new again.
        assert!(matches!(d.claim("a", 1101, 100), Claim::New(_)));
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
        d.withdraw("a", &first);
        assert_eq!(waiter.wait().await, None);
        assert!(matches!(d.claim("a", 2, 100), Claim::New(_)));
        d.remember("b".into(), 5, 1, 3);
        assert!(matches!(d.claim("b", 6, 100), Claim::Stored(1, 3)));
    }
}
