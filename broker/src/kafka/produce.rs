//! Produce (docs/kafka.md, "APIs"): each partition's record batch appended with one commit, the
//! group commit of every other produce (docs/storage.md, "Group commit"); answered once durable,
//! for `acks` 1 and all alike (mmmq acknowledges nothing before its fsync); `acks=0` gets no
//! answer, as Kafka's. Partitions of one request are appended concurrently.
//!
//! In a cluster (docs/kafka.md, "In a cluster") a batch is written through the partition's Raft
//! group at this broker only, its leader, and answered once a majority of its replicas hold it;
//! a broker that does not lead the partition answers `NOT_LEADER_OR_FOLLOWER`, and the client
//! goes to the leader Metadata names.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use bytes::Bytes;
use futures_util::future::join_all;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kafka_protocol::protocol::StrBytes;
use mmmq_core::Topic;

use super::Shared;
use super::compression::DecompressError;
use super::producers::{State, Verdict};
use super::records::{self, Batch};
use crate::broker::Broker;
use crate::cluster::kafka::LeaderWriteError;
use crate::topics::Partition;

/// The answer to a produce; `None` for `acks=0`.
pub(crate) async fn answer(
    shared: &Shared,
    request: ProduceRequest,
    _version: i16,
) -> Option<ProduceResponse> {
    let acks = request.acks;
    let transactional = request.transactional_id.is_some();
    let mut responses = Vec::with_capacity(request.topic_data.len());
    // What the request's compressed batches may expand into, all of them together: the frame
    // limit (a request of many partitions, each a decompression bomb, is held to it too).
    let budget = &AtomicUsize::new(shared.limits.max_frame);
    for topic in request.topic_data {
        let name = topic.name.clone();
        let answers = join_all(topic.partition_data.into_iter().map(|p| {
            let name = name.0.as_str().to_owned();
            async move {
                let result = if !matches!(acks, -1..=1) {
                    Err((ResponseError::InvalidRequiredAcks, None))
                } else if transactional {
                    Err((ResponseError::TransactionalIdAuthorizationFailed, None))
                } else {
                    let records = p.records.unwrap_or_default();
                    one_partition(shared, &name, p.index, records, budget).await
                };
                let mut r = PartitionProduceResponse::default().with_index(p.index);
                match result {
                    Ok((base, log_start)) => {
                        r = r
                            .with_base_offset(base as i64)
                            .with_log_start_offset(log_start as i64);
                    }
                    Err((e, message)) => {
                        r = r
                            .with_error_code(e.code())
                            .with_base_offset(-1)
                            .with_error_message(message.map(StrBytes::from_string));
                    }
                }
                r
            }
        }))
        .await;
        responses.push(
            TopicProduceResponse::default()
                .with_name(name)
                .with_partition_responses(answers),
        );
    }
    (acks != 0).then(|| ProduceResponse::default().with_responses(responses))
}

type Refusal = (ResponseError, Option<String>);

/// Appends one partition's batch: `(base offset, log start offset)`.
async fn one_partition(
    shared: &Shared,
    topic: &str,
    partition: i32,
    records: Bytes,
    budget: &AtomicUsize,
) -> Result<(u64, u64), Refusal> {
    let topic = Topic::new(topic)
        .map_err(|e| (ResponseError::InvalidTopicException, Some(e.to_string())))?;
    if topic.is_internal() {
        return Err((
            ResponseError::InvalidTopicException,
            Some(format!("{topic} is internal")),
        ));
    }
    let t = shared
        .broker
        .registry()
        .get(&topic)
        .ok_or((ResponseError::UnknownTopicOrPartition, None))?;
    let p = u32::try_from(partition)
        .ok()
        .and_then(|n| t.partition(n))
        .ok_or((ResponseError::UnknownTopicOrPartition, None))?;
    let cluster = shared.broker.cluster();
    // Checked before the batch is decoded: a client with stale metadata costs little.
    if cluster.is_some_and(|c| !c.leads_partition(topic.as_str(), p.number)) {
        return Err((ResponseError::NotLeaderOrFollower, None));
    }
    let batches = records::decode(records, budget).map_err(|e| {
        let code = match e.downcast_ref::<DecompressError>() {
            Some(DecompressError::TooLarge(..)) => ResponseError::MessageTooLarge,
            _ => ResponseError::CorruptMessage,
        };
        (code, Some(e.to_string()))
    })?;
    let [batch] = <[Batch; 1]>::try_from(batches).map_err(|b| {
        (
            ResponseError::InvalidRecord,
            Some(format!(
                "{} record batches; a produce carries one per partition",
                b.len()
            )),
        )
    })?;
    if batch.transactional {
        return Err((ResponseError::TransactionalIdAuthorizationFailed, None));
    }
    if let Some(big) = batch
        .payloads
        .iter()
        .find(|p| p.len() > shared.limits.max_record)
    {
        return Err((
            ResponseError::MessageTooLarge,
            Some(format!(
                "a record of {} bytes; the limit is {} (--max-body-bytes)",
                big.len(),
                shared.limits.max_record
            )),
        ));
    }
    if batch.payloads.is_empty() {
        return Err((ResponseError::InvalidRecord, Some("an empty batch".into())));
    }
    // In a cluster: the term this broker leads in, once every batch committed before is in
    // its log (the idempotent producers' state is read back from it).
    let term = match cluster {
        Some(c) => Some(
            c.leading_term(topic.as_str(), p.number)
                .await
                .map_err(leader_refusal)?,
        ),
        None => None,
    };
    let base = if batch.producer_id >= 0 {
        idempotent(shared, &topic, &p, batch, term).await?
    } else {
        let write = append(&shared.broker, &topic, &p, batch.payloads, term);
        tokio::time::timeout(WRITE_WAIT, write)
            .await
            .map_err(|_| timed_out())??
    };
    Ok((base, p.log.first_offset()))
}

/// How long a produce waits for its batch to be committed in a cluster before it answers
/// `REQUEST_TIMED_OUT` (the write may still be committed).
const WRITE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn timed_out() -> Refusal {
    (
        ResponseError::RequestTimedOut,
        Some(format!(
            "not committed by a majority of the partition's replicas within {} s",
            WRITE_WAIT.as_secs()
        )),
    )
}

/// Kafka's answer to a write a cluster refused.
fn leader_refusal(e: LeaderWriteError) -> Refusal {
    let code = match &e {
        LeaderWriteError::NotLeader => ResponseError::NotLeaderOrFollower,
        LeaderWriteError::NotReady(_) => ResponseError::LeaderNotAvailable,
        LeaderWriteError::Unknown(_) => ResponseError::RequestTimedOut,
        LeaderWriteError::Failed(_) => ResponseError::KafkaStorageError,
    };
    (code, Some(e.to_string()))
}

/// Appends a batch: to the local log alone, or through the partition's group in `term`.
async fn append(
    broker: &Broker,
    topic: &Topic,
    p: &Partition,
    payloads: Vec<Vec<u8>>,
    term: Option<u64>,
) -> Result<u64, Refusal> {
    let (count, bytes) = (payloads.len(), payloads.iter().map(Vec::len).sum());
    let first = match (broker.cluster(), term) {
        (Some(cluster), Some(term)) => {
            let payloads = payloads.into_iter().map(Bytes::from).collect();
            let offsets = cluster
                .write_in_term(topic.as_str(), p.number, term, payloads)
                .await
                .map_err(leader_refusal)?;
            offsets[0]
        }
        _ => p.log.append_batch(&payloads).await.map_err(|e| {
            tracing::warn!(topic = %topic, partition = p.number, error = %e, "kafka: produce failed");
            (ResponseError::KafkaStorageError, Some(e.to_string()))
        })?,
    };
    broker.metrics().count_in(topic, count as u64, bytes);
    Ok(first)
}

/// An idempotent producer's batch: judged against its last batches in this partition, under
/// its lock (a retry on another connection waits for the first copy's outcome).
///
/// In a cluster the state belongs to the leader's `term`: a leader in a new term reads it back
/// from its log, which holds every batch committed before. The write runs in a task of its own
/// holding the lock until its outcome is known, whatever happens to the request (a retry of a
/// batch still being written in the same term would find no trace of it in the log).
async fn idempotent(
    shared: &Shared,
    topic: &Topic,
    p: &Arc<Partition>,
    batch: Batch,
    term: Option<u64>,
) -> Result<u64, Refusal> {
    let slot = shared
        .producers
        .slot(batch.producer_id, p.topic_id, p.number);
    let mut state = tokio::time::timeout(WRITE_WAIT, slot.lock_owned())
        .await
        .map_err(|_| timed_out())?;
    let generation = term.unwrap_or(0);
    if state.as_ref().is_none_or(|s| s.generation != generation) {
        let known = if term.is_some() || shared.producers.predates_boot(batch.producer_id) {
            shared.scans.take(p, batch.producer_id, generation).await?
        } else {
            State::default()
        };
        *state = Some(known);
    }
    let count = batch.payloads.len() as i32;
    let (epoch, first) = (batch.producer_epoch, batch.base_sequence);
    let last = first.wrapping_add(count - 1);
    let mut payloads = batch.payloads;
    // The sequence the records to write start at, and the answer's base offset if some
    // are stored already.
    let (from, base) = match state.as_ref().expect("filled").judge(epoch, first, last) {
        Verdict::Duplicate(offset) => return Ok(offset),
        Verdict::Refuse(e) => {
            // A leader deposed without knowing it judged by its old term's state: the client
            // takes the refusal as fatal, so it is given only by the partition's leader.
            if let (Some(cluster), Some(term)) = (shared.broker.cluster(), term) {
                cluster
                    .confirm_leading(topic.as_str(), p.number, term)
                    .await
                    .map_err(leader_refusal)?;
            }
            return Err((e, None));
        }
        Verdict::Append => (first, None),
        Verdict::Rest { stored, base } => {
            payloads.drain(..stored);
            (first.wrapping_add(stored as i32), Some(base))
        }
    };
    let (broker, topic, p) = (shared.broker.clone(), topic.clone(), p.clone());
    let scans = shared.scans.clone();
    let write = tokio::spawn(async move {
        let written = append(&broker, &topic, &p, payloads, term).await;
        match &written {
            Ok(offset) => {
                let s = state.as_mut().expect("filled");
                s.stored(epoch, from, last, *offset);
            }
            // Maybe stored: known again only from the log, read anew.
            Err(_) if term.is_some() => {
                *state = None;
                scans.forget(&p);
            }
            // Alone, a failed append stored nothing.
            Err(_) => {}
        }
        written
    });
    match tokio::time::timeout(WRITE_WAIT, write).await {
        Ok(written) => written
            .expect("produce task panicked")
            .map(|offset| base.unwrap_or(offset)),
        Err(_) => Err(timed_out()),
    }
}
