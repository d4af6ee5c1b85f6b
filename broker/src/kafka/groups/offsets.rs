//! OffsetCommit and OffsetFetch of Kafka's groups (docs/kafka.md, "Consumer groups"): the
//! committed offsets of HTTP's groups, the same checkpoint files.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::{
    OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use mmmq_core::ConsumerId;

use std::sync::Arc;

use crate::cluster::meta_state::{GroupOffset, MetaCommand, MetaOutcome};
use crate::groups::commit::{committed_groups, read_committed, write_committed};
use crate::kafka::Shared;
use crate::kafka::partition_of;
use crate::topics::Partition;

use super::state::Phase;

/// OffsetCommit: a member of the current generation's offsets, or a standalone consumer's
/// (generation −1, no member) for a group with no members.
pub(crate) async fn commit(
    shared: &Shared,
    request: OffsetCommitRequest,
    _version: i16,
) -> OffsetCommitResponse {
    let group = request.group_id.as_str().to_owned();
    // First: a coordinator in a new term forgets the groups of the old one, and a member of
    // those must not pass the checks below.
    let serving = shared.groups.serving(shared).err();
    let refused = serving.or_else(|| {
        let groups = shared.groups.groups.lock();
        match groups.get(&group) {
            Some(g) if !g.members.is_empty() || request.generation_id_or_member_epoch >= 0 => {
                match g.check(
                    request.member_id.as_str(),
                    request.generation_id_or_member_epoch,
                    request.group_instance_id.as_ref().map(|i| i.as_str()),
                ) {
                    Err(e) => Some(e),
                    // As Kafka's: a member of the current generation commits while the group
                    // prepares a rebalance (its commit on revoke), not while the new
                    // generation's assignment is pending.
                    Ok(()) if g.phase == Phase::CompletingRebalance => {
                        Some(ResponseError::RebalanceInProgress)
                    }
                    Ok(()) => None,
                }
            }
            None if request.generation_id_or_member_epoch >= 0 => {
                Some(ResponseError::IllegalGeneration)
            }
            _ => None,
        }
    });
    let id = super::store_id(&group);
    // Per topic, per partition: its error code, or the partition and offset to commit.
    let mut answers: Judged = Vec::with_capacity(request.topics.len());
    for t in request.topics {
        let found = shared.topic(t.name.as_str());
        let parts = t
            .partitions
            .iter()
            .map(|p| {
                let judged = match refused {
                    Some(e) => Err(e.code()),
                    None => match partition_of(found.as_ref(), p.partition_index) {
                        None => Err(ResponseError::UnknownTopicOrPartition.code()),
                        Some(_) if p.committed_offset < 0 => {
                            Err(ResponseError::OffsetOutOfRange.code())
                        }
                        Some(_)
                            if p.committed_metadata.as_ref().map_or(0, |m| m.len())
                                > MAX_METADATA =>
                        {
                            Err(ResponseError::OffsetMetadataTooLarge.code())
                        }
                        Some(part) => Ok((
                            part,
                            p.committed_offset as u64,
                            p.committed_metadata
                                .as_ref()
                                .map(|m| m.as_str().to_owned())
                                .unwrap_or_default(),
                        )),
                    },
                };
                (p.partition_index, judged)
            })
            .collect();
        answers.push((t.name, parts));
    }
    store(shared, &group, &id, &mut answers).await;
    let topics = answers
        .into_iter()
        .map(|(name, parts)| {
            let partitions = parts
                .into_iter()
                .map(|(index, judged)| {
                    OffsetCommitResponsePartition::default()
                        .with_partition_index(index)
                        .with_error_code(judged.err().unwrap_or(0))
                })
                .collect();
            OffsetCommitResponseTopic::default()
                .with_name(name)
                .with_partitions(partitions)
        })
        .collect();
    OffsetCommitResponse::default().with_topics(topics)
}

/// Commits of one group in one partition, one at a time (striped): a commit reads the metadata
/// file, writes it and then the checkpoint, and two connections' commits must not interleave
/// those steps (the first's string would be lost though acknowledged).
static COMMIT_LOCKS: [parking_lot::Mutex<()>; 64] = [const { parking_lot::const_mutex(()) }; 64];

fn commit_lock(group: &ConsumerId, p: &Partition) -> &'static parking_lot::Mutex<()> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (group.as_str(), p.topic_id.to_string(), p.number).hash(&mut h);
    &COMMIT_LOCKS[(h.finish() % COMMIT_LOCKS.len() as u64) as usize]
}

/// Kafka's `offset.metadata.max.bytes`: the longest metadata string a commit may carry.
const MAX_METADATA: usize = 4096;

/// Per topic, per partition: the partition, offset and metadata string to store, or the error
/// code to answer.
type Judged = Vec<(
    TopicName,
    Vec<(i32, Result<(Arc<Partition>, u64, String), i16>)>,
)>;

/// Stores the offsets `answers` holds (each becomes its error code, 0 once stored): in each
/// partition's checkpoint file alone; in a cluster, all of them in one change of the
/// replicated metadata (docs/kafka.md, "In a cluster").
async fn store(shared: &Shared, group: &str, id: &ConsumerId, answers: &mut Judged) {
    if let Some(cluster) = shared.broker.cluster() {
        let mut offsets = Vec::new();
        for (name, parts) in answers.iter() {
            for (_, judged) in parts {
                if let Ok((p, offset, metadata)) = judged {
                    offsets.push(GroupOffset {
                        topic: name.as_str().to_owned(),
                        topic_id: p.topic_id.to_string(),
                        partition: p.number,
                        offset: *offset,
                        metadata: Some(metadata.clone()),
                    });
                }
            }
        }
        if offsets.is_empty() {
            return;
        }
        let command = MetaCommand::CommitGroup {
            group: id.as_str().to_owned(),
            offsets,
        };
        let code = match cluster.propose_here(command).await {
            Ok(MetaOutcome::Refused(_)) => ResponseError::UnknownTopicOrPartition.code(),
            Ok(_) => 0,
            Err(e) => {
                tracing::warn!(group = %group, error = %e, "kafka: commit through the metadata failed");
                ResponseError::NotCoordinator.code()
            }
        };
        for (_, parts) in answers.iter_mut() {
            for (_, judged) in parts.iter_mut() {
                if judged.is_ok() {
                    *judged = Err(code);
                }
            }
        }
        return;
    }
    for (_, parts) in answers.iter_mut() {
        for (_, judged) in parts.iter_mut() {
            let Ok((part, offset, metadata)) = judged else {
                continue;
            };
            let (part, offset, id) = (part.clone(), *offset, id.clone());
            let metadata = std::mem::take(metadata);
            let written = tokio::task::spawn_blocking(move || {
                let _one_at_a_time = commit_lock(&id, &part).lock();
                write_committed(&part, &id, offset, &metadata)
            })
            .await
            .expect("commit task panicked");
            *judged = Err(match written {
                Ok(()) => 0,
                Err(e) => {
                    tracing::warn!(group = %group, error = %e, "kafka: commit failed");
                    ResponseError::KafkaStorageError.code()
                }
            });
        }
    }
}

/// Every partition of every topic.
fn every_partition(shared: &Shared) -> Vec<Arc<Partition>> {
    shared
        .broker
        .registry()
        .all()
        .into_iter()
        .flat_map(|t| t.partitions())
        .collect()
}

/// The stored names of every group with a committed offset (HTTP's groups too: they share
/// them): the checkpoint files of every partition alone, the replicated metadata in a cluster.
/// Names [`super::store_id`] mapped from a Kafka id are left out: the id is not kept.
pub(super) async fn groups_with_commits(shared: &Shared) -> Vec<String> {
    let mut names: Vec<String> = if let Some(cluster) = shared.broker.cluster() {
        cluster.metadata().groups.keys().cloned().collect()
    } else {
        let partitions = every_partition(shared);
        tokio::task::spawn_blocking(move || {
            partitions
                .iter()
                .flat_map(|p| {
                    committed_groups(p).unwrap_or_else(|e| {
                        tracing::warn!(error = %e, "kafka: a partition's groups unread for ListGroups");
                        Vec::new()
                    })
                })
                .collect()
        })
        .await
        .expect("group listing task panicked")
    };
    names.sort();
    names.dedup();
    names.retain(|n| !super::is_mapped(n));
    names
}

/// Whether `group` (a stored name) has a committed offset in any partition.
pub(super) async fn has_commits(shared: &Shared, group: &ConsumerId) -> bool {
    if let Some(cluster) = shared.broker.cluster() {
        return cluster.metadata().groups.contains_key(group.as_str());
    }
    let partitions = every_partition(shared);
    let group = group.clone();
    tokio::task::spawn_blocking(move || {
        partitions.iter().any(|p| {
            committed_groups(p).is_ok_and(|names| names.iter().any(|n| n == group.as_str()))
        })
    })
    .await
    .expect("group lookup task panicked")
}

/// `group`'s committed offset in partition `p` of `topic` and the metadata string committed
/// with it: its checkpoint file alone, the replicated metadata in a cluster.
pub(super) async fn committed(
    shared: &Shared,
    topic: &str,
    p: &Arc<Partition>,
    group: &ConsumerId,
) -> Result<Option<(u64, String)>, crate::storage::StorageError> {
    if let Some(cluster) = shared.broker.cluster() {
        let id = p.topic_id.to_string();
        let metadata = cluster.metadata();
        return Ok(metadata
            .committed(group.as_str(), topic, &id, p.number)
            .map(|offset| {
                let m = metadata.committed_metadata(group.as_str(), topic, &id, p.number);
                (offset, m)
            }));
    }
    let (p, group) = (p.clone(), group.clone());
    tokio::task::spawn_blocking(move || read_committed(&p, &group))
        .await
        .expect("offset read task panicked")
}

/// OffsetFetch (v1–7): the group's committed offsets; −1 where it has none. No topics named
/// (v2+): every partition it committed in.
pub(crate) async fn fetch_offsets(
    shared: &Shared,
    request: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    let id = super::store_id(request.group_id.as_str());
    // Not the coordinator: said once (v2+), else for every partition asked (v1 has no
    // group-level error).
    let serving = shared.groups.serving(shared);
    if let (Err(e), 2..) = (serving, version) {
        return OffsetFetchResponse::default().with_error_code(e.code());
    }
    let registry = shared.broker.registry();
    let asked: Vec<(TopicName, Vec<i32>)> = match request.topics {
        Some(topics) => topics
            .into_iter()
            .map(|t| (t.name, t.partition_indexes))
            .collect(),
        None => registry
            .all()
            .into_iter()
            .filter(|t| !t.topic.is_internal())
            .map(|t| {
                (
                    TopicName(StrBytes::from_string(t.topic.as_str().to_owned())),
                    (0..t.partition_count() as i32).collect(),
                )
            })
            .collect(),
    };
    let mut topics = Vec::with_capacity(asked.len());
    for (name, partitions) in asked {
        let found = shared.topic(name.as_str());
        let mut out = Vec::with_capacity(partitions.len());
        for index in partitions {
            let answer = OffsetFetchResponsePartition::default()
                .with_partition_index(index)
                .with_committed_offset(-1)
                .with_committed_leader_epoch(-1)
                .with_metadata(Some(StrBytes::default()));
            if let Err(e) = serving {
                out.push(answer.with_error_code(e.code()));
                continue;
            }
            let Some(p) = partition_of(found.as_ref(), index) else {
                out.push(answer.with_error_code(ResponseError::UnknownTopicOrPartition.code()));
                continue;
            };
            let read = committed(shared, name.as_str(), &p, &id).await;
            out.push(match read {
                Ok(Some((offset, metadata))) => answer
                    .with_committed_offset(offset as i64)
                    .with_metadata(Some(StrBytes::from_string(metadata))),
                Ok(None) => answer,
                Err(_) => answer.with_error_code(ResponseError::KafkaStorageError.code()),
            });
        }
        topics.push(
            OffsetFetchResponseTopic::default()
                .with_name(name)
                .with_partitions(out),
        );
    }
    OffsetFetchResponse::default().with_topics(topics)
}
