//! Kafka's groups as `GET /mmmq/groups` shows them (docs/kafka.md, "Consumer groups").

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::kafka::Shared;

/// Kafka's groups as `GET /mmmq/groups` shows them: members with the partitions their
/// assignment names (the consumer protocol's assignment, which clients write and the broker
/// reads only for this), each partition's committed offset and lag.
pub(crate) struct Statuses(pub Arc<Shared>);

/// One member as the lock saw it: id, time since it was last heard, session timeout,
/// assignment.
type MemberView = (String, Duration, Duration, Vec<(String, u32)>);

#[async_trait::async_trait]
impl crate::groups::KafkaGroups for Statuses {
    async fn statuses(&self) -> Vec<mmmq_core::GroupStatus> {
        let now = Instant::now();
        let views: Vec<(String, Vec<MemberView>)> = {
            let groups = self.0.groups.groups.lock();
            groups
                .iter()
                .map(|(name, g)| {
                    let members = g
                        .members
                        .iter()
                        .map(|(id, m)| {
                            (
                                id.clone(),
                                now.saturating_duration_since(m.last_seen),
                                m.session_timeout,
                                assigned(&m.assignment),
                            )
                        })
                        .collect();
                    (name.clone(), members)
                })
                .collect()
        };
        let mut out = Vec::with_capacity(views.len());
        for (name, members) in views {
            out.push(status_of(&self.0, name, members).await);
        }
        out
    }
}

/// The partitions a consumer-protocol assignment names (empty if it is not one).
fn assigned(assignment: &Bytes) -> Vec<(String, u32)> {
    use kafka_protocol::messages::ConsumerProtocolAssignment;
    use kafka_protocol::protocol::Decodable;
    let mut b = assignment.clone();
    if b.len() < 2 {
        return Vec::new();
    }
    let version = i16::from_be_bytes([b[0], b[1]]).min(3);
    bytes::Buf::advance(&mut b, 2);
    match ConsumerProtocolAssignment::decode(&mut b, version) {
        Ok(a) => a
            .assigned_partitions
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .filter_map(|p| Some((t.topic.as_str().to_owned(), u32::try_from(*p).ok()?)))
            })
            .collect(),
        Err(_) => Vec::new(),
    }
}

async fn status_of(
    shared: &Shared,
    name: String,
    members: Vec<MemberView>,
) -> mmmq_core::GroupStatus {
    use mmmq_core::{GroupMember, GroupPartition, TopicPartition};
    let mut topics: Vec<String> = members
        .iter()
        .flat_map(|m| m.3.iter().map(|(t, _)| t.clone()))
        .collect();
    topics.sort();
    topics.dedup();
    let mut partitions = Vec::new();
    let id = Some(super::store_id(&name));
    for m in &members {
        for (topic, p) in &m.3 {
            let found = shared.topic(topic).and_then(|t| t.partition(*p));
            let Some(part) = found else { continue };
            let next_offset = part.log.next_offset();
            let committed = match &id {
                Some(id) => super::offsets::committed(shared, topic, &part, id)
                    .await
                    .ok()
                    .flatten()
                    .map_or(0, |(offset, _)| offset),
                None => 0,
            };
            partitions.push(GroupPartition {
                topic: topic.clone(),
                topic_id: Some(part.topic_id),
                partition: *p,
                owner: Some(m.0.clone()),
                committed,
                next_offset,
                lag: next_offset.saturating_sub(committed),
                skipped: 0,
            });
        }
    }
    partitions.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    mmmq_core::GroupStatus {
        group: name,
        protocol: Some("kafka".into()),
        pattern: topics.join(","),
        members: members
            .into_iter()
            .map(|(member, ago, session, assignment)| GroupMember {
                member,
                last_poll_ms_ago: ago.as_millis() as u64,
                session_timeout_ms: session.as_millis() as u64,
                assignment: assignment
                    .into_iter()
                    .map(|(topic, partition)| TopicPartition {
                        topic,
                        partition,
                        topic_id: None,
                    })
                    .collect(),
            })
            .collect(),
        partitions,
    }
}
