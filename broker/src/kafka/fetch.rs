//! Fetch (docs/kafka.md, "APIs"): each partition's stored entries from the asked offset as one
//! record batch, up to its `partition_max_bytes` (at least one record, however large, as
//! Kafka's KIP-74), long-polling up to `max_wait_ms` while fewer than `min_bytes` are there.
//! No fetch sessions: the answer's session id is 0, so clients send full fetches.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::select_all;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{FetchRequest, FetchResponse};

use super::Shared;
use super::records;
use crate::kafka::{partition_of, serves_reads};
use crate::topics::Partition;

/// Most records one partition answers in one fetch.
const MAX_RECORDS: usize = 10_000;

/// The most a fetch answers, whatever it asks (Kafka's `fetch.max.bytes`, 55 MiB): a client's
/// `max_bytes` up to 2 GiB would have the broker encode an answer whose frame size wraps.
pub(crate) const FETCH_MAX_BYTES: usize = 55 << 20;

/// A fetch's (or a partition's) `max_bytes` as the broker takes it.
fn capped(max_bytes: i32) -> usize {
    (max_bytes.max(0) as usize).min(FETCH_MAX_BYTES)
}

/// The answer to a fetch.
pub(crate) async fn answer(shared: &Shared, request: FetchRequest, _version: i16) -> FetchResponse {
    let deadline = tokio::time::Instant::now()
        + Duration::from_millis(request.max_wait_ms.clamp(0, 60_000) as u64);
    let min_bytes = request.min_bytes.max(0) as usize;
    // Resolved once: (topic name, [(index, partition or error, fetch offset, max bytes)]).
    let mut wanted = Vec::with_capacity(request.topics.len());
    for t in &request.topics {
        let found = shared.topic(t.topic.as_str());
        let parts: Vec<_> = t
            .partitions
            .iter()
            .map(|p| {
                let partition = partition_of(found.as_ref(), p.partition);
                (
                    p.partition,
                    partition,
                    p.fetch_offset,
                    p.partition_max_bytes,
                )
            })
            .collect();
        wanted.push((t.topic.clone(), parts));
    }
    let mut budget = capped(request.max_bytes);
    loop {
        let mut total = 0usize;
        let mut responses = Vec::with_capacity(wanted.len());
        let mut waits = Vec::new();
        for (name, parts) in &wanted {
            let mut partitions = Vec::with_capacity(parts.len());
            for (index, partition, offset, max) in parts {
                let data = PartitionData::default().with_partition_index(*index);
                let Some(p) = partition else {
                    partitions.push(
                        data.with_error_code(ResponseError::UnknownTopicOrPartition.code())
                            .with_high_watermark(-1),
                    );
                    continue;
                };
                if let Err(e) = serves_reads(shared, name.as_str(), p) {
                    partitions.push(data.with_error_code(e.code()).with_high_watermark(-1));
                    continue;
                }
                let (first, next) = (p.log.first_offset(), p.log.next_offset());
                let data = data
                    .with_high_watermark(next as i64)
                    .with_last_stable_offset(next as i64)
                    .with_log_start_offset(first as i64);
                if *offset < first as i64 || *offset > next as i64 {
                    partitions.push(data.with_error_code(ResponseError::OffsetOutOfRange.code()));
                    continue;
                }
                let offset = *offset as u64;
                if offset == next {
                    waits.push(p.clone());
                    partitions.push(data.with_records(Some(Default::default())));
                    continue;
                }
                // As Kafka's `max_bytes`: only the first partition with records may go past
                // it (by its first record, so that a client can always make progress); a
                // later one answers what fits in what is left, which may be nothing.
                let left = budget.saturating_sub(total);
                if total > 0 && left == 0 {
                    partitions.push(data.with_records(Some(Default::default())));
                    continue;
                }
                let cap = capped(*max);
                let cap = cap.min(left).max(1);
                match read(p, offset, cap, total > 0).await {
                    // The batch's framing may still tip it over.
                    Ok(records) if total > 0 && records.len() > left => {
                        partitions.push(data.with_records(Some(Default::default())));
                    }
                    Ok(records) => {
                        total += records.len();
                        partitions.push(data.with_records(Some(records)));
                    }
                    Err(e) => {
                        tracing::warn!(topic = %name.as_str(), partition = index, error = %e, "kafka: fetch failed");
                        partitions
                            .push(data.with_error_code(ResponseError::KafkaStorageError.code()));
                    }
                }
            }
            responses.push(
                FetchableTopicResponse::default()
                    .with_topic(name.clone())
                    .with_partitions(partitions),
            );
        }
        let now = tokio::time::Instant::now();
        if total >= min_bytes.max(1) || now >= deadline || waits.is_empty() {
            return FetchResponse::default().with_responses(responses);
        }
        // Nothing yet (or too little): wait for any partition to grow, or the deadline.
        let grown = select_all(
            waits
                .iter()
                .map(|p| Box::pin(p.log.wait_for(p.log.next_offset()))),
        );
        tokio::select! {
            _ = grown => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
        budget = capped(request.max_bytes);
    }
}

/// Reads and encodes one partition's entries from `offset`, up to `max_bytes` of payload: at
/// least one entry unless `within` (then none larger than `max_bytes`).
async fn read(
    p: &Arc<Partition>,
    offset: u64,
    max_bytes: usize,
    within: bool,
) -> anyhow::Result<bytes::Bytes> {
    let log = p.log.clone();
    tokio::task::spawn_blocking(move || {
        let entries = if within {
            log.read_within(offset, MAX_RECORDS, max_bytes)?
        } else {
            log.read_from(offset, MAX_RECORDS, max_bytes)?
        };
        let entries: Vec<(u64, Vec<u8>)> = entries
            .into_iter()
            .filter_map(|e| e.payload.ok().map(|payload| (e.offset, payload)))
            .collect();
        records::encode(entries)
    })
    .await
    .expect("fetch read task panicked")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_bytes_is_taken_up_to_kafkas_fetch_max_bytes() {
        assert_eq!(capped(-1), 0);
        assert_eq!(capped(1 << 20), 1 << 20);
        assert_eq!(capped(i32::MAX), FETCH_MAX_BYTES);
    }
}
