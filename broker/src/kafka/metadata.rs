//! Metadata and FindCoordinator (docs/kafka.md, "APIs"): the broker itself, its topics with their
//! partitions, and itself again as every group's coordinator.
//!
//! A Metadata request that names a topic that does not exist creates it when the client allows
//! it (`allow.auto.create.topics`, on for producers by default), as a first HTTP produce does
//! (docs/topics-and-groups.md, "Topics"): with the default partitions and retention.

use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, FindCoordinatorRequest, FindCoordinatorResponse, MetadataRequest, MetadataResponse,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;
use mmmq_core::Topic;

use super::Shared;
use super::connection::Session;
use crate::topics::TopicLog;

/// The cluster id Metadata reports.
const CLUSTER_ID: &str = "mmmq";

/// `(host, port)` clients reach this broker at.
pub(crate) fn advertised(shared: &Shared, session: &Session) -> (StrBytes, i32) {
    match &shared.advertised {
        Some((host, port)) => (StrBytes::from_string(host.clone()), *port),
        None => (
            StrBytes::from_string(session.local.ip().to_string()),
            i32::from(session.local.port()),
        ),
    }
}

/// The answer to a Metadata request.
pub(crate) async fn answer(
    shared: &Shared,
    session: &Session,
    request: MetadataRequest,
    version: i16,
) -> MetadataResponse {
    let (host, port) = advertised(shared, session);
    let me = BrokerId(shared.node_id);
    let registry = shared.broker.registry();
    // v0: an empty list means every topic; v1+: null does.
    let named = match request.topics {
        None => None,
        Some(t) if t.is_empty() && version == 0 => None,
        Some(t) => Some(t),
    };
    let auto_create = version < 4 || request.allow_auto_topic_creation;
    let mut topics = Vec::new();
    match named {
        None => {
            let mut all = registry.all();
            all.sort_by(|a, b| a.topic.as_str().cmp(b.topic.as_str()));
            for t in all {
                topics.push(describe(&t, me));
            }
        }
        Some(asked) => {
            for asked in asked {
                let Some(name) = asked.name else {
                    // By topic id (v10+ with a null name): not kept as Kafka's, refused.
                    topics.push(error_topic(None, ResponseError::UnknownTopicId));
                    continue;
                };
                topics.push(one_topic(shared, name, auto_create, me).await);
            }
        }
    }
    MetadataResponse::default()
        .with_brokers(vec![
            MetadataResponseBroker::default()
                .with_node_id(me)
                .with_host(host)
                .with_port(port),
        ])
        .with_cluster_id(Some(StrBytes::from_static_str(CLUSTER_ID)))
        .with_controller_id(me)
        .with_topics(topics)
}

async fn one_topic(
    shared: &Shared,
    name: TopicName,
    auto_create: bool,
    me: BrokerId,
) -> MetadataResponseTopic {
    let Ok(topic) = Topic::new(name.as_str()) else {
        return error_topic(Some(name), ResponseError::InvalidTopicException);
    };
    let registry = shared.broker.registry();
    if let Some(t) = registry.get(&topic) {
        return describe(&t, me);
    }
    if !auto_create || topic.is_internal() {
        return error_topic(Some(name), ResponseError::UnknownTopicOrPartition);
    }
    match registry.get_or_create(&topic).await {
        Ok(t) => describe(&t, me),
        Err(e) => {
            tracing::warn!(topic = %topic, error = %e, "kafka: cannot create topic");
            error_topic(Some(name), ResponseError::PolicyViolation)
        }
    }
}

/// A topic and its partitions, all led by this broker.
pub(crate) fn describe(t: &Arc<TopicLog>, me: BrokerId) -> MetadataResponseTopic {
    let partitions = (0..t.partition_count())
        .map(|p| {
            MetadataResponsePartition::default()
                .with_partition_index(p as i32)
                .with_leader_id(me)
                .with_leader_epoch(0)
                .with_replica_nodes(vec![me])
                .with_isr_nodes(vec![me])
        })
        .collect();
    MetadataResponseTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(
            t.topic.as_str().to_owned(),
        ))))
        .with_topic_id(uuid::Uuid::from_bytes(*t.id.as_bytes()))
        .with_is_internal(t.topic.is_internal())
        .with_partitions(partitions)
}

fn error_topic(name: Option<TopicName>, error: ResponseError) -> MetadataResponseTopic {
    MetadataResponseTopic::default()
        .with_name(name)
        .with_error_code(error.code())
}

/// FindCoordinator: this broker coordinates every group (and would every transaction, which it
/// refuses as unsupported: it keeps none).
pub(crate) fn coordinator(
    shared: &Shared,
    session: &Session,
    request: FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    let (host, port) = advertised(shared, session);
    let me = BrokerId(shared.node_id);
    // key_type 0: a group; 1: a transaction.
    let error = if request.key_type == 0 {
        0
    } else {
        ResponseError::CoordinatorNotAvailable.code()
    };
    if version < 4 {
        let mut answer = FindCoordinatorResponse::default().with_error_code(error);
        if error == 0 {
            answer = answer.with_node_id(me).with_host(host).with_port(port);
        } else {
            answer = answer.with_node_id(BrokerId(-1)).with_port(-1);
        }
        return answer;
    }
    let coordinators = request
        .coordinator_keys
        .into_iter()
        .map(|key| {
            let c = Coordinator::default().with_key(key).with_error_code(error);
            if error == 0 {
                c.with_node_id(me).with_host(host.clone()).with_port(port)
            } else {
                c.with_node_id(BrokerId(-1)).with_port(-1)
            }
        })
        .collect();
    FindCoordinatorResponse::default().with_coordinators(coordinators)
}
