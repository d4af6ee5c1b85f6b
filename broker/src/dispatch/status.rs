//! What [`Dispatch`] reports of its dispatchers (`GET /admin/status`, the CLI, the dashboard):
//! per (topic, partition) counters and lag, summed per dispatcher, with the last error (see
//! `last_error`) and where the next redrive starts.

use std::sync::atomic::Ordering;

use mmmq_core::{ConsumerId, RedriveNext, Topic};

use super::{Dispatch, DispatcherStatus, TopicStatus, last_error, redrive};
use crate::metrics::DispatchLabel;

impl Dispatch {
    /// Status of every dispatcher; also refreshes the lag gauges. Without `redriveNext` (a file
    /// read per dead-letter partition: [`Dispatch::status_with_redrive_next`]), so that a metrics
    /// scrape reads nothing from disk.
    pub async fn status(&self) -> Vec<DispatcherStatus> {
        let running = self.running.lock();
        running
            .values()
            .map(|r| {
                let mut errors = Vec::new();
                let topics: Vec<TopicStatus> = r
                    .workers
                    .iter()
                    .map(|((topic, partition), w)| {
                        let last_error = w.stats.last_error.get();
                        errors.extend(last_error.clone());
                        let (last_error, last_error_at, last_error_resolved_at) =
                            last_error::fields(last_error);
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
                            last_error,
                            last_error_at,
                            last_error_resolved_at,
                            delivered_by: w
                                .partition
                                .delivery
                                .current()
                                .and_then(|c| c.delivered_by()),
                        }
                    })
                    .collect();
                let (last_error, last_error_at, last_error_resolved_at) =
                    last_error::fields(last_error::pick(errors));
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
                    last_error,
                    last_error_at,
                    last_error_resolved_at,
                    topics,
                    redrive: r.redrive.as_ref().map(redrive::RedriveRun::status),
                    redrive_next: Vec::new(),
                }
            })
            .collect()
    }
}

impl Dispatch {
    /// [`Dispatch::status`] with where the next redrive of each dispatcher starts
    /// (`redriveNext`, `GET /mmmq/dispatchers`).
    pub async fn status_with_redrive_next(&self) -> Vec<DispatcherStatus> {
        let mut all = self.status().await;
        let dead_letters: Vec<_> = all
            .iter()
            .map(|d| {
                ConsumerId::new(&d.consumer_id)
                    .ok()
                    .and_then(|id| self.registry.get(&Topic::dead_letter(&id)))
                    .map(|t| t.partitions())
                    .unwrap_or_default()
            })
            .collect();
        let starts = tokio::task::spawn_blocking(move || {
            dead_letters
                .into_iter()
                .map(|partitions| {
                    let starts = redrive::starts(&partitions, None)?;
                    Ok(partitions
                        .iter()
                        .zip(starts)
                        .map(|(p, next)| RedriveNext {
                            partition: p.number,
                            next,
                        })
                        .collect())
                })
                .collect::<Vec<Result<Vec<_>, crate::storage::StorageError>>>()
        })
        .await
        .expect("checkpoint read panicked");
        for (d, next) in all.iter_mut().zip(starts) {
            match next {
                Ok(next) => d.redrive_next = next,
                // Status still answers; what it cannot say is left out.
                Err(e) => {
                    tracing::warn!(consumer_id = %d.consumer_id, error = %e, "cannot read where the next redrive starts")
                }
            }
        }
        all
    }
}
