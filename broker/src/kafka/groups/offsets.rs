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

use crate::groups::commit::{read_committed, write_committed};
use crate::kafka::Shared;
use crate::kafka::partition_of;

use super::state::Phase;

/// OffsetCommit: a member of the current generation's offsets, or a standalone consumer's
/// (generation −1, no member) for a group with no members.
pub(crate) async fn commit(
    shared: &Shared,
    request: OffsetCommitRequest,
    _version: i16,
) -> OffsetCommitResponse {
    let group = request.group_id.as_str().to_owned();
    let refused = {
        let groups = shared.groups.groups.lock();
        match groups.get(&group) {
            _ if ConsumerId::new(group.clone()).is_err() => Some(ResponseError::InvalidGroupId),
            Some(g) if !g.members.is_empty() || request.generation_id_or_member_epoch >= 0 => {
                match g.check(
                    request.member_id.as_str(),
                    request.generation_id_or_member_epoch,
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
    };
    let id = ConsumerId::new(group.clone()).ok();
    let mut topics = Vec::with_capacity(request.topics.len());
    for t in request.topics {
        let found = shared.topic(t.name.as_str());
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in t.partitions {
            let code = match (refused, &id) {
                (Some(e), _) => e.code(),
                (None, None) => ResponseError::InvalidGroupId.code(),
                (None, Some(id)) => {
                    let partition = partition_of(found.as_ref(), p.partition_index);
                    match partition {
                        None => ResponseError::UnknownTopicOrPartition.code(),
                        Some(_) if p.committed_offset < 0 => ResponseError::OffsetOutOfRange.code(),
                        Some(part) => {
                            let (id, offset) = (id.clone(), p.committed_offset as u64);
                            let written = tokio::task::spawn_blocking(move || {
                                write_committed(&part, &id, offset)
                            })
                            .await
                            .expect("commit task panicked");
                            match written {
                                Ok(()) => 0,
                                Err(e) => {
                                    tracing::warn!(group = %group, error = %e, "kafka: commit failed");
                                    ResponseError::KafkaStorageError.code()
                                }
                            }
                        }
                    }
                }
            };
            partitions.push(
                OffsetCommitResponsePartition::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(code),
            );
        }
        topics.push(
            OffsetCommitResponseTopic::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    OffsetCommitResponse::default().with_topics(topics)
}

/// OffsetFetch (v1–7): the group's committed offsets; −1 where it has none. No topics named
/// (v2+): every partition it committed in.
pub(crate) async fn fetch_offsets(
    shared: &Shared,
    request: OffsetFetchRequest,
    _version: i16,
) -> OffsetFetchResponse {
    let Ok(id) = ConsumerId::new(request.group_id.as_str()) else {
        return OffsetFetchResponse::default()
            .with_error_code(ResponseError::InvalidGroupId.code());
    };
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
            let Some(p) = partition_of(found.as_ref(), index) else {
                out.push(answer.with_error_code(ResponseError::UnknownTopicOrPartition.code()));
                continue;
            };
            let id = id.clone();
            let read = tokio::task::spawn_blocking(move || read_committed(&p, &id))
                .await
                .expect("offset fetch task panicked");
            out.push(match read {
                Ok(Some(offset)) => answer.with_committed_offset(offset as i64),
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
