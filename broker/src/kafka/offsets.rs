//! ListOffsets (docs/kafka.md, "APIs"): the earliest offset (−2), the latest (−1), the newest
//! record's (−3), or the first offset whose timestamp is at or after a time. By time, a binary
//! search over the partition's timestamps, one entry read per step: exact for a partition whose
//! timestamps grow with offsets (the broker's own clock, or producers' create times in order).

use kafka_protocol::ResponseError;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};

use super::Shared;
use crate::kafka::{partition_of, serves_reads};
use crate::storage::Log;

const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;

/// The answer to ListOffsets.
pub(crate) async fn list(
    shared: &Shared,
    request: ListOffsetsRequest,
    version: i16,
) -> ListOffsetsResponse {
    let mut topics = Vec::with_capacity(request.topics.len());
    for t in request.topics {
        let found = shared.topic(t.name.as_str());
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in t.partitions {
            let answer =
                ListOffsetsPartitionResponse::default().with_partition_index(p.partition_index);
            let Some(partition) = partition_of(found.as_ref(), p.partition_index) else {
                partitions.push(
                    answer
                        .with_error_code(ResponseError::UnknownTopicOrPartition.code())
                        .with_offset(-1)
                        .with_timestamp(-1),
                );
                continue;
            };
            if let Err(e) = serves_reads(shared, t.name.as_str(), &partition) {
                partitions.push(
                    answer
                        .with_error_code(e.code())
                        .with_offset(-1)
                        .with_timestamp(-1),
                );
                continue;
            }
            let log = partition.log.clone();
            let target = p.timestamp;
            let found = tokio::task::spawn_blocking(move || lookup(&log, target))
                .await
                .expect("list offsets task panicked");
            partitions.push(match found {
                // A leader epoch exists from v4 on (encoding one before fails).
                Some((offset, timestamp)) => answer
                    .with_offset(offset)
                    .with_timestamp(timestamp)
                    .with_leader_epoch(if version >= 4 { 0 } else { -1 }),
                None => answer.with_offset(-1).with_timestamp(-1),
            });
        }
        topics.push(
            ListOffsetsTopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    ListOffsetsResponse::default().with_topics(topics)
}

/// `(offset, timestamp)` for `target`; `None` when no record is at or after a time.
fn lookup(log: &Log, target: i64) -> Option<(i64, i64)> {
    let (first, next) = (log.first_offset(), log.next_offset());
    match target {
        LATEST => Some((next as i64, -1)),
        EARLIEST => Some((first as i64, -1)),
        MAX_TIMESTAMP => {
            if next == first {
                return Some((-1, -1));
            }
            let at = timestamp_at(log, next - 1)?;
            Some(((next - 1) as i64, at as i64))
        }
        t if t < 0 => Some((next as i64, -1)),
        t => {
            let (mut lo, mut hi) = (first, next);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                // An unreadable entry counts as earlier: the search moves past it.
                match timestamp_at(log, mid) {
                    Some(at) if at as i64 >= t => hi = mid,
                    _ => lo = mid + 1,
                }
            }
            if lo == next {
                return None;
            }
            let at = timestamp_at(log, lo)?;
            Some((lo as i64, at as i64))
        }
    }
}

/// The timestamp of the entry at `offset`.
fn timestamp_at(log: &Log, offset: u64) -> Option<u64> {
    let entry = log.read_from(offset, 1, 1).ok()?.into_iter().next()?;
    if entry.offset != offset {
        return None;
    }
    mmmq_core::record::payload_timestamp(&entry.payload.ok()?)
}
