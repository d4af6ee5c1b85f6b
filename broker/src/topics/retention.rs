//! Retention (docs/topics-and-groups.md, "Topics"): whole sealed segments are deleted when their newest message is
//! older than `retentionMs`, and the oldest while a partition holds more than `retentionBytes`; a
//! tail that outlived `retentionMs` is sealed first so that it can go; `keepUndelivered` holds
//! back whatever a dispatcher has not passed yet.
//!
//! [`plan`] decides, as a pure function of the segments, their newest timestamps and the clock;
//! [`apply`] carries it out on one topic. A clustered partition's segments are its Raft log: they
//! go through its group's purge ([`RaftRetention`], docs/cluster.md, "Retention in a cluster").

use mmmq_core::TopicConfig;

use super::Partition;
use crate::storage::{SegmentSummary, StorageError};

/// Why a retention pass failed.
#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    /// The segment log refused.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A clustered partition's group did not purge.
    #[error("{0}")]
    Cluster(String),
}

/// Deletes a clustered partition's segments through its Raft group (the cluster this broker is
/// a member of).
#[async_trait::async_trait]
pub trait RaftRetention: Send + Sync {
    /// Deletes this replica's whole segments before `before` (rounded down to a segment's start,
    /// within what it applied); answers the new first offset, `None` if nothing went.
    async fn purge_before(
        &self,
        topic: &mmmq_core::Topic,
        partition: u32,
        before: u64,
    ) -> Result<Option<u64>, String>;
}

/// What one pass does to a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Segments whose entries all lie before this offset are deleted.
    pub keep_from: u64,
    /// Seal the tail first: every entry in it is past `retentionMs`.
    pub roll_tail: bool,
}

/// Decides what retention deletes. `newest(s)` is the timestamp (ms) of segment `s`'s last entry
/// (`None` if it cannot be read: the segment is then kept); `floor` is the lowest position of a
/// dispatcher that `keepUndelivered` protects.
pub fn plan(
    segments: &[SegmentSummary],
    mut newest: impl FnMut(&SegmentSummary) -> Option<u64>,
    config: &TopicConfig,
    now_ms: u64,
    floor: Option<u64>,
) -> Plan {
    let first = segments.first().map_or(0, |s| s.start);
    let mut keep_from = first;
    let mut roll_tail = false;
    if let Some(ms) = config.retention_ms {
        let horizon = now_ms.saturating_sub(ms);
        for s in segments {
            if s.end == s.start {
                // An empty segment holds nothing to keep; an empty tail ends the walk.
                if s.sealed {
                    keep_from = s.end;
                    continue;
                }
                break;
            }
            match newest(s) {
                Some(ts) if ts < horizon => {
                    if s.sealed {
                        keep_from = s.end;
                    } else {
                        roll_tail = true;
                    }
                }
                _ => break,
            }
        }
    }
    if let Some(limit) = config.retention_bytes {
        let mut total: u64 = segments.iter().map(|s| s.bytes).sum();
        for s in segments.iter().filter(|s| s.sealed) {
            if total <= limit {
                break;
            }
            total -= s.bytes;
            keep_from = keep_from.max(s.end);
        }
    }
    if let Some(floor) = floor.filter(|_| config.keep_undelivered) {
        keep_from = keep_from.min(floor.max(first));
        let tail_end = segments.last().map_or(0, |s| s.end);
        roll_tail &= floor >= tail_end;
    }
    Plan {
        keep_from,
        roll_tail,
    }
}

/// The timestamp of a segment's last entry (blocking: one read).
fn newest_timestamp(p: &Partition, s: &SegmentSummary) -> Option<u64> {
    let payload = p.log.read(s.end.checked_sub(1)?).ok()??;
    // The broker's clock at append, for Kafka's records too (never a producer's clock).
    mmmq_core::record::payload_timestamp(&payload)
}

/// One retention pass over one partition of `topic`; returns how many segments it deleted. A
/// clustered partition's go through `raft` (none yet: the broker has not joined its cluster, and
/// nothing is deleted).
pub async fn apply(
    topic: &mmmq_core::Topic,
    t: &std::sync::Arc<Partition>,
    config: &TopicConfig,
    now_ms: u64,
    floor: Option<u64>,
    raft: Option<&dyn RaftRetention>,
) -> Result<usize, RetentionError> {
    if config.retention_ms.is_none() && config.retention_bytes.is_none() {
        return Ok(0);
    }
    let decide = |t: std::sync::Arc<Partition>, config: TopicConfig| async move {
        tokio::task::spawn_blocking(move || {
            let segments = t.log.segments();
            plan(
                &segments,
                |s| newest_timestamp(&t, s),
                &config,
                now_ms,
                floor,
            )
        })
        .await
        .expect("retention task panicked")
    };
    // A clustered partition's segments are its Raft log: deleted under the group, they would
    // break its recovery and its followers' catching up, so only its purge removes them.
    let raft = match raft {
        None if t.log.clustered() => return Ok(0),
        raft => raft.filter(|_| t.log.clustered()),
    };
    let mut p = decide(t.clone(), config.clone()).await;
    if p.roll_tail {
        t.log.roll().await?;
        p = decide(t.clone(), config.clone()).await;
    }
    if p.keep_from <= t.log.first_offset() {
        return Ok(0);
    }
    let (log, keep_from) = (t.log.clone(), p.keep_from);
    let removed = match raft {
        Some(raft) => {
            let segments = t.log.segments();
            let first = raft
                .purge_before(topic, t.number, keep_from)
                .await
                .map_err(RetentionError::Cluster)?;
            first.map_or(0, |first| {
                segments.iter().filter(|s| s.start < first).count()
            })
        }
        None => tokio::task::spawn_blocking(move || log.remove_segments_before(keep_from))
            .await
            .expect("retention task panicked")?,
    };
    if removed > 0 {
        tracing::info!(topic = %topic, partition = t.number, segments = removed, first_offset = t.log.first_offset(), "retention deleted segments");
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(start: u64, end: u64, bytes: u64, sealed: bool) -> SegmentSummary {
        SegmentSummary {
            start,
            end,
            bytes,
            sealed,
        }
    }

    fn config(ms: Option<u64>, bytes: Option<u64>, keep: bool) -> TopicConfig {
        TopicConfig {
            retention_ms: ms,
            retention_bytes: bytes,
            keep_undelivered: keep,
            ..TopicConfig::default()
        }
    }

    /// Three sealed segments whose newest entries are at 100, 200, 300 ms, and a tail at 400.
    fn log() -> (
        Vec<SegmentSummary>,
        impl FnMut(&SegmentSummary) -> Option<u64>,
    ) {
        let segments = vec![
            seg(0, 10, 1000, true),
            seg(10, 20, 1000, true),
            seg(20, 30, 1000, true),
            seg(30, 35, 500, false),
        ];
        (segments, |s: &SegmentSummary| {
            Some(100 * (s.start / 10 + 1))
        })
    }

    #[test]
    fn by_time_whole_sealed_segments_older_than_the_horizon_go() {
        let (s, newest) = log();
        let p = plan(&s, newest, &config(Some(1000), None, false), 1250, None);
        assert_eq!(
            p,
            Plan {
                keep_from: 20,
                roll_tail: false
            }
        );
    }

    #[test]
    fn a_tail_past_the_horizon_is_sealed_so_that_it_can_go() {
        let (s, newest) = log();
        let p = plan(&s, newest, &config(Some(10), None, false), 1000, None);
        assert_eq!(
            p,
            Plan {
                keep_from: 30,
                roll_tail: true
            }
        );
    }

    #[test]
    fn by_size_the_oldest_sealed_segments_go_until_the_rest_fits() {
        let (s, newest) = log();
        let p = plan(&s, newest, &config(None, Some(2000), false), 0, None);
        assert_eq!(
            p,
            Plan {
                keep_from: 20,
                roll_tail: false
            }
        );
        // The tail is never deleted for size.
        let (s, newest) = log();
        let p = plan(&s, newest, &config(None, Some(1), false), 0, None);
        assert_eq!(p.keep_from, 30);
    }

    #[test]
    fn keep_undelivered_holds_what_a_dispatcher_has_not_passed() {
        let (s, newest) = log();
        let c = config(Some(10), None, true);
        assert_eq!(plan(&s, newest, &c, 1000, Some(15)).keep_from, 15);
        let (s, newest) = log();
        let p = plan(&s, newest, &c, 1000, Some(32));
        assert_eq!(
            p,
            Plan {
                keep_from: 30,
                roll_tail: false
            }
        );
        // Without the flag, positions do not matter.
        let (s, newest) = log();
        let c = config(Some(10), None, false);
        assert_eq!(plan(&s, newest, &c, 1000, Some(15)).keep_from, 30);
    }

    #[test]
    fn an_unreadable_timestamp_keeps_the_segment_and_everything_after_it() {
        let (s, _) = log();
        let p = plan(
            &s,
            |s| (s.start != 10).then_some(1),
            &config(Some(10), None, false),
            1000,
            None,
        );
        assert_eq!(p.keep_from, 10);
    }
}
