//! What [`Dispatch`] reports of its dispatchers (`GET /admin/status`, the CLI, the dashboard):
//! per (topic, partition) counters and lag, summed per dispatcher, with the most recent error.

use std::sync::atomic::Ordering;

use super::{Dispatch, DispatcherStatus, TopicStatus, redrive};
use crate::metrics::DispatchLabel;

impl Dispatch {
    /// Status of every dispatcher; also refreshes the lag gauges.
    pub async fn status(&self) -> Vec<DispatcherStatus> {
        let running = self.running.lock();
        running
            .values()
            .map(|r| {
                // The dispatcher's last error is its most recent over all topics.
                let mut latest: Option<(u64, String)> = None;
                let topics: Vec<TopicStatus> = r
                    .workers
                    .iter()
                    .map(|((topic, partition), w)| {
                        let last_error = w.stats.last_error.lock().clone();
                        if let Some((at, e)) = &last_error
                            && latest.as_ref().is_none_or(|(l, _)| at >= l)
                        {
                            latest = Some((*at, e.clone()));
                        }
                        let next = w.stats.next_offset.load(Ordering::Relaxed);
                        let lag = w.partition.log.next_offset().saturating_sub(next);
                        self.metrics
                            .lag
                            .get_or_create(&DispatchLabel {
                                consumer: r.spec.consumer_id.to_string(),
                                topic: topic.to_string(),
                                partition: *partition,
                            })
                            .set(lag as i64);
                        TopicStatus {
                            topic: topic.to_string(),
                            partition: *partition,
                            next_offset: next,
                            lag,
                            delivered: w.stats.delivered.load(Ordering::Relaxed),
                            nacked: w.stats.nacked.load(Ordering::Relaxed),
                            dead_lettered: w.stats.dead_lettered.load(Ordering::Relaxed),
                            corrupt_skipped: w.stats.corrupt_skipped.load(Ordering::Relaxed),
                            skipped: w.stats.skipped.load(Ordering::Relaxed),
                            retries: w.stats.retries.load(Ordering::Relaxed),
                            dropped: w.stats.dropped.load(Ordering::Relaxed),
                            last_error: last_error.map(|(_, e)| e),
                        }
                    })
                    .collect();
                DispatcherStatus {
                    consumer_id: r.spec.consumer_id.to_string(),
                    pattern: r.spec.pattern.to_string(),
                    target: r.target.status(),
                    max_nack_retries: r.spec.max_nack_retries,
                    batch_max_messages: r.spec.batch_max_messages,
                    max_in_flight: r.spec.max_in_flight,
                    checkpoint_interval_ms: r.spec.checkpoint_interval.as_millis() as u64,
                    delivery: r.spec.delivery.as_str().to_owned(),
                    delivered: topics.iter().map(|t| t.delivered).sum(),
                    nacked: topics.iter().map(|t| t.nacked).sum(),
                    dead_lettered: topics.iter().map(|t| t.dead_lettered).sum(),
                    dropped: topics.iter().map(|t| t.dropped).sum(),
                    lag: topics.iter().map(|t| t.lag).sum(),
                    last_error: latest.map(|(_, e)| e),
                    topics,
                    redrive: r.redrive.as_ref().map(redrive::RedriveRun::status),
                }
            })
            .collect()
    }
}
