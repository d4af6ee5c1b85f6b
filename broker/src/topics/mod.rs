//! The topic registry: each topic's log and checkpoints, created on first produce, restored at boot,
//! and announced to whoever wants to know about new topics (the dispatchers).
//!
//! A topic maps to one directory and one log per partition; the logs and their drain workers know
//! nothing about directories.
//!
//! - [`partition`]: a topic's partitions, their layout and the routing of a message to one.
//! - [`settings`]: a topic's configuration (`topic.json`, the `PUT` body), validated.
//! - [`retention`]: which segments retention deletes, and the pass that deletes them.
//! - `budget`: the cap on partitions over all topics (`--max-partitions`).
//! - `open`: opening topics, at boot and at creation, and the trash deletes go through.
//! - [`dedup`]: a topic's produce ids of its window; [`id_snapshot`] the file it is kept in,
//!   [`id_save`] when and how that is written, [`id_restore`] how boot reads it back.

mod budget;
pub mod dedup;
pub mod delivery;
mod id_budget;
pub mod id_restore;
pub mod id_save;
pub mod id_snapshot;
pub mod incarnation;
mod open;
pub mod partition;
pub mod retention;
pub mod settings;

pub use partition::{NoSuchPartition, Partition, TopicLog};

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mmmq_core::{Topic, TopicConfig, TopicId};
use parking_lot::{Mutex, RwLock};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::storage::{Limit, LogConfig, StorageError, Vfs};
use budget::PartitionBudget;
use open::{move_to_trash, open_topic, restore_all};

/// All topics of a root dir.
pub struct Registry {
    dir: PathBuf,
    vfs: Arc<dyn Vfs>,
    log_config: LogConfig,
    topics: RwLock<BTreeMap<Topic, Arc<TopicLog>>>,
    /// Serialises creation, so two first produces to one topic open one log (creation is rare),
    /// and counts the topics producers created, for the cap (topics are never removed yet).
    create: tokio::sync::Mutex<usize>,
    created: broadcast::Sender<Arc<TopicLog>>,
    /// Cap on topics producers can create (dead-letter topics are not counted).
    max_topics: usize,
    /// Partitions over all topics, against `--max-partitions`.
    partitions: PartitionBudget,
    /// The configuration of a topic without `topic.json` (`serve --default-…`).
    defaults: TopicConfig,
    /// Topics being deleted: not created again until their files are gone.
    deleting: Mutex<HashSet<Topic>>,
    /// One lock per topic under administration ([`Registry::administer`]).
    admin: Mutex<HashMap<Topic, Arc<tokio::sync::Mutex<()>>>>,
    /// The produce ids every topic remembers, together (`serve --max-produce-ids`).
    ids: Arc<dedup::IdBudget>,
    /// On a cluster member: where the broker's own appends go (docs/cluster.md, "Delivery in a
    /// cluster").
    cluster_append: std::sync::OnceLock<Arc<dyn delivery::ClusterAppend>>,
}

/// Held while one topic is administered: no other create, configure or delete of that topic
/// runs meanwhile ([`Registry::administer`]).
pub struct AdminGuard<'a> {
    registry: &'a Registry,
    topic: Topic,
    lock: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for AdminGuard<'_> {
    fn drop(&mut self) {
        let mut admin = self.registry.admin.lock();
        drop(self.lock.take());
        // The last one out removes the topic's lock: the map holds only topics in use.
        if let Some(l) = admin.get(&self.topic)
            && Arc::strong_count(l) == 1
        {
            admin.remove(&self.topic);
        }
    }
}

impl Registry {
    /// Opens every topic under `dir` (`{root}/topics`), recovering each log, with progress in the
    /// log when there is much to do. `interrupt` stops it between two topics (a SIGTERM during a
    /// long recovery): each topic is recovered whole or not touched.
    pub async fn restore(
        dir: PathBuf,
        vfs: Arc<dyn Vfs>,
        log_config: LogConfig,
        interrupt: CancellationToken,
    ) -> Result<Self, StorageError> {
        let (created, _) = broadcast::channel(1024);
        let ids = dedup::IdBudget::new(dedup::MAX_IDS);
        let mut registry = Self {
            dir,
            vfs,
            log_config,
            topics: RwLock::new(BTreeMap::new()),
            create: tokio::sync::Mutex::new(0),
            created,
            max_topics: usize::MAX,
            partitions: PartitionBudget::new(0),
            defaults: TopicConfig::default(),
            deleting: Mutex::new(HashSet::new()),
            admin: Mutex::new(HashMap::new()),
            ids: ids.clone(),
            cluster_append: std::sync::OnceLock::new(),
        };
        let dir = registry.dir.clone();
        let vfs = registry.vfs.clone();
        let config = registry.log_config.clone();
        let opened = tokio::task::spawn_blocking(move || {
            restore_all(&dir, (&*vfs, vfs.clone()), &config, &ids, &interrupt)
        })
        .await
        .expect("restore task panicked")?;
        *registry.create.lock().await = opened.values().filter(|t| t.counted).count();
        let partitions = opened.values().map(|t| t.partition_count() as usize).sum();
        *registry.topics.write() = opened;
        registry.partitions = PartitionBudget::new(partitions);
        Ok(registry)
    }

    /// Waits until no other administration of `topic` (create, configure, delete) runs, and holds
    /// it off until the guard is dropped. Without it two concurrent grows both read the old
    /// partition count and both open the new partitions: two writers on one directory.
    pub async fn administer(&self, topic: &Topic) -> AdminGuard<'_> {
        let lock = self.admin.lock().entry(topic.clone()).or_default().clone();
        let guard = lock.lock_owned().await;
        AdminGuard {
            registry: self,
            topic: topic.clone(),
            lock: Some(guard),
        }
    }

    /// The directory the topics are in (`{root-dir}/topics`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The topic, if it exists.
    pub fn get(&self, topic: &Topic) -> Option<Arc<TopicLog>> {
        self.topics.read().get(topic).cloned()
    }

    /// How many partitions a topic created without a configuration gets.
    pub fn default_partitions(&self) -> u32 {
        self.defaults.partitions
    }

    /// Makes the broker's own appends go through the cluster (set once, when it joins one).
    pub fn set_cluster_append(&self, append: Arc<dyn delivery::ClusterAppend>) {
        let _ = self.cluster_append.set(append);
    }

    /// On a cluster member, where the broker's own appends go.
    pub fn cluster_append(&self) -> Option<&Arc<dyn delivery::ClusterAppend>> {
        self.cluster_append.get()
    }

    /// Every topic, by name.
    pub fn all(&self) -> Vec<Arc<TopicLog>> {
        self.topics.read().values().cloned().collect()
    }

    /// How many topics exist.
    pub fn len(&self) -> usize {
        self.topics.read().len()
    }

    /// Sets the budget of produce ids over every topic (`serve --max-produce-ids`; boot keeps
    /// the ids it found past it).
    pub fn with_max_produce_ids(self, max: usize) -> Self {
        self.ids.set_max(max);
        self
    }

    /// The budget of produce ids every topic shares (status, metrics).
    pub fn produce_ids(&self) -> &dedup::IdBudget {
        &self.ids
    }

    /// Caps the topics producers can create; topics restored from disk are kept even past it.
    pub fn with_max_topics(mut self, max: usize) -> Self {
        self.max_topics = max;
        self
    }

    /// Caps the partitions over all topics; partitions restored from disk are kept even past it.
    pub fn with_max_partitions(mut self, max: usize) -> Self {
        self.partitions = self.partitions.with_max(max);
        self
    }

    /// Partitions over all topics (creations under way included), and their cap.
    pub fn partition_usage(&self) -> (usize, usize) {
        (self.partitions.used(), self.partitions.max())
    }

    /// The configuration of topics that have no `topic.json`.
    pub fn with_defaults(mut self, defaults: TopicConfig) -> Self {
        self.defaults = defaults;
        self
    }

    /// A topic's configuration: its `topic.json`, or the defaults.
    pub fn config_of(&self, t: &TopicLog) -> TopicConfig {
        let mut c = t
            .config
            .read()
            .clone()
            .unwrap_or_else(|| self.defaults.clone());
        // What exists is the truth: a topic made with other defaults keeps its partitions.
        c.partitions = t.partition_count();
        c
    }

    /// Durably stores a topic's new configuration in its `topic.json`, first creating the
    /// partitions it adds (a crash in between leaves partition directories that the next boot
    /// opens: the topic has at least the partitions any configuration it ever had asked for).
    /// Announces a grown topic again, so that dispatchers attach to its new partitions. Growth
    /// past `--max-partitions` is refused before anything is created or stored.
    pub async fn set_config(
        &self,
        t: &Arc<TopicLog>,
        config: TopicConfig,
    ) -> Result<(), StorageError> {
        let (have, id) = (t.partition_count(), t.id);
        let more = config.partitions.saturating_sub(have) as usize;
        let reserved =
            self.partitions
                .reserve(more, false)
                .map_err(|limit| StorageError::TopicLimit {
                    topic: t.topic.to_string(),
                    limit,
                    grown: true,
                })?;
        let (vfs, dir, stored, log_config) = (
            self.vfs.clone(),
            t.dir.clone(),
            config.clone(),
            self.log_config.clone(),
        );
        let added = tokio::task::spawn_blocking(move || {
            let added = (have..stored.partitions)
                .map(|p| partition::open_partition(&dir, id, p, &vfs, &log_config))
                .collect::<Result<Vec<_>, _>>()?;
            settings::store(&*vfs, &dir, &stored)?;
            Ok::<_, StorageError>(added)
        })
        .await
        .expect("config task panicked")?;
        let grew = !added.is_empty();
        let opened = added.len();
        t.extend(added)?;
        reserved.keep(opened);
        *t.config.write() = Some(config);
        if grew {
            tracing::info!(topic = %t.topic, partitions = t.partition_count(), "topic grew");
            let _ = self.created.send(t.clone());
        }
        Ok(())
    }

    /// Takes `topic` out of the registry for deletion: producers cannot create it again until
    /// [`Registry::finish_delete`]. `None` if there is no such topic.
    pub async fn begin_delete(&self, topic: &Topic) -> Option<Arc<TopicLog>> {
        let mut user_topics = self.create.lock().await;
        let t = self.topics.write().remove(topic)?;
        self.deleting.lock().insert(topic.clone());
        if t.counted {
            *user_topics = user_topics.saturating_sub(1);
        }
        self.partitions.release(t.partition_count() as usize);
        Some(t)
    }

    /// Removes a topic's files once nothing uses them (its workers stopped, its log closed):
    /// the directory is renamed into `{root}/trash` (one atomic step, made durable), then removed.
    /// A crash leaves either the whole topic or nothing of it in `topics/`; the trash is emptied
    /// at the next boot.
    pub async fn finish_delete(&self, t: &Arc<TopicLog>) -> Result<(), StorageError> {
        let (vfs, trash, retired) = (self.vfs.clone(), self.trash(), t.clone());
        let result = tokio::task::spawn_blocking(move || {
            // Checkpoint writes still running (a group's commit, a saver's last write) finish
            // first; later ones are refused rather than recreate the directory.
            retired.retire();
            move_to_trash(&*vfs, &retired.dir, &trash)
        })
        .await
        .expect("delete task panicked");
        self.deleting.lock().remove(&t.topic);
        result
    }

    fn trash(&self) -> PathBuf {
        self.dir.parent().unwrap_or(Path::new(".")).join("trash")
    }

    /// Whether there are no topics.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The topic, created (directory, first segment) if it does not exist yet.
    pub async fn get_or_create(&self, topic: &Topic) -> Result<Arc<TopicLog>, StorageError> {
        // The produce path: an existing topic costs one read lock, no allocation.
        if let Some(t) = self.get(topic) {
            return Ok(t);
        }
        let mut all = self.get_or_create_all(std::slice::from_ref(topic)).await?;
        Ok(all.pop().expect("one topic asked, one given"))
    }

    /// Every topic of `topics`, in order, creating the missing ones. All or none: when creating
    /// them would pass the topic cap, nothing is created and the first topic over it is named
    /// (a batch refused for the cap leaves no empty topics behind).
    pub async fn get_or_create_all(
        &self,
        topics: &[Topic],
    ) -> Result<Vec<Arc<TopicLog>>, StorageError> {
        self.get_or_create_as(topics, Creator::Broker).await
    }

    /// The topic, created by the topic API with `partitions` partitions if it does not exist:
    /// counted against the topic cap whatever its name (only the dead-letter and log topics the
    /// broker makes itself are exempt), and its partitions against the partition cap.
    pub async fn get_or_create_by_api(
        &self,
        topic: &Topic,
        partitions: u32,
    ) -> Result<Arc<TopicLog>, StorageError> {
        let mut all = self
            .get_or_create_as(std::slice::from_ref(topic), Creator::Api(partitions))
            .await?;
        Ok(all.pop().expect("one topic asked, one given"))
    }

    /// A cluster's topic as its metadata has it: created with `partitions` partitions and the
    /// metadata's id `id` if it does not exist here (counted as the topic API's are).
    pub async fn get_or_create_for_cluster(
        &self,
        topic: &Topic,
        partitions: u32,
        id: TopicId,
    ) -> Result<Arc<TopicLog>, StorageError> {
        let mut all = self
            .get_or_create_as(
                std::slice::from_ref(topic),
                Creator::Cluster(partitions, id),
            )
            .await?;
        Ok(all.pop().expect("one topic asked, one given"))
    }

    async fn get_or_create_as(
        &self,
        topics: &[Topic],
        creator: Creator,
    ) -> Result<Vec<Arc<TopicLog>>, StorageError> {
        if let Some(found) = topics
            .iter()
            .map(|t| self.get(t))
            .collect::<Option<Vec<_>>>()
        {
            return Ok(found);
        }
        let mut user_topics = self.create.lock().await;
        if let Some(t) = topics.iter().find(|t| self.deleting.lock().contains(*t)) {
            return Err(StorageError::Deleting {
                topic: t.to_string(),
            });
        }
        let missing: Vec<&Topic> = {
            let existing = self.topics.read();
            let mut missing: Vec<&Topic> = Vec::new();
            for t in topics {
                if !existing.contains_key(t) && !missing.contains(&t) {
                    missing.push(t);
                }
            }
            missing
        };
        // Dead-letter topics are exempt: there is at most one per dispatcher, and refusing one
        // would stall a dispatcher instead of refusing a producer. (Producers cannot name `__`
        // topics; the topic API can, and what it creates counts.)
        let exempt = |t: &Topic| creator == Creator::Broker && t.is_internal();
        let refused = |t: &Topic, limit| StorageError::TopicLimit {
            topic: t.to_string(),
            limit,
            grown: false,
        };
        let mut would_be = *user_topics;
        for t in &missing {
            if exempt(t) {
                continue;
            }
            if would_be >= self.max_topics {
                let limit = Limit::Topics {
                    max: self.max_topics,
                };
                return Err(refused(t, limit));
            }
            would_be += 1;
        }
        // A dead-letter topic has one partition, so its offsets are the order in which messages
        // failed and a redrive's `from`/`to` name them (docs/delivery.md, "Dead-letter redrive"); the topic
        // API can still grow it.
        let partitions = |t: &Topic| match creator {
            Creator::Api(n) | Creator::Cluster(n, _) => n,
            Creator::Broker if t.is_internal() => 1,
            Creator::Broker => self.defaults.partitions,
        };
        // Every new topic's partitions are reserved before any is created: all or none.
        let mut reserved = Vec::with_capacity(missing.len());
        for t in &missing {
            let r = self.partitions.reserve(partitions(t) as usize, exempt(t));
            reserved.push(r.map_err(|limit| refused(t, limit))?);
        }
        for (topic, reserved) in missing.into_iter().zip(reserved) {
            let dir = self.dir.join(topic.as_str());
            let vfs = self.vfs.clone();
            let config = self.log_config.clone();
            let topic_name = topic.clone();
            let ids = self.ids.clone();
            let partitions = partitions(topic);
            let given = match creator {
                Creator::Cluster(_, id) => Some(id),
                _ => None,
            };
            let t = tokio::task::spawn_blocking(move || {
                if !vfs.is_dir(&dir) {
                    incarnation::create_with(&*vfs, &dir, given)?;
                }
                open_topic(topic_name, dir, vfs, config, partitions, ids).map(|(t, _)| t)
            })
            .await
            .expect("topic creation panicked")?;
            let mut t = t;
            t.counted = !exempt(topic);
            reserved.keep(t.partition_count() as usize);
            let t = Arc::new(t);
            self.topics.write().insert(topic.clone(), t.clone());
            if t.counted {
                *user_topics += 1;
            }
            tracing::info!(topic = %topic, "topic created");
            // Nobody listening is fine: dispatchers attach to existing topics when they start.
            let _ = self.created.send(t);
        }
        let existing = self.topics.read();
        Ok(topics
            .iter()
            .map(|t| existing.get(t).cloned().expect("created above"))
            .collect())
    }

    /// Closes every log, leaving the exact on-disk layout (see [`crate::storage::Log::close`]),
    /// then writes each topic's id snapshot, so that the next boot reads no message to restore
    /// the ids; `false` if a log failed to close (it is logged), in which case the next boot must
    /// check every tail. (A snapshot that fails is logged: the next boot reads the messages.)
    pub async fn close_all(&self) -> bool {
        let mut ok = true;
        for t in self.all() {
            ok &= t.close().await;
            if let Err(e) = self.save_ids(&t).await {
                tracing::warn!(topic = %t.topic, error = %e, "cannot write the produce-id snapshot; the next boot reads the window's messages");
            }
        }
        ok
    }

    /// Writes `t`'s produce-id snapshot (`topics/{topic}/ids`) unless the one on disk is
    /// current; `true` if it wrote one.
    pub async fn save_ids(&self, t: &Arc<TopicLog>) -> Result<bool, StorageError> {
        let window = self.config_of(t).dedup_window_ms;
        id_save::save(self.vfs.clone(), t, window, mmmq_core::now_ms()).await
    }

    /// New topics as they are created. A receiver that lags must rescan [`Registry::all`].
    pub fn subscribe_created(&self) -> broadcast::Receiver<Arc<TopicLog>> {
        self.created.subscribe()
    }
}

/// Who creates a topic, for the caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Creator {
    /// A producer, or the broker itself (dead-letter and log topics).
    Broker,
    /// `PUT /mmmq/topics/{topic}`, with this many partitions.
    Api(u32),
    /// A cluster's metadata, with this many partitions and this id.
    Cluster(u32, TopicId),
}

#[cfg(test)]
mod id_tests;
#[cfg(test)]
mod tests;
