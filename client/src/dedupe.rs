//! Exactly-once processing for Rust consumers (docs/delivery.md, "Exactly-once consumers"): a durable record
//! of the messages a handler has finished, so that a message the broker delivers again — after a
//! crash, a lost commit, a member that lost its partitions — is acknowledged without running the
//! handler a second time.
//!
//! A message is named by (topic, partition, offset) within one incarnation of its topic: a topic
//! deleted and created again starts at offset 0 (docs/topics-and-groups.md, "Topics"), so the store keeps, per
//! partition, the topic id its ranges belong to (from the envelope's `topicId`), and a message of
//! another incarnation starts that partition's record afresh instead of being taken as finished.
//! (A store written before topic ids adopts the first id it sees.) Per partition the store keeps the finished offsets as sorted, disjoint ranges: in-order
//! delivery keeps one range, lanes (`maxInFlight`) keep a few open ones while their messages finish
//! out of order, and a message that failed (dead-lettered, so it may come back by a redrive) is a
//! gap. The ranges live in a [redb] database file (one table, one row per partition), committed
//! durably after the handler succeeds and before the ACK, and in memory for lookups.
//!
//! What it covers: everything the broker delivers again. What it cannot cover alone: the consumer
//! process dying between the end of a handler and the commit of its record (a window of one
//! commit); a handler whose effects must be exactly once across that too should make them
//! idempotent by the message's (topic, partition, offset) as well.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use mmmq_core::TopicId;
use redb::{ReadableTable, TableDefinition};

use crate::error::ClientError;

/// One message as the store names it: (topic, its incarnation if the broker said, partition,
/// offset).
pub type MessageRef<'a> = (&'a str, Option<TopicId>, u32, u64);

/// (topic, partition) → the finished offsets as `[start, end)` ranges, 16 bytes each.
const DONE: TableDefinition<(&str, u32), &[u8]> = TableDefinition::new("done");
/// (topic, partition) → the topic id (its text) the ranges in `done` belong to.
const INCARNATION: TableDefinition<(&str, u32), &str> = TableDefinition::new("incarnation");

/// Ranges kept per partition at most; past it the oldest gap is forgotten (its message counts as
/// finished) and a warning says so. Gaps are failed messages, so this is never reached by a
/// healthy consumer.
const MAX_RANGES: usize = 100_000;

/// One partition of one topic.
type Partition = (String, u32);

/// Finished offsets of one partition.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Ranges(Vec<(u64, u64)>);

impl Ranges {
    fn decode(bytes: &[u8]) -> Self {
        Self(
            bytes
                .chunks_exact(16)
                .map(|c| {
                    let (a, b) = c.split_at(8);
                    (
                        u64::from_le_bytes(a.try_into().expect("8 bytes")),
                        u64::from_le_bytes(b.try_into().expect("8 bytes")),
                    )
                })
                .collect(),
        )
    }

    fn encode(&self) -> Vec<u8> {
        self.0
            .iter()
            .flat_map(|&(s, e)| s.to_le_bytes().into_iter().chain(e.to_le_bytes()))
            .collect()
    }

    fn contains(&self, offset: u64) -> bool {
        let i = self.0.partition_point(|&(s, _)| s <= offset);
        i > 0 && offset < self.0[i - 1].1
    }

    /// Adds `offset`, merging with its neighbours; `false` if it was there.
    fn insert(&mut self, offset: u64) -> bool {
        if self.contains(offset) {
            return false;
        }
        let i = self.0.partition_point(|&(s, _)| s <= offset);
        let joins_left = i > 0 && self.0[i - 1].1 == offset;
        let joins_right = i < self.0.len() && self.0[i].0 == offset + 1;
        match (joins_left, joins_right) {
            (true, true) => {
                self.0[i - 1].1 = self.0[i].1;
                self.0.remove(i);
            }
            (true, false) => self.0[i - 1].1 += 1,
            (false, true) => self.0[i].0 = offset,
            (false, false) => self.0.insert(i, (offset, offset + 1)),
        }
        if self.0.len() > MAX_RANGES {
            tracing::warn!(
                forgotten = self.0[0].1,
                "exactly-once store: too many gaps in one partition; the oldest is taken as finished"
            );
            self.0[1].0 = self.0[0].0;
            self.0.remove(0);
        }
        true
    }
}

/// What the store holds of one partition: whose incarnation, and what is finished.
#[derive(Debug, Default, Clone)]
struct Record {
    incarnation: Option<TopicId>,
    ranges: Ranges,
}

impl Record {
    /// Whether the record is of `id`'s incarnation (or either is unknown).
    fn is_of(&self, id: Option<TopicId>) -> bool {
        match (self.incarnation, id) {
            (Some(have), Some(id)) => have == id,
            _ => true,
        }
    }
}

struct Inner {
    db: redb::Database,
    done: parking_lot::Mutex<HashMap<Partition, Record>>,
    /// Messages a handler is running for: a redelivery that arrives meanwhile (the broker
    /// restarted while the first call was running) waits for it instead of running twice.
    running: parking_lot::Mutex<HashSet<(Partition, u64)>>,
    finished: tokio::sync::Notify,
    duplicates: AtomicU64,
    writing: parking_lot::Mutex<()>,
}

/// A durable record of finished messages for [`crate::Consumer::exactly_once`] and
/// [`crate::GroupConsumer::exactly_once`]. Cheap to clone; one file per consumer (two consumers
/// of the same topics need two stores, or they would skip each other's messages).
#[derive(Clone)]
pub struct DedupeStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DedupeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DedupeStore")
            .field("duplicates", &self.duplicates())
            .finish_non_exhaustive()
    }
}

/// A message a handler is running for; dropping it lets a redelivery of the same message go on.
pub(crate) struct Running {
    store: DedupeStore,
    key: (Partition, u64),
}

impl Drop for Running {
    fn drop(&mut self) {
        self.store.inner.running.lock().remove(&self.key);
        self.store.inner.finished.notify_waiters();
    }
}

fn store_error(e: impl std::fmt::Display) -> ClientError {
    ClientError::Store(e.to_string())
}

impl DedupeStore {
    /// Opens (or creates) the store at `path` and reads it. Blocking: call it before serving, or
    /// from `spawn_blocking`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ClientError> {
        let db = redb::Database::create(path.as_ref()).map_err(store_error)?;
        let mut done: HashMap<Partition, Record> = HashMap::new();
        let txn = db.begin_write().map_err(store_error)?;
        {
            // Created if missing, so that a read of a new store finds an empty table.
            let table = txn.open_table(DONE).map_err(store_error)?;
            for row in table.iter().map_err(store_error)? {
                let (k, v) = row.map_err(store_error)?;
                let (topic, partition) = k.value();
                done.entry((topic.to_owned(), partition))
                    .or_default()
                    .ranges = Ranges::decode(v.value());
            }
            let table = txn.open_table(INCARNATION).map_err(store_error)?;
            for row in table.iter().map_err(store_error)? {
                let (k, v) = row.map_err(store_error)?;
                let (topic, partition) = k.value();
                done.entry((topic.to_owned(), partition))
                    .or_default()
                    .incarnation = v.value().parse().ok();
            }
        }
        txn.commit().map_err(store_error)?;
        Ok(Self {
            inner: Arc::new(Inner {
                db,
                done: parking_lot::Mutex::new(done),
                running: parking_lot::Mutex::default(),
                finished: tokio::sync::Notify::new(),
                duplicates: AtomicU64::new(0),
                writing: parking_lot::Mutex::new(()),
            }),
        })
    }

    /// Whether the message at `offset` of `partition` of `topic` was finished. With the topic's
    /// id (the envelope's `topicId`), a message of another incarnation than the one recorded is
    /// not.
    pub fn is_done(
        &self,
        topic: &str,
        topic_id: Option<TopicId>,
        partition: u32,
        offset: u64,
    ) -> bool {
        self.inner
            .done
            .lock()
            .get(&(topic.to_owned(), partition))
            .is_some_and(|r| r.is_of(topic_id) && r.ranges.contains(offset))
    }

    /// Messages delivered again and skipped because they were finished.
    pub fn duplicates(&self) -> u64 {
        self.inner.duplicates.load(Ordering::Relaxed)
    }

    pub(crate) fn count_duplicate(&self) {
        self.inner.duplicates.fetch_add(1, Ordering::Relaxed);
    }

    /// Waits until no handler runs for this message, then marks it running.
    pub(crate) async fn begin(&self, topic: &str, partition: u32, offset: u64) -> Running {
        let key = ((topic.to_owned(), partition), offset);
        loop {
            let notified = self.inner.finished.notified();
            if self.inner.running.lock().insert(key.clone()) {
                return Running {
                    store: self.clone(),
                    key,
                };
            }
            notified.await;
        }
    }

    /// Durably records these messages as finished (one commit). Blocking work runs off the async
    /// executor.
    pub async fn record(&self, messages: &[MessageRef<'_>]) -> Result<(), ClientError> {
        if messages.is_empty() {
            return Ok(());
        }
        let owned: Vec<(String, Option<TopicId>, u32, u64)> = messages
            .iter()
            .map(|&(t, id, p, o)| (t.to_owned(), id, p, o))
            .collect();
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.record_blocking(&owned))
            .await
            .map_err(store_error)?
    }

    fn record_blocking(
        &self,
        messages: &[(String, Option<TopicId>, u32, u64)],
    ) -> Result<(), ClientError> {
        // One record at a time (redb has one writer anyway), so that no other record commits
        // between reading the ranges and storing them back.
        let _one_writer = self.inner.writing.lock();
        // The records after the change; memory is updated only once the commit is durable.
        let mut changed: HashMap<Partition, Record> = HashMap::new();
        {
            let done = self.inner.done.lock();
            for (topic, id, partition, offset) in messages {
                let key = (topic.clone(), *partition);
                let record = changed
                    .entry(key.clone())
                    .or_insert_with(|| done.get(&key).cloned().unwrap_or_default());
                if !record.is_of(*id) {
                    // A new incarnation of the topic: the old one's offsets mean nothing now.
                    *record = Record::default();
                }
                if id.is_some() {
                    record.incarnation = *id;
                }
                record.ranges.insert(*offset);
            }
        }
        let txn = self.inner.db.begin_write().map_err(store_error)?;
        {
            let mut table = txn.open_table(DONE).map_err(store_error)?;
            for ((topic, partition), record) in &changed {
                table
                    .insert(
                        (topic.as_str(), *partition),
                        record.ranges.encode().as_slice(),
                    )
                    .map_err(store_error)?;
            }
            let mut table = txn.open_table(INCARNATION).map_err(store_error)?;
            for ((topic, partition), record) in &changed {
                if let Some(id) = record.incarnation {
                    table
                        .insert((topic.as_str(), *partition), id.to_string().as_str())
                        .map_err(store_error)?;
                }
            }
        }
        txn.commit().map_err(store_error)?;
        self.inner.done.lock().extend(changed);
        Ok(())
    }

    /// Reads the finished offsets back from the file, as a new process would (tests).
    #[cfg(test)]
    fn reread(&self, topic: &str, partition: u32) -> Ranges {
        use redb::ReadableDatabase;
        let txn = self.inner.db.begin_read().unwrap();
        let table = txn.open_table(DONE).unwrap();
        table
            .get((topic, partition))
            .unwrap()
            .map(|v| Ranges::decode(v.value()))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_keep_gaps() {
        let mut r = Ranges::default();
        for o in [0, 1, 2, 5, 4, 7] {
            assert!(r.insert(o));
        }
        assert!(!r.insert(4));
        assert_eq!(r.0, [(0, 3), (4, 6), (7, 8)]);
        assert!(r.insert(3));
        assert!(r.insert(6));
        assert_eq!(r.0, [(0, 8)]);
        assert!(r.contains(0) && r.contains(7) && !r.contains(8));
        assert_eq!(Ranges::decode(&r.encode()), r);
    }

    #[tokio::test]
    async fn what_is_recorded_survives_a_reopen_and_nothing_else_is_done() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("done.redb");
        let store = DedupeStore::open(&path).unwrap();
        store
            .record(&[
                ("t", None, 0, 0),
                ("t", None, 0, 1),
                ("t", None, 1, 9),
                ("u", None, 0, 3),
            ])
            .await
            .unwrap();
        assert_eq!(store.reread("t", 0).0, [(0, 2)]);
        drop(store);
        let store = DedupeStore::open(&path).unwrap();
        assert!(
            store.is_done("t", None, 0, 1)
                && store.is_done("t", None, 1, 9)
                && store.is_done("u", None, 0, 3)
        );
        assert!(
            !store.is_done("t", None, 0, 2)
                && !store.is_done("t", None, 1, 8)
                && !store.is_done("v", None, 0, 0)
        );
    }

    /// A topic deleted and created again starts at offset 0 under a new id (docs/topics-and-groups.md, "Topics"):
    /// its messages are not the old incarnation's, which the store used to skip as finished.
    #[tokio::test]
    async fn a_new_incarnation_of_a_topic_is_not_taken_for_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("done.redb");
        let (old, new) = (TopicId::from_bytes([1; 16]), TopicId::from_bytes([2; 16]));
        let store = DedupeStore::open(&path).unwrap();
        store
            .record(&[("t", Some(old), 0, 0), ("t", Some(old), 0, 1)])
            .await
            .unwrap();
        assert!(store.is_done("t", Some(old), 0, 1));
        assert!(!store.is_done("t", Some(new), 0, 0), "another incarnation");
        store.record(&[("t", Some(new), 0, 0)]).await.unwrap();
        drop(store);
        let store = DedupeStore::open(&path).unwrap();
        assert!(store.is_done("t", Some(new), 0, 0));
        assert!(!store.is_done("t", Some(new), 0, 1));
        assert!(
            !store.is_done("t", Some(old), 0, 1),
            "the old record is gone"
        );
    }
}
