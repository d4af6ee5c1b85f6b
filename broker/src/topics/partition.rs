//! A topic's partitions (docs/topics-and-groups.md, "Topics"): each is its own log with its own group commit and its
//! own checkpoints. Partition 0 keeps the MMMQ layout in `topics/{topic}/`, byte for byte;
//! partition `p ≥ 1` lives in `topics/{topic}/partitions/{p}/` with the same files. Nothing below
//! this module knows that partitions belong to a topic.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use mmmq_core::{Topic, TopicConfig, TopicId, partition_for_key};
use parking_lot::RwLock;

use crate::storage::{Checkpoints, Log, LogConfig, StorageError, Vfs};

/// The directory holding partitions 1 and up, inside the topic's directory.
pub const PARTITIONS_DIR: &str = "partitions";

/// One partition: a log and its dispatchers' checkpoints.
#[derive(Debug)]
pub struct Partition {
    /// Its number, from 0.
    pub number: u32,
    /// The id of its topic's incarnation (docs/topics-and-groups.md, "Topics").
    pub topic_id: TopicId,
    /// Its messages.
    pub log: Log,
    /// Its dispatchers' positions.
    pub checkpoints: Checkpoints,
    /// In a cluster: who may deliver it, and its replicated positions (docs/cluster.md,
    /// "Delivery in a cluster").
    pub delivery: super::delivery::DeliverySlot,
}

/// The directory of partition `p` of the topic in `topic_dir`.
pub fn partition_dir(topic_dir: &Path, p: u32) -> PathBuf {
    if p == 0 {
        topic_dir.to_owned()
    } else {
        topic_dir.join(PARTITIONS_DIR).join(p.to_string())
    }
}

/// Opens (or creates) partition `p` of the topic in `topic_dir`. Blocking.
pub fn open_partition(
    topic_dir: &Path,
    topic_id: TopicId,
    p: u32,
    vfs: &Arc<dyn Vfs>,
    config: &LogConfig,
) -> Result<Partition, StorageError> {
    let dir = partition_dir(topic_dir, p);
    let log = Log::open(&dir, vfs.clone(), config.clone())?;
    Ok(Partition {
        number: p,
        topic_id,
        log,
        checkpoints: Checkpoints::new(dir.join("checkpoints"), vfs.clone()),
        delivery: Default::default(),
    })
}

/// How many partitions exist on disk in `topic_dir`: partition 0, and each `partitions/{p}` in a
/// run from 1 (a directory a crash left while a topic grew counts: its log opens empty).
pub fn partitions_on_disk(vfs: &dyn Vfs, topic_dir: &Path) -> u32 {
    let dir = topic_dir.join(PARTITIONS_DIR);
    let mut n = 1;
    while vfs.is_dir(&dir.join(n.to_string())) {
        n += 1;
    }
    n
}

/// A topic's storage: its partitions, configuration and directory.
#[derive(Debug)]
pub struct TopicLog {
    /// The topic.
    pub topic: Topic,
    /// This incarnation's id (docs/topics-and-groups.md, "Topics"; [`super::incarnation`]).
    pub id: TopicId,
    /// Its directory (partition 0's).
    pub dir: PathBuf,
    /// Its partitions, in order; they only ever grow.
    partitions: RwLock<Vec<Arc<Partition>>>,
    /// Its `topic.json`, `None` when it has none (the broker's defaults apply).
    pub(super) config: RwLock<Option<TopicConfig>>,
    /// Where the next keyless message goes.
    round_robin: AtomicU32,
    /// Produce ids seen within the topic's `dedupWindowMs`.
    pub dedup: super::dedup::Dedup,
    /// What is on disk of its snapshot of `dedup` (`topics/{topic}/ids`).
    pub(super) ids_file: super::id_save::Saved,
    /// Whether it counts against `--max-topics` (decided when it was created or restored).
    pub(super) counted: bool,
}

/// A produce names a partition the topic does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("topic {topic:?} has no partition {partition} (it has {count}: 0–{last})", last = count - 1)]
pub struct NoSuchPartition {
    /// The topic.
    pub topic: String,
    /// The partition asked for.
    pub partition: u32,
    /// How many the topic has.
    pub count: u32,
}

impl TopicLog {
    pub(super) fn new(
        topic: Topic,
        id: TopicId,
        dir: PathBuf,
        partitions: Vec<Partition>,
        config: Option<TopicConfig>,
        dedup: super::dedup::Dedup,
        ids_file: super::id_save::Saved,
    ) -> Self {
        Self {
            topic,
            id,
            dir,
            partitions: RwLock::new(partitions.into_iter().map(Arc::new).collect()),
            config: RwLock::new(config),
            round_robin: AtomicU32::new(0),
            dedup,
            ids_file,
            counted: true,
        }
    }

    /// Every partition, in order.
    pub fn partitions(&self) -> Vec<Arc<Partition>> {
        self.partitions.read().clone()
    }

    /// Partition `p`, if the topic has it.
    pub fn partition(&self, p: u32) -> Option<Arc<Partition>> {
        self.partitions.read().get(p as usize).cloned()
    }

    /// How long its produce ids are remembered: its own `dedupWindowMs`, else the default (a
    /// cluster's topics always have their own, from the metadata).
    pub fn dedup_window_ms(&self) -> u64 {
        self.config.read().as_ref().map_or_else(
            || mmmq_core::TopicConfig::default().dedup_window_ms,
            |c| c.dedup_window_ms,
        )
    }

    /// Partition 0: the one every topic has.
    pub fn first(&self) -> Arc<Partition> {
        self.partitions.read()[0].clone()
    }

    /// How many partitions the topic has.
    pub fn partition_count(&self) -> u32 {
        self.partitions.read().len() as u32
    }

    /// Where a message goes: `explicit` if given (and it exists), else by its key as Kafka's
    /// default partitioner would put it, else the next partition in turn.
    pub fn route(
        &self,
        explicit: Option<u32>,
        key: Option<&str>,
    ) -> Result<Arc<Partition>, NoSuchPartition> {
        let partitions = self.partitions.read();
        let count = partitions.len() as u32;
        let p = match (explicit, key) {
            (Some(p), _) => p,
            (None, Some(key)) => partition_for_key(key, count),
            (None, None) if count == 1 => 0,
            (None, None) => self.round_robin.fetch_add(1, Ordering::Relaxed) % count,
        };
        partitions
            .get(p as usize)
            .cloned()
            .ok_or_else(|| NoSuchPartition {
                topic: self.topic.to_string(),
                partition: p,
                count,
            })
    }

    /// Closes every partition's log (see [`Log::close`]); `false` if one failed (logged).
    pub async fn close(&self) -> bool {
        let mut ok = true;
        for p in self.partitions() {
            if let Err(e) = p.log.close().await {
                tracing::warn!(topic = %self.topic, partition = p.number, error = %e, "closing the log failed");
                ok = false;
            }
        }
        ok
    }

    /// Refuses every later checkpoint write of every partition (see
    /// [`Checkpoints::retire`]) and every later id snapshot: the topic is being deleted.
    /// Blocking.
    pub fn retire(&self) {
        for p in self.partitions.read().iter() {
            p.checkpoints.retire();
        }
        self.ids_file.retire();
    }

    /// Adds opened partitions at the end (the topic grew). Refuses partitions that do not
    /// continue the topic's numbering: two opens of one partition would be two writers appending
    /// to one directory, each at its own position. (Administration is serialised per topic, so
    /// this is a last line of defence, not the guard.)
    pub(super) fn extend(&self, more: Vec<Partition>) -> Result<(), StorageError> {
        let mut partitions = self.partitions.write();
        if let Some(p) = more.first()
            && p.number as usize != partitions.len()
        {
            return Err(StorageError::Inconsistent {
                path: partition_dir(&self.dir, p.number),
                reason: format!(
                    "partition {} was opened twice (the topic has {} partitions)",
                    p.number,
                    partitions.len()
                ),
            });
        }
        partitions.extend(more.into_iter().map(Arc::new));
        Ok(())
    }
}
