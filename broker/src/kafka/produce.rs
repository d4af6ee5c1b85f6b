//! Produce (docs/kafka.md, "APIs"): each partition's record batch appended with one commit, the
//! group commit of every other produce (docs/storage.md, "Group commit"); answered once durable,
//! for `acks` 1 and all alike (mmmq acknowledges nothing before its fsync); `acks=0` gets no
//! answer, as Kafka's. Partitions of one request are appended concurrently.

use std::sync::Arc;

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
use crate::topics::Partition;

/// Records read back to find a restarted producer's last batches.
const SCAN_BACK: u64 = 100_000;

/// The answer to a produce; `None` for `acks=0`.
pub(crate) async fn answer(
    shared: &Shared,
    request: ProduceRequest,
    _version: i16,
) -> Option<ProduceResponse> {
    let acks = request.acks;
    let transactional = request.transactional_id.is_some();
    let mut responses = Vec::with_capacity(request.topic_data.len());
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
                    one_partition(shared, &name, p.index, p.records.unwrap_or_default()).await
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
    if shared.broker.cluster().is_some() {
        // Clustered produce goes through the partition's Raft group (docs/cluster.md); not
        // yet spoken over Kafka.
        return Err((ResponseError::NotLeaderOrFollower, None));
    }
    let batches = records::decode(records, shared.limits.max_frame).map_err(|e| {
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
    let base = if batch.producer_id >= 0 {
        idempotent(shared, &topic, &p, batch).await?
    } else {
        append(shared, &topic, &p, &batch.payloads).await?
    };
    Ok((base, p.log.first_offset()))
}

async fn append(
    shared: &Shared,
    topic: &Topic,
    p: &Partition,
    payloads: &[Vec<u8>],
) -> Result<u64, Refusal> {
    let bytes: usize = payloads.iter().map(Vec::len).sum();
    let first = p.log.append_batch(payloads).await.map_err(|e| {
        tracing::warn!(topic = %topic, partition = p.number, error = %e, "kafka: produce failed");
        (ResponseError::KafkaStorageError, Some(e.to_string()))
    })?;
    shared
        .broker
        .metrics()
        .count_in(topic, payloads.len() as u64, bytes);
    Ok(first)
}

/// An idempotent producer's batch: judged against its last batches in this partition, under
/// its lock (a retry on another connection waits for the first copy's outcome).
async fn idempotent(
    shared: &Shared,
    topic: &Topic,
    p: &Arc<Partition>,
    batch: Batch,
) -> Result<u64, Refusal> {
    let count = batch.payloads.len() as i32;
    let first = batch.base_sequence;
    let last = first.wrapping_add(count - 1);
    let slot = shared
        .producers
        .slot(batch.producer_id, p.topic_id, p.number);
    let mut state = slot.lock().await;
    if state.is_none() {
        let known = if shared.producers.predates_boot(batch.producer_id) {
            read_back(p, batch.producer_id).await?
        } else {
            State::default()
        };
        *state = Some(known);
    }
    let s = state.as_mut().expect("filled");
    match s.judge(batch.producer_epoch, first, last) {
        Verdict::Duplicate(offset) => Ok(offset),
        Verdict::Refuse(e) => Err((e, None)),
        Verdict::Append => {
            let offset = append(shared, topic, p, &batch.payloads).await?;
            s.stored(batch.producer_epoch, first, last, offset);
            Ok(offset)
        }
    }
}

/// A producer's last batches in `p`, read from its newest records (up to [`SCAN_BACK`]).
async fn read_back(p: &Arc<Partition>, producer: i64) -> Result<State, Refusal> {
    let log = p.log.clone();
    tokio::task::spawn_blocking(move || {
        let end = log.next_offset();
        let start = end.saturating_sub(SCAN_BACK).max(log.first_offset());
        let mut state = State::default();
        let mut from = start;
        // (epoch, first seq, last seq, first offset) of the run being read.
        let mut run: Option<(i16, i32, i32, u64)> = None;
        while from < end {
            let entries = log
                .read_from(from, 1000, 8 << 20)
                .map_err(|e| (ResponseError::KafkaStorageError, Some(e.to_string())))?;
            let Some(last) = entries.last() else { break };
            from = last.offset + 1;
            for e in entries {
                let Ok(payload) = e.payload else { continue };
                let Ok(r) = mmmq_core::record::read_record_payload(&payload) else {
                    continue;
                };
                let Some((id, epoch, seq)) = r.producer else {
                    continue;
                };
                if id != producer {
                    continue;
                }
                // One run: the same epoch, the next sequence at the next offset.
                run = match run {
                    Some((ep, f, l, o))
                        if ep == epoch
                            && seq == l.wrapping_add(1)
                            && e.offset == o + (seq.wrapping_sub(f)) as u64 =>
                    {
                        Some((ep, f, seq, o))
                    }
                    Some((ep, f, l, o)) => {
                        state.stored(ep, f, l, o);
                        Some((epoch, seq, seq, e.offset))
                    }
                    None => Some((epoch, seq, seq, e.offset)),
                };
            }
        }
        if let Some((ep, f, l, o)) = run {
            state.stored(ep, f, l, o);
        }
        Ok(state)
    })
    .await
    .expect("read task panicked")
}
