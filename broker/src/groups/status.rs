//! What a group looks like from outside: its status and list (`GET /mmmq/groups`), and what
//! `keepUndelivered` retention must not pass.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use mmmq_core::{GroupMember, GroupPartition, GroupStatus, Topic};

use super::{GroupError, Groups, store, topic_partition};
use crate::topics::Partition;

/// A page of `GET /mmmq/groups` ends once it holds this many partitions and members.
pub const PAGE_PARTITIONS: usize = 10_000;

impl Groups {
    /// The positions `keepUndelivered` protects in `partition` of `topic` (docs/topics-and-groups.md, "Retention"):
    /// every group's committed offset there — of the groups on disk, polling or not, and of
    /// those in memory whose pattern matches (0 when they have committed nothing yet).
    pub async fn protected_positions(&self, topic: &Topic, partition: &Arc<Partition>) -> Vec<u64> {
        let matching: Vec<String> = self
            .groups
            .lock()
            .iter()
            .filter(|(_, g)| g.pattern.matches(topic))
            .map(|(name, _)| name.clone())
            .collect();
        let p = partition.clone();
        let on_disk = match self.cluster() {
            // A cluster's commits are in its metadata (`super::cluster`).
            Some(c) => Ok(c.metadata().committed_by_groups(
                topic.as_str(),
                &partition.topic_id.to_string(),
                partition.number,
            )),
            None => tokio::task::spawn_blocking(move || store(&p).list())
                .await
                .expect("group read task panicked"),
        };
        let on_disk = match on_disk {
            Ok(list) => list,
            // Unreadable: hold everything rather than delete what a group may not have read.
            Err(_) => return vec![0],
        };
        let mut out: Vec<u64> = on_disk.iter().map(|(_, committed)| *committed).collect();
        out.extend(
            matching
                .iter()
                .filter(|g| !on_disk.iter().any(|(name, _)| name == *g))
                .map(|_| 0),
        );
        out
    }

    /// A page of the groups' statuses, by name: up to `limit` groups after `after`, and fewer
    /// once the page holds `PAGE_PARTITIONS` (10,000) partitions (always at least one group), so that
    /// one answer stays small however many partitions the groups consume. The second value says
    /// whether more groups follow.
    pub async fn list(&self, after: Option<&str>, limit: usize) -> (Vec<GroupStatus>, bool) {
        use std::ops::Bound::{Excluded, Unbounded};
        // A broker that does not coordinate holds no group worth showing.
        if self.follow_coordinator().is_err() {
            return (Vec::new(), false);
        }
        let mut names: Vec<String> = {
            let mut groups = self.groups.lock();
            Self::forget_empty(&mut groups, Instant::now());
            let from = after.map_or(Unbounded, |a| Excluded(a.to_owned()));
            groups
                .range((from, Unbounded))
                .map(|(name, _)| name.clone())
                .collect()
        };
        // Kafka's groups beside them, in one order of names (docs/kafka.md, "Consumer groups").
        let mut kafka: BTreeMap<String, GroupStatus> = match self.kafka.get() {
            Some(k) => k
                .statuses()
                .await
                .into_iter()
                .filter(|s| after.is_none_or(|a| s.group.as_str() > a))
                .map(|s| (s.group.clone(), s))
                .collect(),
            None => BTreeMap::new(),
        };
        names.extend(kafka.keys().cloned());
        names.sort();
        names.dedup();
        let mut out = Vec::new();
        let mut rows = 0;
        for (i, n) in names.iter().enumerate() {
            if out.len() >= limit.max(1) || (rows >= PAGE_PARTITIONS && !out.is_empty()) {
                return (out, names.len() > i);
            }
            let status = match self.status(n).await {
                Ok(s) => Some(s),
                Err(_) => kafka.remove(n),
            };
            if let Some(s) = status {
                rows += s.partitions.len() + s.members.len();
                out.push(s);
            }
        }
        (out, false)
    }

    /// A Kafka group's status, when there is no pull group of that name.
    pub async fn kafka_status(&self, group: &str) -> Option<GroupStatus> {
        let k = self.kafka.get()?;
        k.statuses().await.into_iter().find(|s| s.group == group)
    }

    /// One group's members, assignments, committed offsets and lag.
    pub async fn status(&self, group: &str) -> Result<GroupStatus, GroupError> {
        self.follow_coordinator()?;
        if !self.groups.lock().contains_key(group) {
            return Err(GroupError::Unknown(group.to_owned()));
        }
        self.load_committed(group).await?;
        let now = Instant::now();
        let mut groups = self.groups.lock();
        let g = groups
            .get_mut(group)
            .ok_or_else(|| GroupError::Unknown(group.to_owned()))?;
        self.rebalance(g, now);
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
                    .map(|(k, _)| topic_partition(k))
                    .collect(),
            })
            .collect();
        let partitions = partitions
            .into_iter()
            .map(|(key, p)| {
                let committed = g.committed.get(&key).copied().unwrap_or(0);
                let next_offset = p.log.next_offset();
                GroupPartition {
                    topic: key.0.to_string(),
                    topic_id: Some(key.1),
                    partition: key.2,
                    owner: g.owner.get(&key).cloned(),
                    committed,
                    next_offset,
                    lag: next_offset.saturating_sub(committed),
                    skipped: g.skipped.get(&key).copied().unwrap_or(0),
                }
            })
            .collect();
        Ok(GroupStatus {
            group: group.to_owned(),
            protocol: None,
            pattern: g.pattern.to_string(),
            members,
            partitions,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};
    use std::time::Duration;

    use super::super::{EMPTY_GROUP_TTL, Group, Groups, Member};

    fn group(members: &[(&str, Instant, Duration)]) -> Group {
        Group {
            pattern: mmmq_core::TopicPattern::new("t").unwrap(),
            members: members
                .iter()
                .map(|&(name, last_poll, session_timeout)| {
                    let m = Member {
                        last_poll,
                        session_timeout,
                    };
                    (name.to_owned(), m)
                })
                .collect(),
            owner: BTreeMap::new(),
            position: HashMap::new(),
            committed: HashMap::new(),
            skipped: HashMap::new(),
            empty_since: None,
        }
    }

    use std::time::Instant;

    /// The registry of groups shrinks: a group whose members all stopped polling (no one
    /// rebalances it) is forgotten `EMPTY_GROUP_TTL` after its last member expired; a group
    /// with a live member is kept however old.
    #[test]
    fn groups_without_live_members_are_forgotten_after_their_ttl() {
        let start = Instant::now();
        let session = Duration::from_secs(10);
        let mut groups = BTreeMap::new();
        groups.insert("live".to_owned(), group(&[("m", start, session)]));
        groups.insert("silent".to_owned(), group(&[("m", start, session)]));
        // The live group's member polls on; the silent one's does not.
        let poll_live = |groups: &mut BTreeMap<String, Group>, at: Instant| {
            groups
                .get_mut("live")
                .unwrap()
                .members
                .get_mut("m")
                .unwrap()
                .last_poll = at;
        };
        let later = start + session + Duration::from_secs(1);
        poll_live(&mut groups, later);
        Groups::forget_empty(&mut groups, later);
        assert_eq!(groups.len(), 2, "expired just now: kept for its TTL");
        assert!(groups["silent"].members.is_empty());
        let much_later = later + EMPTY_GROUP_TTL;
        poll_live(&mut groups, much_later);
        Groups::forget_empty(&mut groups, much_later);
        assert_eq!(groups.keys().collect::<Vec<_>>(), ["live"]);
    }
}
