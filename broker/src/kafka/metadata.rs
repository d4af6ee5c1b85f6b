//! Metadata and FindCoordinator (docs/kafka.md, "APIs"): the brokers, the topics with their
//! partitions and each partition's leader, and the groups' coordinator. Alone, a broker leads
//! every partition and coordinates every group; in a cluster (docs/kafka.md, "In a cluster"),
//! the brokers are those that announced a Kafka address in the metadata, each partition's
//! leader is its Raft group's, and the coordinator is the pull groups' (the metadata group's
//! leader).
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
                topics.push(describe(shared, &t));
            }
        }
        Some(asked) => {
            for asked in asked {
                let Some(name) = asked.name else {
                    // By topic id (v10+ with a null name): not kept as Kafka's, refused.
                    topics.push(error_topic(None, ResponseError::UnknownTopicId));
                    continue;
                };
                topics.push(one_topic(shared, name, auto_create).await);
            }
        }
    }
    let brokers = brokers(shared, session)
        .into_iter()
        .map(|(id, host, port)| {
            MetadataResponseBroker::default()
                .with_node_id(id)
                .with_host(host)
                .with_port(port)
        })
        .collect();
    // The broker a client sends CreateTopics and DeleteTopics to: any broker of a cluster
    // makes them through the metadata group, so this one, which the list always holds.
    let controller = BrokerId(shared.node_id);
    MetadataResponse::default()
        .with_brokers(brokers)
        .with_cluster_id(Some(StrBytes::from_string(cluster_id(shared))))
        .with_controller_id(controller)
        .with_topics(topics)
}

/// The cluster id Metadata reports: the cluster's own in a cluster.
fn cluster_id(shared: &Shared) -> String {
    shared
        .broker
        .cluster()
        .and_then(|c| c.cluster_id())
        .unwrap_or_else(|| CLUSTER_ID.to_owned())
}

/// The brokers a client may connect to: `(node id, host, port)`, this one first. In a cluster,
/// those that announced a Kafka address (docs/kafka.md, "In a cluster").
fn brokers(shared: &Shared, session: &Session) -> Vec<(BrokerId, StrBytes, i32)> {
    let (host, port) = advertised(shared, session);
    let me = shared.node_id;
    let mut out = vec![(BrokerId(me), host, port)];
    if let Some(cluster) = shared.broker.cluster() {
        for (id, addr) in cluster.kafka_brokers() {
            if id as i32 == me {
                continue;
            }
            if let Some((host, port)) = addr
                .rsplit_once(':')
                .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
            {
                out.push((
                    BrokerId(id as i32),
                    StrBytes::from_string(host.to_owned()),
                    i32::from(port),
                ));
            }
        }
    }
    out
}

/// The Kafka address of broker `id`, if a client can reach it.
pub(crate) fn broker_address(
    shared: &Shared,
    session: &Session,
    id: i32,
) -> Option<(StrBytes, i32)> {
    brokers(shared, session)
        .into_iter()
        .find(|(b, _, _)| b.0 == id)
        .map(|(_, h, p)| (h, p))
}

async fn one_topic(shared: &Shared, name: TopicName, auto_create: bool) -> MetadataResponseTopic {
    let Ok(topic) = Topic::new(name.as_str()) else {
        return error_topic(Some(name), ResponseError::InvalidTopicException);
    };
    let registry = shared.broker.registry();
    if let Some(t) = registry.get(&topic) {
        return describe(shared, &t);
    }
    if !auto_create || topic.is_internal() {
        return error_topic(Some(name), ResponseError::UnknownTopicOrPartition);
    }
    match shared.broker.topic_or_create(&topic).await {
        Ok(t) => describe(shared, &t),
        Err(e) => {
            tracing::warn!(topic = %topic, error = %e, "kafka: cannot create topic");
            error_topic(Some(name), ResponseError::PolicyViolation)
        }
    }
}

/// A topic and its partitions with their leaders.
pub(crate) fn describe(shared: &Shared, t: &Arc<TopicLog>) -> MetadataResponseTopic {
    let me = BrokerId(shared.node_id);
    let partitions = (0..t.partition_count())
        .map(|p| {
            let answer = MetadataResponsePartition::default().with_partition_index(p as i32);
            let Some(cluster) = shared.broker.cluster() else {
                return answer
                    .with_leader_id(me)
                    .with_leader_epoch(0)
                    .with_replica_nodes(vec![me])
                    .with_isr_nodes(vec![me]);
            };
            let name = t.topic.as_str();
            let replicas: Vec<BrokerId> = cluster
                .replicas_of(name, p)
                .into_iter()
                .map(|b| BrokerId(b as i32))
                .collect();
            // A leader without a Kafka address (its broker has no listener yet) is as good as
            // none to a Kafka client: it asks again.
            let announced = cluster.kafka_brokers();
            let leader = cluster
                .leader_of(name, p)
                .filter(|l| *l == cluster.id() || announced.iter().any(|(b, _)| b == l));
            // Leader epochs are not kept as Kafka's: −1 (unknown) lets clients take every
            // leader Metadata names.
            let answer = answer
                .with_leader_epoch(-1)
                .with_isr_nodes(replicas.clone())
                .with_replica_nodes(replicas);
            match leader {
                Some(l) => answer.with_leader_id(BrokerId(l as i32)),
                None => answer
                    .with_leader_id(BrokerId(-1))
                    .with_error_code(ResponseError::LeaderNotAvailable.code()),
            }
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

/// FindCoordinator: this broker coordinates every group alone, the metadata group's leader in
/// a cluster (transactions are refused as unsupported: none are kept).
pub(crate) fn coordinator(
    shared: &Shared,
    session: &Session,
    request: FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    let coordinator = match shared.broker.cluster() {
        None => Some(shared.node_id),
        Some(c) => c.coordinator().0.map(|l| l as i32),
    };
    let found = coordinator.and_then(|id| Some((id, broker_address(shared, session, id)?)));
    // key_type 0: a group; 1: a transaction.
    let (error, me, host, port) = match found {
        Some((id, (host, port))) if request.key_type == 0 => (0, BrokerId(id), host, port),
        _ => (
            ResponseError::CoordinatorNotAvailable.code(),
            BrokerId(-1),
            StrBytes::default(),
            -1,
        ),
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
