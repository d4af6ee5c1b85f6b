//! Pull consumer groups (README, "Consumer groups"; seed 004's consumer groups over HTTP): members
//! join by polling, share the partitions of the topics a pattern matches — each partition owned
//! by one member at a time, balanced over the live members — and the broker keeps the group's
//! committed offsets, durably, next to the partition's dispatcher checkpoints
//! (`checkpoints/groups/{group}.checkpoint`, the same 8-byte format).
//!
//! A member that has not polled for its session timeout is removed and its partitions go to the
//! others, which start at the group's committed offset: delivery within a group is
//! at-least-once. A commit for a partition the member no longer owns is refused (`409`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mmmq_core::{
    ConsumerId, Envelope, GroupMember, GroupPartition, GroupPoll, GroupStatus, StoredMessage,
    Topic, TopicPartition, TopicPattern,
};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::storage::{Checkpoints, StorageError};
use crate::topics::{Partition, Registry};

/// Default `sessionTimeoutMs`.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// Most messages one poll answers.
const MAX_POLL: usize = 1000;

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
    /// The disk said no.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

type Key = (Topic, u32);

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
}

/// Every group of a broker.
pub struct Groups {
    registry: Arc<Registry>,
    groups: Mutex<BTreeMap<String, Group>>,
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
    /// No groups yet.
    pub fn new(registry: Arc<Registry>) -> Self {
        Self {
            registry,
            groups: Mutex::new(BTreeMap::new()),
        }
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
                    .map(move |p| ((t.topic.clone(), p.number), p))
            })
            .collect()
    }

    /// Drops expired members and balances the partitions over the live ones (sorted members,
    /// partitions dealt round robin); a partition that changes owner starts at the committed
    /// offset.
    fn rebalance(&self, g: &mut Group, group: &str, now: Instant) {
        g.members
            .retain(|_, m| now.duration_since(m.last_poll) <= m.session_timeout);
        let partitions = self.partitions(&g.pattern);
        let members: Vec<&String> = g.members.keys().collect();
        let mut owner = BTreeMap::new();
        if !members.is_empty() {
            for (i, (key, p)) in partitions.iter().enumerate() {
                let m = members[i % members.len()].clone();
                if g.owner.get(key) != Some(&m) {
                    let committed = *g.committed.entry(key.clone()).or_insert_with(|| {
                        let id = ConsumerId::new(group).expect("checked group name");
                        store(p).read(&id).ok().flatten().unwrap_or(0)
                    });
                    g.position.insert(key.clone(), committed);
                }
                owner.insert(key.clone(), m);
            }
        }
        g.owner = owner;
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
            let owned = self.join(&group, &member, &pattern, session_timeout)?;
            let (messages, read_to) = read_owned(&owned, max.clamp(1, MAX_POLL)).await?;
            let assignment = owned
                .iter()
                .map(|(k, _, _)| TopicPartition {
                    topic: k.0.to_string(),
                    partition: k.1,
                })
                .collect();
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
    fn join(
        &self,
        group: &str,
        member: &str,
        pattern: &TopicPattern,
        session_timeout: Duration,
    ) -> Result<Vec<(Key, Arc<Partition>, u64)>, GroupError> {
        let now = Instant::now();
        let mut groups = self.groups.lock();
        let g = groups.entry(group.to_owned()).or_insert_with(|| Group {
            pattern: pattern.clone(),
            members: BTreeMap::new(),
            owner: BTreeMap::new(),
            position: HashMap::new(),
            committed: HashMap::new(),
        });
        if g.pattern.to_string() != pattern.to_string() {
            return Err(GroupError::Invalid(format!(
                "pattern: group {group:?} consumes {:?} (fixed at its first poll), not {:?}",
                g.pattern.to_string(),
                pattern.to_string()
            )));
        }
        g.members.insert(
            member.to_owned(),
            Member {
                last_poll: now,
                session_timeout,
            },
        );
        self.rebalance(g, group, now);
        let partitions: HashMap<Key, Arc<Partition>> =
            self.partitions(&g.pattern).into_iter().collect();
        Ok(g.owner
            .iter()
            .filter(|(_, m)| m.as_str() == member)
            .filter_map(|(k, _)| {
                let p = partitions.get(k)?.clone();
                let at = g
                    .position
                    .get(k)
                    .copied()
                    .unwrap_or(0)
                    .max(p.log.first_offset());
                Some((k.clone(), p, at))
            })
            .collect())
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

    /// Durably stores the group's next offsets for partitions the member owns.
    pub async fn commit(
        &self,
        group: &str,
        member: &str,
        offsets: Vec<(String, u32, u64)>,
    ) -> Result<(), GroupError> {
        let group = name("group", group)?;
        let member = name("member", member)?;
        let mut writes = Vec::new();
        {
            let groups = self.groups.lock();
            let g = groups
                .get(&group)
                .ok_or_else(|| GroupError::Unknown(group.clone()))?;
            for (topic, partition, offset) in offsets {
                let t = Topic::new(topic.clone())
                    .map_err(|e| GroupError::Invalid(format!("topic: {e}")))?;
                let key = (t.clone(), partition);
                if g.owner.get(&key).map(String::as_str) != Some(member.as_str()) {
                    return Err(GroupError::NotOwner {
                        member: member.clone(),
                        topic,
                        partition,
                    });
                }
                let p = self
                    .registry
                    .get(&t)
                    .and_then(|t| t.partition(partition))
                    .ok_or_else(|| {
                        GroupError::Invalid(format!("no partition {partition} of {topic:?}"))
                    })?;
                let next = p.log.next_offset();
                if offset > next {
                    return Err(GroupError::Invalid(format!(
                        "offset {offset} of {topic} partition {partition} is past its next offset {next}"
                    )));
                }
                writes.push((key, p, offset));
            }
        }
        let id = ConsumerId::new(group.clone()).expect("checked group name");
        for (key, p, offset) in writes {
            let id = id.clone();
            tokio::task::spawn_blocking(move || store(&p).write(&id, offset))
                .await
                .expect("commit task panicked")?;
            if let Some(g) = self.groups.lock().get_mut(&group) {
                g.committed.insert(key, offset);
            }
        }
        Ok(())
    }

    /// The member leaves; its partitions go to the others at their next poll.
    pub fn leave(&self, group: &str, member: &str) -> Result<(), GroupError> {
        let mut groups = self.groups.lock();
        let g = groups
            .get_mut(group)
            .ok_or_else(|| GroupError::Unknown(group.to_owned()))?;
        if g.members.remove(member).is_none() {
            return Err(GroupError::Unknown(format!("{group}/{member}")));
        }
        self.rebalance(g, group, Instant::now());
        Ok(())
    }

    /// Every group's status.
    pub fn list(&self) -> Vec<GroupStatus> {
        let names: Vec<String> = self.groups.lock().keys().cloned().collect();
        names.iter().filter_map(|n| self.status(n).ok()).collect()
    }

    /// One group's members, assignments, committed offsets and lag.
    pub fn status(&self, group: &str) -> Result<GroupStatus, GroupError> {
        let now = Instant::now();
        let mut groups = self.groups.lock();
        let g = groups
            .get_mut(group)
            .ok_or_else(|| GroupError::Unknown(group.to_owned()))?;
        self.rebalance(g, group, now);
        let partitions = self.partitions(&g.pattern);
        let members = g
            .members
            .iter()
            .map(|(name, m)| GroupMember {
                member: name.clone(),
                last_poll_ms_ago: now.duration_since(m.last_poll).as_millis() as u64,
                session_timeout_ms: m.session_timeout.as_millis() as u64,
                assignment: g
                    .owner
                    .iter()
                    .filter(|(_, o)| *o == name)
                    .map(|(k, _)| TopicPartition {
                        topic: k.0.to_string(),
                        partition: k.1,
                    })
                    .collect(),
            })
            .collect();
        let id = ConsumerId::new(group).expect("a stored group has a valid name");
        let partitions = partitions
            .into_iter()
            .map(|(key, p)| {
                let committed = *g
                    .committed
                    .entry(key.clone())
                    .or_insert_with(|| store(&p).read(&id).ok().flatten().unwrap_or(0));
                let next_offset = p.log.next_offset();
                GroupPartition {
                    topic: key.0.to_string(),
                    partition: key.1,
                    owner: g.owner.get(&key).cloned(),
                    committed,
                    next_offset,
                    lag: next_offset.saturating_sub(committed),
                }
            })
            .collect();
        Ok(GroupStatus {
            group: group.to_owned(),
            pattern: g.pattern.to_string(),
            members,
            partitions,
        })
    }
}

/// Reads up to `max` messages over the owned partitions, from each one's position, taking turns
/// so that one busy partition does not starve the others.
#[allow(clippy::type_complexity)]
async fn read_owned(
    owned: &[(Key, Arc<Partition>, u64)],
    max: usize,
) -> Result<(Vec<Envelope>, Vec<(Key, u64)>), GroupError> {
    let per = (max / owned.len().max(1)).max(1);
    let mut out = Vec::new();
    let mut read_to = Vec::new();
    for (key, p, at) in owned {
        if out.len() >= max {
            break;
        }
        let (log, at, want) = (p.log.clone(), *at, per.min(max - out.len()));
        let entries = tokio::task::spawn_blocking(move || log.read_from(at, want, 8 << 20))
            .await
            .expect("read task panicked")?;
        if let Some(last) = entries.last() {
            read_to.push((key.clone(), last.offset + 1));
        }
        // A corrupt entry is left out (the gap in offsets shows it), and passed.
        for e in entries {
            let Ok(bytes) = e.payload else { continue };
            if let Ok(m) = StoredMessage::from_payload(&bytes) {
                out.push(m.into_envelope(key.0.clone(), key.1, e.offset));
            }
        }
    }
    Ok((out, read_to))
}
