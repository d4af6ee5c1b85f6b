//! A member's commit (docs/topics-and-groups.md, "Consumer groups"): the group's next offsets
//! of partitions the member owns, stored in their checkpoint files on one broker, in the
//! cluster's metadata on a cluster member (`super::cluster`).

use mmmq_core::{ConsumerId, Topic, TopicId};

use super::{GroupError, Groups, Key, key_of, name, store};
use crate::storage::StorageError;
use crate::storage::checkpoint::Checkpoints;

impl Groups {
    /// Durably stores the group's next offsets for partitions the member owns. An offset that
    /// names its topic's id is refused unless the topic is still that incarnation.
    pub async fn commit(
        &self,
        group: &str,
        member: &str,
        offsets: Vec<(String, Option<TopicId>, u32, u64)>,
    ) -> Result<(), GroupError> {
        let group = name("group", group)?;
        let member = name("member", member)?;
        self.follow_coordinator()?;
        let mut writes = Vec::new();
        {
            let groups = self.groups.lock();
            let g = match groups.get(&group) {
                Some(g) => g,
                // A coordinator that just took over knows no member yet: the member owns
                // nothing here until its next poll (`409`, as for partitions it lost).
                None if self.cluster().is_some() => {
                    let (topic, partition) = offsets
                        .first()
                        .map_or((String::new(), 0), |o| (o.0.clone(), o.2));
                    return Err(GroupError::NotOwner {
                        member: member.clone(),
                        topic,
                        partition,
                    });
                }
                None => return Err(GroupError::Unknown(group.clone())),
            };
            for (topic, topic_id, partition, offset) in offsets {
                let t = Topic::new(topic.clone())
                    .map_err(|e| GroupError::Invalid(format!("topic: {e}")))?;
                let not_owner = || GroupError::NotOwner {
                    member: member.clone(),
                    topic: topic.clone(),
                    partition,
                };
                // A topic that is gone (deleted) is owned by nobody: `409`, as for a partition
                // the member lost, so a client drops these offsets.
                let existing = self.registry.get(&t).ok_or_else(not_owner)?;
                let p = existing.partition(partition).ok_or_else(|| {
                    GroupError::Invalid(format!("no partition {partition} of {topic:?}"))
                })?;
                let key = key_of(&t, &p);
                // Another incarnation than the one the member read: its offsets mean nothing
                // here, as for a partition it no longer owns.
                if topic_id.is_some_and(|id| id != p.topic_id)
                    || g.owner.get(&key).map(String::as_str) != Some(member.as_str())
                {
                    return Err(not_owner());
                }
                let next = p.log.next_offset();
                // A cluster member without a replica of the partition reads it through its
                // leader: its own log says nothing of where it ends.
                let local = self
                    .cluster()
                    .is_none_or(|c| c.replicates(t.as_str(), partition));
                if local && offset > next {
                    return Err(GroupError::Invalid(format!(
                        "offset {offset} of {topic} partition {partition} is past its next offset {next}"
                    )));
                }
                writes.push((key, p, offset));
            }
        }
        if let Some(cluster) = self.cluster() {
            let offsets: Vec<(Key, u64)> = writes.into_iter().map(|(k, _, o)| (k, o)).collect();
            if offsets.is_empty() {
                return Ok(());
            }
            Self::commit_in_metadata(cluster, &group, &member, &offsets).await?;
            if let Some(g) = self.groups.lock().get_mut(&group) {
                g.committed.extend(offsets);
            }
            return Ok(());
        }
        let id = ConsumerId::new(group.clone()).expect("checked group name");
        for (key, p, offset) in writes {
            let id = id.clone();
            let written = tokio::task::spawn_blocking(move || store(&p).write(&id, offset))
                .await
                .expect("commit task panicked");
            match written {
                Ok(()) => {}
                // The topic was deleted meanwhile; nothing was written (its directory stays gone).
                Err(StorageError::Retired { .. }) => {
                    return Err(GroupError::NotOwner {
                        member: member.clone(),
                        topic: key.0.to_string(),
                        partition: key.2,
                    });
                }
                Err(e) => return Err(e.into()),
            }
            if let Some(g) = self.groups.lock().get_mut(&group) {
                g.committed.insert(key, offset);
            }
        }
        Ok(())
    }
}

/// The extension of the file beside a group's checkpoint that holds Kafka commits' metadata
/// strings (docs/storage.md): up to two records, the newest first, each the offset it was
/// committed with (a big-endian u64), the string's length (a big-endian u32) and its bytes.
/// The older is the one the checkpoint held when the newer was written: a commit that fails or
/// is cut by a crash between this file and the checkpoint leaves the acknowledged one showing.
const METADATA_EXT: &str = "metadata";

/// The records of a metadata file, newest first; none for a file that is not one (logged).
fn metadata_records(raw: &[u8], group: &ConsumerId) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    let mut at = 0;
    while out.len() < 2 && at + 12 <= raw.len() {
        let offset = u64::from_be_bytes(raw[at..at + 8].try_into().expect("8 bytes"));
        let len = u32::from_be_bytes(raw[at + 8..at + 12].try_into().expect("4 bytes")) as usize;
        let Some(bytes) = raw.get(at + 12..at + 12 + len) else {
            tracing::warn!(group = %group, "a commit metadata file cut short: its strings are not shown");
            return Vec::new();
        };
        out.push((offset, String::from_utf8_lossy(bytes).into_owned()));
        at += 12 + len;
    }
    out
}

/// The metadata records beside `group`'s checkpoint; none (logged) when they cannot be read:
/// a metadata string is worth less than the offset it rides with.
fn read_metadata(store: &Checkpoints, group: &ConsumerId) -> Vec<(u64, String)> {
    match store.read_beside(group, METADATA_EXT) {
        Ok(Some(raw)) => metadata_records(&raw, group),
        Ok(None) => Vec::new(),
        Err(e) => {
            tracing::warn!(group = %group, error = %e, "a commit metadata file unread: its strings are not shown");
            Vec::new()
        }
    }
}

/// Every group with a committed offset in `p` (HTTP's and Kafka's, by their stored names), for
/// Kafka's ListGroups (docs/kafka.md, "Consumer groups"). Blocking.
pub fn committed_groups(p: &crate::topics::Partition) -> Result<Vec<String>, StorageError> {
    super::store(p).names()
}

/// The committed offset of `group` in `p` and the metadata string committed with it, as a
/// Kafka consumer group reads them (docs/kafka.md, "One set of topics": the same checkpoint
/// files as HTTP's groups). A string shows while the checkpoint holds the offset it came with.
/// Blocking.
pub fn read_committed(
    p: &crate::topics::Partition,
    group: &ConsumerId,
) -> Result<Option<(u64, String)>, StorageError> {
    let store = super::store(p);
    let Some(offset) = store.read(group)? else {
        return Ok(None);
    };
    let metadata = read_metadata(&store, group)
        .into_iter()
        .find(|(o, _)| *o == offset)
        .map(|(_, m)| m)
        .unwrap_or_default();
    Ok(Some((offset, metadata)))
}

/// Durably stores the committed offset of `group` in `p` for a Kafka consumer group, whose
/// coordinator checked the member (docs/kafka.md), with its metadata string: written first,
/// beside the checkpoint, with the record the checkpoint holds now kept after it; only when
/// there is a string to keep or one to replace (a commit without one, the usual, costs what
/// HTTP's does). Blocking.
pub fn write_committed(
    p: &crate::topics::Partition,
    group: &ConsumerId,
    offset: u64,
    metadata: &str,
) -> Result<(), StorageError> {
    let store = super::store(p);
    let records = read_metadata(&store, group);
    if !metadata.is_empty() || records.iter().any(|(_, m)| !m.is_empty()) {
        let current = store.read(group)?;
        let mut raw = Vec::new();
        let kept = records
            .into_iter()
            .find(|(o, m)| Some(*o) == current && *o != offset && !m.is_empty());
        for (o, m) in std::iter::once((offset, metadata.to_owned())).chain(kept) {
            raw.extend_from_slice(&o.to_be_bytes());
            raw.extend_from_slice(&(m.len() as u32).to_be_bytes());
            raw.extend_from_slice(m.as_bytes());
        }
        store.write_beside(group, METADATA_EXT, &raw)?;
    }
    store.write(group, offset)
}
