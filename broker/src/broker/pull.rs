//! Pulling (docs/http-api.md, "HTTP API": `GET /mmmq/topics/{topic}/messages`): a page of one partition
//! from an offset, long-polling when there is nothing yet, and going on from `firstOffset` when
//! retention deletes what it was reading.

use std::time::Duration;

use mmmq_core::{PullPage, StoredMessage, Topic};
use tokio_util::sync::CancellationToken;

use super::{Broker, BrokerError, MAX_PULL_BYTES, MAX_PULL_MESSAGES, MAX_PULL_WAIT};

impl Broker {
    /// Up to `max` (1–1000) messages of `partition` of `topic` from offset `from` (clamped to
    /// the first stored), at most [`MAX_PULL_BYTES`] of payload; when there is nothing at `from`
    /// yet, waits up to `wait` (at most [`MAX_PULL_WAIT`]) for it, or until `stop` is cancelled.
    pub async fn pull(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
        wait: Duration,
        stop: &CancellationToken,
    ) -> Result<PullPage, BrokerError> {
        let topic = Topic::new(topic).map_err(|e| BrokerError::InvalidName(e.to_string()))?;
        let t = self
            .registry
            .get(&topic)
            .ok_or_else(|| BrokerError::UnknownTopic(topic.to_string()))?;
        let p = t
            .partition(partition)
            .ok_or_else(|| crate::topics::NoSuchPartition {
                topic: topic.to_string(),
                partition,
                count: t.partition_count(),
            })?;
        let max = max.clamp(1, MAX_PULL_MESSAGES);
        let wait = wait.min(MAX_PULL_WAIT);
        let from = from.max(p.log.first_offset());
        if from >= p.log.next_offset() && !wait.is_zero() {
            tokio::select! {
                _ = p.log.wait_for(from) => {}
                _ = tokio::time::sleep(wait) => {}
                _ = stop.cancelled() => {}
            }
        }
        let mut from = from;
        let entries = loop {
            let log = p.log.clone();
            let read =
                tokio::task::spawn_blocking(move || log.read_from(from, max, MAX_PULL_BYTES))
                    .await
                    .expect("read task panicked");
            match read {
                Ok(entries) => break entries,
                // Retention deleted what was being read: answer from the first offset still
                // stored, as for a `from` below it (docs/topics-and-groups.md, "Retention").
                Err(_) if p.log.first_offset() > from => from = p.log.first_offset(),
                Err(e) => return Err(BrokerError::Read(e)),
            }
        };
        let next = entries.last().map_or(from, |e| e.offset + 1);
        let mut messages = Vec::with_capacity(entries.len());
        for e in entries {
            // A corrupt entry is left out; the gap in offsets shows it.
            let Ok(bytes) = e.payload else { continue };
            if let Ok(msg) = StoredMessage::from_payload(&bytes) {
                messages.push(msg.into_envelope(topic.clone(), p.topic_id, partition, e.offset));
            }
        }
        Ok(PullPage { messages, next })
    }
}
