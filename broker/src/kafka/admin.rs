//! CreateTopics, DeleteTopics and DescribeConfigs (docs/kafka.md, "APIs"), through the same
//! calls as `PUT` and `DELETE /mmmq/topics/{topic}` (docs/topics-and-groups.md, "Topics"):
//! `num_partitions` is the topic's `partitions`, the configs `retention.ms` and `retention.bytes`
//! its `retentionMs` and `retentionBytes`; other configs are refused (`INVALID_CONFIG`).

use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::{
    CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse,
    DescribeConfigsRequest, DescribeConfigsResponse,
};
use kafka_protocol::protocol::StrBytes;
use mmmq_core::Topic;
use serde_json::json;

use super::Shared;
use crate::broker::BrokerError;

/// Kafka's answer to a refused topic operation.
fn error_of(e: &BrokerError) -> ResponseError {
    match e {
        BrokerError::InvalidName(_) => ResponseError::InvalidTopicException,
        BrokerError::UnknownTopic(_) => ResponseError::UnknownTopicOrPartition,
        BrokerError::InvalidSettings(_) | BrokerError::InvalidOptions(_) => {
            ResponseError::InvalidConfig
        }
        BrokerError::Storage(crate::storage::StorageError::TopicLimit { .. }) => {
            ResponseError::PolicyViolation
        }
        _ => ResponseError::UnknownServerError,
    }
}

/// CreateTopics: each topic created unless it exists; `validate_only` checks and creates
/// nothing.
pub(crate) async fn create_topics(
    shared: &Shared,
    request: CreateTopicsRequest,
    _version: i16,
) -> CreateTopicsResponse {
    let mut results = Vec::with_capacity(request.topics.len());
    for t in request.topics {
        let result = CreatableTopicResult::default().with_name(t.name.clone());
        let refuse = |e: ResponseError, why: String| {
            result
                .clone()
                .with_error_code(e.code())
                .with_error_message(Some(StrBytes::from_string(why)))
        };
        let name = t.name.as_str();
        let topic = match Topic::new(name) {
            Ok(topic) if !topic.is_internal() => topic,
            Ok(_) => {
                results.push(refuse(
                    ResponseError::InvalidTopicException,
                    format!("{name} is internal (names starting with __)"),
                ));
                continue;
            }
            Err(e) => {
                results.push(refuse(ResponseError::InvalidTopicException, e.to_string()));
                continue;
            }
        };
        if shared.broker.registry().get(&topic).is_some() {
            results.push(refuse(
                ResponseError::TopicAlreadyExists,
                format!("topic {name} already exists"),
            ));
            continue;
        }
        let cluster = shared.broker.cluster();
        let brokers = cluster.map_or(1, |c| c.broker_count());
        let most = brokers.min(5) as i16;
        if t.replication_factor == 0 || t.replication_factor < -1 || t.replication_factor > most {
            results.push(refuse(
                ResponseError::InvalidReplicationFactor,
                format!(
                    "replication factor {}: 1 to {most} here",
                    t.replication_factor
                ),
            ));
            continue;
        }
        let mut body = serde_json::Map::new();
        if t.replication_factor > 0 && cluster.is_some() {
            body.insert("replicationFactor".into(), json!(t.replication_factor));
        }
        if t.num_partitions > 0 {
            body.insert("partitions".into(), json!(t.num_partitions));
        } else if t.num_partitions != -1 {
            results.push(refuse(
                ResponseError::InvalidPartitions,
                format!("{} partitions", t.num_partitions),
            ));
            continue;
        }
        let mut bad = None;
        for c in &t.configs {
            let value = c.value.as_ref().map(|v| v.as_str().to_owned());
            let parsed = value.as_deref().map(str::parse::<i64>);
            match (c.name.as_str(), parsed) {
                ("retention.ms", Some(Ok(-1))) => {
                    body.insert("retentionMs".into(), json!("forever"));
                }
                ("retention.ms", Some(Ok(ms))) if ms >= 0 => {
                    body.insert("retentionMs".into(), json!(ms));
                }
                ("retention.bytes", Some(Ok(-1))) => {}
                ("retention.bytes", Some(Ok(b))) if b >= 0 => {
                    body.insert("retentionBytes".into(), json!(b));
                }
                (other, _) => bad = Some(format!("config {other}={value:?} is not supported")),
            }
        }
        if let Some(why) = bad {
            results.push(refuse(ResponseError::InvalidConfig, why));
            continue;
        }
        if request.validate_only {
            results.push(result.with_num_partitions(t.num_partitions));
            continue;
        }
        let body = serde_json::to_vec(&body).expect("JSON encodes");
        match shared.broker.put_topic(name, &body).await {
            Ok(detail) => {
                let replicas = cluster.map_or(1, |c| c.replicas_of(name, 0).len());
                results.push(
                    result
                        .with_num_partitions(detail.config.partitions as i32)
                        .with_replication_factor(replicas as i16),
                )
            }
            Err(e) => results.push(refuse(error_of(&e), e.to_string())),
        }
    }
    CreateTopicsResponse::default().with_topics(results)
}

/// DeleteTopics, by name (v1–5).
pub(crate) async fn delete_topics(
    shared: &Shared,
    request: DeleteTopicsRequest,
    _version: i16,
) -> DeleteTopicsResponse {
    let mut responses = Vec::new();
    for name in request.topic_names {
        let result = DeletableTopicResult::default().with_name(Some(name.clone()));
        let result = match shared.broker.delete_topic(name.as_str()).await {
            Ok(()) => result,
            Err(e) => result
                .with_error_code(error_of(&e).code())
                .with_error_message(Some(StrBytes::from_string(e.to_string()))),
        };
        responses.push(result);
    }
    DeleteTopicsResponse::default().with_responses(responses)
}

/// DescribeConfigs: a topic's `retention.ms`, `retention.bytes` and `cleanup.policy`; a broker
/// (resource type 4) has none to show.
pub(crate) fn describe_configs(
    shared: &Shared,
    request: DescribeConfigsRequest,
) -> DescribeConfigsResponse {
    let results = request
        .resources
        .into_iter()
        .map(|r| {
            let result = DescribeConfigsResult::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone());
            match r.resource_type {
                2 => {
                    let found = shared.topic(r.resource_name.as_str());
                    let Some(t) = found else {
                        return result
                            .with_error_code(ResponseError::UnknownTopicOrPartition.code());
                    };
                    let config = shared.broker.registry().config_of(&t);
                    let entries = [
                        (
                            "retention.ms",
                            config.retention_ms.map_or("-1".into(), |ms| ms.to_string()),
                        ),
                        (
                            "retention.bytes",
                            config
                                .retention_bytes
                                .map_or("-1".into(), |b| b.to_string()),
                        ),
                        ("cleanup.policy", "delete".into()),
                    ];
                    // Null names every config; so does an empty list (nothing would be useless).
                    let wanted = r.configuration_keys.filter(|w| !w.is_empty());
                    result.with_configs(
                        entries
                            .into_iter()
                            .filter(|(k, _)| {
                                wanted
                                    .as_ref()
                                    .is_none_or(|w| w.iter().any(|x| x.as_str() == *k))
                            })
                            .map(|(k, v)| {
                                DescribeConfigsResourceResult::default()
                                    .with_name(StrBytes::from_static_str(k))
                                    .with_value(Some(StrBytes::from_string(v)))
                                    .with_read_only(k == "cleanup.policy")
                                    .with_config_source(1)
                            })
                            .collect(),
                    )
                }
                4 => result,
                _ => result.with_error_code(ResponseError::InvalidRequest.code()),
            }
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}
