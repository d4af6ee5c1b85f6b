//! Pull consumer groups (docs/topics-and-groups.md, "Consumer groups"; seed 004's consumer groups over HTTP): members
//! join by polling, share the partitions of the topics a pattern matches — each partition owned
//! by one member at a time, balanced over the live members — and the broker keeps the group's
//! committed offsets, durably, next to the partition's dispatcher checkpoints
//! (`checkpoints/groups/{group}.checkpoint`, the same 8-byte format).
//!
//! A member that has not polled for its session timeout is removed and its partitions go to the
//! others, which start at the group's committed offset: delivery within a group is
//! at-least-once. A commit for a partition the member no longer owns is refused (`409`).
//!
//! Everything a group holds about a partition is keyed by its topic's incarnation (docs/topics-and-groups.md,
//! "Topics": topic ids) as well as its name: a topic deleted and created again is new to the
//! group, which starts it at offset 0 (the committed offsets went with the old one's files), and
//! a commit that names the old incarnation's id is refused. Committed offsets are read from disk
//! on a blocking thread, never under the lock every group shares. A group with no members is
//! forgotten after [`EMPTY_GROUP_TTL`] (its commits stay on disk and come back at its next poll).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mmmq_core::{ConsumerId, GroupPoll, GroupStatus, Topic, TopicId, TopicPartition, TopicPattern};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::metrics::{DispatchLabel, Metrics};
use crate::storage::{Checkpoints, StorageError};
use crate::topics::{Partition, Registry};

mod cluster;
pub mod commit;
#[cfg(test)]
mod commit_tests;
mod read;
mod status;

use read::read_owned;

/// Default `sessionTimeoutMs`.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// Most messages one poll answers.
const MAX_POLL: usize = 1000;
/// Most live members of one group: each is walked on every poll of the group, and a member
/// name lives for its session timeout (up to an hour) after its last poll.
pub const MAX_MEMBERS: usize = 1_000;
/// How long a group without members stays in memory (and in `GET /mmmq/groups`).
pub const EMPTY_GROUP_TTL: Duration = Duration::from_secs(600);

/// Why a group request was refused.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// A bad group or member name, pattern or parameter (`400`).
    #[error("{0}")]
    Invalid(String),
    /// No such group (`404`).
    #[error("no group {0:?}")]
    Unknown(String),
    /// A commit for a partition the member does not own (`409`).
    #[error(
        "{member:?} does not own {topic} partition {partition} (any more); its offsets were not committed"
    )]
    NotOwner {
        /// The member.
        member: String,
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
    },
    /// A new group past `serve --max-groups` (`503`: groups without members go after
    /// [`EMPTY_GROUP_TTL`], so a later poll may get in).
    #[error(
        "the broker holds {max} groups (--max-groups); group {group:?} cannot start until one goes (a group without members is forgotten {} s after its last poll)",
        EMPTY_GROUP_TTL.as_secs()
    )]
    Limit {
        /// The group refused.
        group: String,
        /// The cap.
        max: usize,
    },
    /// A new member past [`MAX_MEMBERS`] (`503`: members that stop polling leave after their
    /// session timeout).
    #[error(
        "group {group:?} has {max} live members, the most a group takes; a new member can join once one leaves or its session times out"
    )]
    Members {
        /// The group.
        group: String,
        /// The cap.
        max: usize,
    },
    /// The disk said no.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The cluster could not do it now (a commit through the metadata group, a read through a
    /// partition's leader).
    #[error(transparent)]
    Cluster(#[from] crate::cluster::node::ClusterError),
}

/// A partition of one incarnation of a topic.
type Key = (Topic, TopicId, u32);

fn key_of(topic: &Topic, p: &Partition) -> Key {
    (topic.clone(), p.topic_id, p.number)
}

fn topic_partition(k: &Key) -> TopicPartition {
    TopicPartition {
        topic: k.0.to_string(),
        partition: k.2,
        topic_id: Some(k.1),
    }
}

struct Member {
    last_poll: Instant,
    session_timeout: Duration,
}

struct Group {
    pattern: TopicPattern,
    members: BTreeMap<String, Member>,
    /// Owner of each partition the group consumes.
    owner: BTreeMap<Key, String>,
    /// The owner's fetch position in each partition.
    position: HashMap<Key, u64>,
    /// Committed next offsets (loaded from disk on first use).
    committed: HashMap<Key, u64>,
    /// Messages retention deleted before the group read them, per partition (docs/topics-and-groups.md,
    /// "Retention": behind the horizon).
    skipped: HashMap<Key, u64>,
    /// Since when it has had no members.
    empty_since: Option<Instant>,
}

impl Group {
    /// Drops the members that have not polled within their session timeout.
    fn drop_expired(&mut self, now: Instant) {
        self.members
            .retain(|_, m| now.duration_since(m.last_poll) <= m.session_timeout);
    }
}

/// Every group of a broker.
pub struct Groups {
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    groups: Mutex<BTreeMap<String, Group>>,
    /// `serve --max-groups`: each group holds a position per partition it consumes, so their
    /// number is capped.
    max: usize,
    /// The cluster, when this broker is a member (`cluster`).
    cluster: std::sync::OnceLock<crate::cluster::node::Cluster>,
    /// The metadata group's term the groups in memory were served in (`cluster`).
    served_term: Mutex<u64>,
    /// Kafka's consumer groups, shown beside these (docs/kafka.md, "Consumer groups").
    kafka: std::sync::OnceLock<Arc<dyn KafkaGroups>>,
}

/// What `GET /mmmq/groups` shows of Kafka's consumer groups; set once by the Kafka listener.
#[async_trait::async_trait]
pub trait KafkaGroups: Send + Sync {
    /// Every Kafka group's status.
    async fn statuses(&self) -> Vec<GroupStatus>;
}

fn name(kind: &str, s: &str) -> Result<String, GroupError> {
    ConsumerId::new(s)
        .map(|id| id.to_string())
        .map_err(|e| GroupError::Invalid(format!("{kind}: {e}")))
}

fn store(p: &Partition) -> Checkpoints {
    p.checkpoints.nested("groups")
}

impl Groups {
    /// Shows Kafka's consumer groups beside these (once; a second call is ignored).
    pub fn show_kafka_groups(&self, kafka: Arc<dyn KafkaGroups>) {
        let _ = self.kafka.set(kafka);
    }

    /// No groups yet; at most `max` at once.
    pub fn new(registry: Arc<Registry>, metrics: Arc<Metrics>, max: usize) -> Self {
        Self {
            registry,
            metrics,
            groups: Mutex::new(BTreeMap::new()),
            max,
            cluster: std::sync::OnceLock::new(),
            served_term: Mutex::new(0),
            kafka: std::sync::OnceLock::new(),
        }
    }

    /// Groups held now (metrics).
    pub fn len(&self) -> usize {
        self.groups.lock().len()
    }

    /// Whether no group is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cap (`--max-groups`).
    pub fn max(&self) -> usize {
        self.max
    }

    /// The partitions of the topics `pattern` matches, in order.
    fn partitions(&self, pattern: &TopicPattern) -> Vec<(Key, Arc<Partition>)> {
        self.registry
            .all()
            .into_iter()
            .filter(|t| pattern.matches(&t.topic))
            .flat_map(|t| {
                t.partitions()
                    .into_iter()
                    .map(move |p| (key_of(&t.topic, &p), p))
            })
            .collect()
    }

    /// Reads from disk, on a blocking thread, the committed offsets of `group`'s partitions it
    /// has not read yet (a partition new to it: a new topic, one that grew, a new incarnation).
    async fn load_committed(&self, group: &str) -> Result<(), GroupError> {
        let missing: Vec<(Key, Arc<Partition>)> = {
            let groups = self.groups.lock();
            let Some(g) = groups.get(group) else {
                return Ok(());
            };
            self.partitions(&g.pattern)
                .into_iter()
                .filter(|(k, _)| !g.committed.contains_key(k))
                .collect()
        };
        if missing.is_empty() {
            return Ok(());
        }
        if let Some(cluster) = self.cluster() {
            if let Some(g) = self.groups.lock().get_mut(group) {
                for (k, _) in missing {
                    let committed = Self::committed_in_metadata(cluster, group, &k);
                    g.committed.entry(k).or_insert(committed);
                }
            }
            return Ok(());
        }
        let id = ConsumerId::new(group).map_err(|e| GroupError::Invalid(e.to_string()))?;
        let read = tokio::task::spawn_blocking(move || {
            missing
                .into_iter()
                .map(|(k, p)| {
                    // An unreadable commit costs that partition's position (it starts at 0, at
                    // least once), not the whole group.
                    let committed = store(&p).read(&id).unwrap_or_else(|e| {
                        tracing::warn!(group = %id, topic = %k.0, partition = k.2, error = %e, "cannot read the group's committed offset; the partition starts at 0");
                        None
                    });
                    (k, committed.unwrap_or(0))
                })
                .collect::<Vec<_>>()
        })
        .await
        .expect("group read task panicked");
        if let Some(g) = self.groups.lock().get_mut(group) {
            for (k, committed) in read {
                g.committed.entry(k).or_insert(committed);
            }
        }
        Ok(())
    }

    /// Drops expired members and balances the partitions over the live ones (sorted members,
    /// partitions dealt round robin); a partition that changes owner starts at the committed
    /// offset. What the group held of partitions that are gone (a deleted topic's old
    /// incarnation) is dropped.
    fn rebalance(&self, g: &mut Group, now: Instant) {
        g.drop_expired(now);
        if g.members.is_empty() {
            g.empty_since.get_or_insert(now);
        } else {
            g.empty_since = None;
        }
        let partitions = self.partitions(&g.pattern);
        let live: std::collections::HashSet<&Key> = partitions.iter().map(|(k, _)| k).collect();
        g.committed.retain(|k, _| live.contains(k));
        g.position.retain(|k, _| live.contains(k));
        g.skipped.retain(|k, _| live.contains(k));
        let members: Vec<&String> = g.members.keys().collect();
        let mut owner = BTreeMap::new();
        if !members.is_empty() {
            for (i, (key, _)) in partitions.iter().enumerate() {
                let m = members[i % members.len()].clone();
                if g.owner.get(key) != Some(&m) {
                    // Read by `load_committed` before; a partition that appeared since then is
                    // new, with nothing committed.
                    let committed = g.committed.get(key).copied().unwrap_or(0);
                    g.position.insert(key.clone(), committed);
                }
                owner.insert(key.clone(), m);
            }
        }
        g.owner = owner;
    }

    /// Forgets groups that have had no live members for [`EMPTY_GROUP_TTL`] (members past their
    /// session timeout are dropped here too: a group whose members just stopped polling is
    /// rebalanced by nobody).
    fn forget_empty(groups: &mut BTreeMap<String, Group>, now: Instant) {
        for g in groups.values_mut() {
            g.drop_expired(now);
            if g.members.is_empty() {
                g.empty_since.get_or_insert(now);
            }
        }
        groups.retain(|_, g| {
            g.empty_since
                .is_none_or(|since| now.duration_since(since) < EMPTY_GROUP_TTL)
        });
    }

    /// A member's poll: joins or heartbeats, then answers up to `max` messages of its
    /// partitions, waiting up to `wait` when there are none.
    pub async fn poll(
        &self,
        group: &str,
        member: &str,
        pattern: &str,
        (max, wait, session_timeout): (usize, Duration, Duration),
        stop: &CancellationToken,
    ) -> Result<GroupPoll, GroupError> {
        let group = name("group", group)?;
        let member = name("member", member)?;
        let pattern =
            TopicPattern::new(pattern).map_err(|e| GroupError::Invalid(format!("pattern: {e}")))?;
        let deadline = Instant::now() + wait;
        loop {
            self.follow_coordinator()?;
            let owned = self
                .join(&group, &member, &pattern, session_timeout)
                .await?;
            let (messages, read_to) =
                read_owned(&owned, max.clamp(1, MAX_POLL), self.cluster()).await?;
            let assignment = owned.iter().map(|(k, _, _)| topic_partition(k)).collect();
            let now = Instant::now();
            if !messages.is_empty() || now >= deadline || stop.is_cancelled() {
                self.advance(&group, &member, &read_to);
                return Ok(GroupPoll {
                    messages,
                    assignment,
                });
            }
            // Wake for new messages in an owned partition, a rebalance's sake (a bounded
            // sleep), or the deadline.
            type Wait = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
            let mut waits: Vec<Wait> = owned
                .iter()
                .map(|(_, p, at)| {
                    let (log, at) = (p.log.clone(), *at);
                    Box::pin(async move { log.wait_for(at).await }) as Wait
                })
                .collect();
            // With no partition to wait on, only the tick below ends the wait.
            waits.push(Box::pin(std::future::pending::<()>()));
            let any = futures_util::future::select_all(waits);
            let tick = (deadline - now).min(Duration::from_millis(500));
            tokio::select! {
                _ = any => {}
                _ = tokio::time::sleep(tick) => {}
                _ = stop.cancelled() => {}
            }
        }
    }

    /// Registers the poll and returns the member's partitions with its positions.
    #[allow(clippy::type_complexity)]
    async fn join(
        &self,
        group: &str,
        member: &str,
        pattern: &TopicPattern,
        session_timeout: Duration,
    ) -> Result<Vec<(Key, Arc<Partition>, u64)>, GroupError> {
        {
            let now = Instant::now();
            let mut groups = self.groups.lock();
            Self::forget_empty(&mut groups, now);
            if !groups.contains_key(group) && groups.len() >= self.max {
                self.metrics.groups_refused.inc();
                return Err(GroupError::Limit {
                    group: group.to_owned(),
                    max: self.max,
                });
            }
            let g = groups.entry(group.to_owned()).or_insert_with(|| Group {
                pattern: pattern.clone(),
                members: BTreeMap::new(),
                owner: BTreeMap::new(),
                position: HashMap::new(),
                committed: HashMap::new(),
                skipped: HashMap::new(),
                empty_since: None,
            });
            // Until the member is in (below, after the commits are read), the group counts as
            // emptied now: it is neither forgotten meanwhile nor kept forever if this poll fails.
            if g.members.is_empty() {
                g.empty_since = Some(now);
            }
            if g.pattern.to_string() != pattern.to_string() {
                return Err(GroupError::Invalid(format!(
                    "pattern: group {group:?} consumes {:?} (fixed at its first poll), not {:?}",
                    g.pattern.to_string(),
                    pattern.to_string()
                )));
            }
        }
        self.load_committed(group).await?;
        let now = Instant::now();
        let mut groups = self.groups.lock();
        let Some(g) = groups.get_mut(group) else {
            return Err(GroupError::Unknown(group.to_owned()));
        };
        g.drop_expired(now);
        if !g.members.contains_key(member) && g.members.len() >= MAX_MEMBERS {
            self.metrics.groups_refused.inc();
            return Err(GroupError::Members {
                group: group.to_owned(),
                max: MAX_MEMBERS,
            });
        }
        g.members.insert(
            member.to_owned(),
            Member {
                last_poll: now,
                session_timeout,
            },
        );
        self.rebalance(g, now);
        let partitions: HashMap<Key, Arc<Partition>> =
            self.partitions(&g.pattern).into_iter().collect();
        let mut owned = Vec::new();
        for (k, m) in &g.owner {
            if m.as_str() != member {
                continue;
            }
            let Some(p) = partitions.get(k) else { continue };
            let position = g.position.get(k).copied().unwrap_or(0);
            let first = p.log.first_offset();
            if position < first {
                // Behind the horizon (docs/topics-and-groups.md, "Retention"): go on at the first offset still
                // stored, and say what was skipped.
                let skipped = first - position;
                *g.skipped.entry(k.clone()).or_default() += skipped;
                g.position.insert(k.clone(), first);
                self.metrics
                    .skipped
                    .get_or_create(&DispatchLabel {
                        consumer: group.to_owned(),
                        topic: k.0.to_string(),
                        partition: k.2,
                    })
                    .inc_by(skipped);
                tracing::warn!(group, topic = %k.0, partition = k.2, from = position, to = first, "retention deleted messages the group had not read; it continues at the first offset still stored");
            }
            owned.push((k.clone(), p.clone(), position.max(first)));
        }
        Ok(owned)
    }

    /// Moves the member's positions past what it read (if it still owns those partitions).
    fn advance(&self, group: &str, member: &str, read_to: &[(Key, u64)]) {
        let mut groups = self.groups.lock();
        let Some(g) = groups.get_mut(group) else {
            return;
        };
        for (key, next) in read_to {
            if g.owner.get(key).map(String::as_str) == Some(member) {
                g.position.insert(key.clone(), *next);
            }
        }
    }

    /// The member leaves; its partitions go to the others at their next poll.
    pub fn leave(&self, group: &str, member: &str) -> Result<(), GroupError> {
        self.follow_coordinator()?;
        let mut groups = self.groups.lock();
        let g = groups
            .get_mut(group)
            .ok_or_else(|| GroupError::Unknown(group.to_owned()))?;
        if g.members.remove(member).is_none() {
            return Err(GroupError::Unknown(format!("{group}/{member}")));
        }
        self.rebalance(g, Instant::now());
        Ok(())
    }
}
