//! Stored messages as Kafka records and back (docs/kafka.md, "Bytes in, the same bytes out").
//!
//! A produced batch is decoded (decompressed if it was compressed) and each record stored as a
//! record payload (`mmmq_core::record`), its key, value, headers and timestamp as they came. A
//! fetch encodes the stored entries of a partition as one uncompressed magic-2 batch, which
//! every client reads: a record payload gives its bytes back; a message produced over HTTP gives
//! its content's JSON text as the value and its key's UTF-8 bytes as the key.

use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use mmmq_core::record::{RecordRef, read_record_payload, record_payload_len, write_record_payload};
use mmmq_core::{StoredMessage, now_ms};

/// One produced batch, decoded.
pub(crate) struct Batch {
    /// The producer id (−1: not idempotent), its epoch and the first record's sequence.
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    /// Whether the batch is transactional (refused: mmmq keeps no transactions).
    pub transactional: bool,
    /// The records' payloads, ready to append.
    pub payloads: Vec<Vec<u8>>,
}

/// Decodes the record batches of one partition of a produce, compressed ones decompressed into
/// what is left of `budget`, which they then use up (`super::compression`): one request's
/// batches together, whatever partitions they name, expand into no more than its budget.
pub(crate) fn decode(mut records: Bytes, budget: &AtomicUsize) -> anyhow::Result<Vec<Batch>> {
    let mut batches = Vec::new();
    let decompress = |data: &mut Bytes, c: Compression| {
        if c == Compression::None {
            return Ok(data.split_to(data.len()));
        }
        let out = super::compression::decompress(data, c, budget.load(Ordering::Relaxed))?;
        // Another partition's batch may have drawn on it meanwhile: at worst the budget ends.
        let _ = budget.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
            Some(left.saturating_sub(out.len()))
        });
        Ok::<_, anyhow::Error>(out)
    };
    while !records.is_empty() {
        let set =
            RecordBatchDecoder::decode_with_custom_compression(&mut records, Some(decompress))?;
        let first = set.records.first();
        let now = now_ms();
        let mut payloads = Vec::with_capacity(set.records.len());
        for r in &set.records {
            let headers: Vec<(&str, Option<&[u8]>)> = r
                .headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_deref()))
                .collect();
            let record = RecordRef {
                // The broker's clock, which retention and status read; the producer's time is
                // kept beside it for Kafka's consumers.
                timestamp: now,
                create_time: (r.timestamp >= 0).then_some(r.timestamp),
                key: r.key.as_deref(),
                value: r.value.as_deref(),
                headers,
                producer: (r.producer_id >= 0).then_some((
                    r.producer_id,
                    r.producer_epoch,
                    r.sequence,
                )),
            };
            let mut out = Vec::with_capacity(record_payload_len(
                record.key,
                record.value,
                &record.headers,
            ));
            write_record_payload(&mut out, &record);
            payloads.push(out);
        }
        batches.push(Batch {
            producer_id: first.map_or(-1, |r| r.producer_id),
            producer_epoch: first.map_or(-1, |r| r.producer_epoch),
            base_sequence: first.map_or(-1, |r| r.sequence),
            transactional: first.is_some_and(|r| r.transactional),
            payloads,
        });
    }
    Ok(batches)
}

/// One stored entry as a record at `offset`.
fn record_of(offset: u64, base: u64, payload: Vec<u8>) -> Option<Record> {
    let (timestamp, key, value, headers) = if mmmq_core::record::is_record_payload(&payload) {
        let payload = Bytes::from(payload);
        let r = read_record_payload(&payload).ok()?;
        let slice = |s: &[u8]| payload.slice_ref(s);
        let headers = r
            .headers
            .iter()
            .map(|(k, v)| (StrBytes::from_string((*k).to_owned()), v.map(slice)))
            .collect();
        let at = r.create_time.unwrap_or(r.timestamp as i64);
        (at, r.key.map(slice), r.value.map(slice), headers)
    } else {
        let m = StoredMessage::from_payload(&payload).ok()?;
        let key = match (&m.key, &m.binary.key_base64) {
            (Some(k), _) => Some(Bytes::from(k.clone().into_bytes())),
            (None, Some(b)) => mmmq_core::record::decode_base64(b).map(Bytes::from),
            (None, None) => None,
        };
        let value = mmmq_core::record::value_of_content(&m.content, m.binary.content_base64)
            .map(Bytes::from);
        let headers = m
            .binary
            .headers
            .iter()
            .map(|h| {
                let v = h
                    .value_base64
                    .as_deref()
                    .and_then(mmmq_core::record::decode_base64)
                    .map(Bytes::from);
                (StrBytes::from_string(h.key.clone()), v)
            })
            .collect();
        (m.timestamp as i64, key, value, headers)
    };
    Some(Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: offset as i64,
        // Constant `offset - sequence` keeps the records in one batch (the encoder splits
        // where it changes); −1 as the batch's base sequence: not idempotent.
        sequence: (offset - base) as i32 - 1,
        timestamp,
        key,
        value,
        headers,
    })
}

/// Encodes stored entries (offset, payload) as record batches; an unreadable entry is left out
/// (the gap in offsets shows it, as in a pull).
pub(crate) fn encode(entries: Vec<(u64, Vec<u8>)>) -> anyhow::Result<Bytes> {
    let Some(base) = entries.first().map(|e| e.0) else {
        return Ok(Bytes::new());
    };
    let records: Vec<Record> = entries
        .into_iter()
        .filter_map(|(offset, payload)| record_of(offset, base, payload))
        .collect();
    let mut out = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut out,
        records.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )?;
    Ok(out.freeze())
}
