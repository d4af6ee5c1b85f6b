//! The drain worker against a scripted target, on a real log, with Tokio's clock paused: NACK
//! retries and dead letters, the batch NACK fallback, the backoff schedule, the corrupt-entry skip
//! and the checkpoint interval, each checked exactly in milliseconds of virtual time.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use mmmq_core::{ConsumerId, StoredMessage, Topic, TopicPattern};
use parking_lot::Mutex;
use serde_json::value::RawValue;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::target::{BoxFuture, Delivery, Outcome, RunAnswer, Target, TargetError, TargetStatus};
use super::worker::{Worker, WorkerStats};
use crate::config::{DispatcherSpec, TargetSpec};
use crate::metrics::Metrics;
use crate::storage::vfs::fault::FaultyFs;
use crate::storage::{LogConfig, Vfs};
use crate::topics::{Partition, Registry};

/// What the scripted consumer answers next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Say {
    Ack,
    Nack,
    Fail,
}

/// A target that answers from a script (ACK once it runs out), records the offsets of every
/// call with its virtual time, and takes `work` of virtual time per call.
struct Scripted {
    script: Mutex<VecDeque<Say>>,
    calls: Mutex<Vec<(Duration, Vec<u64>)>>,
    /// Messages answered so far (per-message targets).
    answered: std::sync::atomic::AtomicUsize,
    per_message: bool,
    work: Duration,
    epoch: Instant,
}

impl Scripted {
    fn new(script: &[Say]) -> Arc<Self> {
        Arc::new(Self {
            script: Mutex::new(script.iter().copied().collect()),
            calls: Mutex::default(),
            answered: Default::default(),
            per_message: false,
            work: Duration::ZERO,
            epoch: Instant::now(),
        })
    }

    fn offsets(&self) -> Vec<Vec<u64>> {
        self.calls.lock().iter().map(|(_, o)| o.clone()).collect()
    }

    fn next(&self) -> Say {
        self.script.lock().pop_front().unwrap_or(Say::Ack)
    }

    fn outcome(say: Say) -> Outcome {
        match say {
            Say::Ack => Outcome::Ack,
            Say::Nack => Outcome::Nack("scripted NACK".into()),
            Say::Fail => Outcome::Failed(TargetError::Unreachable("scripted failure".into())),
        }
    }
}

impl Target for Scripted {
    fn deliver_run<'a>(
        &'a self,
        batch: &'a [Delivery],
        stop: &'a CancellationToken,
    ) -> BoxFuture<'a, RunAnswer> {
        Box::pin(async move {
            let offsets = batch.iter().map(|d| d.envelope.offset).collect();
            self.calls.lock().push((self.epoch.elapsed(), offsets));
            if !self.per_message {
                tokio::time::sleep(self.work).await;
                return match self.next() {
                    Say::Ack => RunAnswer::all(batch.len()),
                    other => RunAnswer::stopped(0, Self::outcome(other)),
                };
            }
            // Like the plugin and in-process targets: `work` per message, and a stop is
            // honoured between messages.
            for i in 0..batch.len() {
                if stop.is_cancelled() {
                    return RunAnswer::stopped(i, Outcome::Failed(TargetError::Stopping));
                }
                tokio::time::sleep(self.work).await;
                self.answered.fetch_add(1, Ordering::Relaxed);
                match self.next() {
                    Say::Ack => {}
                    other => return RunAnswer::stopped(i, Self::outcome(other)),
                }
            }
            RunAnswer::all(batch.len())
        })
    }

    fn status(&self) -> TargetStatus {
        TargetStatus::InProcess
    }

    fn answers_per_message(&self) -> bool {
        self.per_message
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    fs: FaultyFs,
    registry: Arc<Registry>,
    /// Partition 0 of topic `t`.
    topic: Arc<Partition>,
}

/// A registry on a real (fault-injectable) file system with topic `t` holding `n` messages.
async fn setup(n: u64) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let fs = FaultyFs::new();
    let vfs: Arc<dyn Vfs> = Arc::new(fs.clone());
    let registry = Registry::restore(
        dir.path().join("topics"),
        vfs,
        LogConfig::default(),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let registry = Arc::new(registry);
    let topic = registry
        .get_or_create(&Topic::new("t").unwrap())
        .await
        .unwrap()
        .first();
    for i in 0..n {
        let payload = StoredMessage {
            timestamp: 0,
            key: None,
            content: RawValue::from_string(format!(r#"{{"n":{i},"mark":"m{i}m"}}"#)).unwrap(),
            id: None,
            origin: None,
            binary: Default::default(),
        }
        .to_payload();
        topic.log.append(&payload).await.unwrap();
    }
    Setup {
        _dir: dir,
        fs,
        registry,
        topic,
    }
}

fn spec(retries: u32, batch: usize, interval_ms: u64) -> Arc<DispatcherSpec> {
    Arc::new(DispatcherSpec {
        consumer_id: ConsumerId::new("w").unwrap(),
        pattern: TopicPattern::new("t").unwrap(),
        target: TargetSpec::InProcess,
        max_nack_retries: retries,
        batch_max_messages: batch,
        max_in_flight: 1,
        checkpoint_interval: Duration::from_millis(interval_ms),
        delivery: crate::config::DeliveryMode::AtLeastOnce,
    })
}

/// A running worker: its task, counters and stop token.
struct Running {
    task: tokio::task::JoinHandle<()>,
    stats: Arc<WorkerStats>,
    cancel: CancellationToken,
}

/// Starts a worker for topic `t` of `s`.
fn spawn_worker(s: &Setup, spec: Arc<DispatcherSpec>, target: Arc<Scripted>) -> Running {
    let stats = Arc::new(WorkerStats::default());
    let cancel = CancellationToken::new();
    let worker = Worker {
        topic: Topic::new("t").unwrap(),
        partition: s.topic.clone(),
        spec,
        target,
        stats: stats.clone(),
        cancel: cancel.clone(),
        registry: s.registry.clone(),
        metrics: Arc::new(Metrics::new()),
        checkpoint_id: Some(ConsumerId::new("w").unwrap()),
        redrive: None,
        grant: None,
    };
    Running {
        task: tokio::spawn(worker.run()),
        stats,
        cancel,
    }
}

/// Runs a worker until `done` says so (checked after each step of virtual time), then stops it
/// cleanly; returns its counters.
async fn run_until(
    s: &Setup,
    spec: Arc<DispatcherSpec>,
    target: Arc<Scripted>,
    mut done: impl FnMut(&WorkerStats) -> bool,
) -> Arc<WorkerStats> {
    let Running {
        task,
        stats,
        cancel,
    } = spawn_worker(s, spec, target);
    let deadline = Instant::now() + Duration::from_secs(3600);
    while !done(&stats) {
        assert!(Instant::now() < deadline, "the worker never got there");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    cancel.cancel();
    task.await.unwrap();
    stats
}

fn dead_letters(s: &Setup) -> Vec<serde_json::Value> {
    let Some(dlq) = s.registry.get(&Topic::new("__dlq.w").unwrap()) else {
        return Vec::new();
    };
    dlq.first()
        .log
        .read_from(0, 100, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|e| {
            let m = StoredMessage::from_payload(&e.payload.unwrap()).unwrap();
            serde_json::from_str(m.content.get()).unwrap()
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_nack_is_resent_max_nack_retries_times_then_dead_lettered_and_the_next_flows() {
    let s = setup(2).await;
    let target = Scripted::new(&[Say::Nack, Say::Nack, Say::Nack]);
    let stats = run_until(&s, spec(2, 1, 50), target.clone(), |st| {
        st.next_offset.load(Ordering::Relaxed) == 2
    })
    .await;
    assert_eq!(target.offsets(), [vec![0], vec![0], vec![0], vec![1]]);
    let dlq = dead_letters(&s);
    assert_eq!(dlq.len(), 1);
    assert_eq!(dlq[0]["attempts"], 3);
    assert_eq!(dlq[0]["envelope"]["offset"], 0);
    assert_eq!(dlq[0]["reason"], "scripted NACK");
    assert_eq!(
        (
            stats.delivered.load(Ordering::Relaxed),
            stats.nacked.load(Ordering::Relaxed),
            stats.dead_lettered.load(Ordering::Relaxed),
            stats.retries.load(Ordering::Relaxed),
        ),
        (1, 3, 1, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_nacked_batch_is_delivered_again_one_message_at_a_time() {
    let s = setup(3).await;
    // The batch is NACKed; then 0 is ACKed, 1 NACKed once and ACKed, 2 ACKed.
    let target = Scripted::new(&[Say::Nack, Say::Ack, Say::Nack, Say::Ack, Say::Ack]);
    run_until(&s, spec(3, 10, 50), target.clone(), |st| {
        st.next_offset.load(Ordering::Relaxed) == 3
    })
    .await;
    assert_eq!(
        target.offsets(),
        [vec![0, 1, 2], vec![0], vec![1], vec![1], vec![2]]
    );
    assert!(dead_letters(&s).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_per_message_target_resumes_after_its_nack_without_resending_what_it_acked() {
    let s = setup(4).await;
    let target = Arc::new(Scripted {
        per_message: true,
        ..Arc::into_inner(Scripted::new(&[Say::Ack, Say::Nack])).unwrap()
    });
    run_until(&s, spec(3, 1, 50), target.clone(), |st| {
        st.next_offset.load(Ordering::Relaxed) == 4
    })
    .await;
    // One run of four: 0 ACKed, 1 NACKed; 1 alone (ACKed), then the rest as a run.
    assert_eq!(target.offsets(), [vec![0, 1, 2, 3], vec![1], vec![2, 3]]);
}

#[tokio::test(start_paused = true)]
async fn communication_failures_back_off_one_second_doubling_to_a_minute() {
    let s = setup(1).await;
    let target = Scripted::new(&[Say::Fail; 9]);
    let stats = run_until(&s, spec(3, 1, 50), target.clone(), |st| {
        st.delivered.load(Ordering::Relaxed) == 1
    })
    .await;
    let times: Vec<Duration> = target.calls.lock().iter().map(|(t, _)| *t).collect();
    let gaps: Vec<u64> = times
        .windows(2)
        .map(|w| (w[1] - w[0]).as_millis() as u64)
        .collect();
    assert_eq!(
        gaps,
        [1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000, 60000]
    );
    assert_eq!(stats.retries.load(Ordering::Relaxed), 9);
    assert_eq!(stats.nacked.load(Ordering::Relaxed), 0, "not a NACK");
    assert!(dead_letters(&s).is_empty(), "failures never dead-letter");
}

#[tokio::test(start_paused = true)]
async fn a_corrupt_entry_is_skipped_counted_and_the_next_delivered() {
    let s = setup(3).await;
    // Flip a byte inside entry 1's payload on disk: its CRC no longer matches.
    let data = s.topic.log.dir().join("0000000000000000000.mmm");
    let mut bytes = std::fs::read(&data).unwrap();
    let at = bytes.windows(4).position(|w| w == b"m1m\"").unwrap();
    bytes[at] ^= 0x20;
    std::fs::write(&data, bytes).unwrap();
    let target = Scripted::new(&[]);
    let stats = run_until(&s, spec(3, 1, 50), target.clone(), |st| {
        st.next_offset.load(Ordering::Relaxed) == 3
    })
    .await;
    assert_eq!(target.offsets(), [vec![0], vec![2]]);
    assert_eq!(stats.corrupt_skipped.load(Ordering::Relaxed), 1);
    let problem = stats.last_error.get().unwrap();
    assert!(problem.message.contains("offset 1"), "{problem:?}");
    // Offset 2 was delivered after it: the problem is over.
    assert!(problem.resolved_at.is_some(), "{problem:?}");
}

/// Checkpoint writes while a consumer takes 10 ms per message for a second: at most one per
/// interval (not one per message), and the final position on disk at the stop. (Virtual time
/// runs ahead while a write's fsync is in flight, so only the upper bound is exact.)
#[tokio::test(start_paused = true)]
async fn checkpoints_are_written_at_most_once_per_interval_and_at_the_stop() {
    for interval in [50, 0] {
        let s = setup(100).await;
        let target = Arc::new(Scripted {
            work: Duration::from_millis(10),
            ..Arc::into_inner(Scripted::new(&[])).unwrap()
        });
        run_until(&s, spec(3, 1, interval), target.clone(), |st| {
            st.next_offset.load(Ordering::Relaxed) == 100
        })
        .await;
        let elapsed = target.calls.lock().last().unwrap().0;
        assert_eq!(elapsed, Duration::from_millis(990), "virtual time");
        let writes = s.fs.syncs("w.checkpoint.tmp");
        if interval > 0 {
            let most = 1000 / interval as usize + 2;
            assert!(
                (1..=most).contains(&writes),
                "{writes} checkpoint writes for 100 messages over 1 s at {interval} ms"
            );
        }
        let stored = s
            .topic
            .checkpoints
            .read(&ConsumerId::new("w").unwrap())
            .unwrap();
        assert_eq!(stored, Some(100), "interval {interval} ms");
    }
}

/// A stop during a long run of a per-message target waits for the message in progress, not for
/// the rest of the run, and the position written is exactly what was ACKed.
#[tokio::test(start_paused = true)]
async fn a_stop_waits_for_one_message_not_a_whole_run() {
    let s = setup(60).await;
    let target = Arc::new(Scripted {
        per_message: true,
        work: Duration::from_millis(10),
        ..Arc::into_inner(Scripted::new(&[])).unwrap()
    });
    let Running {
        task,
        stats,
        cancel,
    } = spawn_worker(&s, spec(3, 1, 50), target.clone());
    while target.answered.load(Ordering::Relaxed) < 3 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let stopped_at = Instant::now();
    cancel.cancel();
    task.await.unwrap();
    assert!(
        stopped_at.elapsed() <= Duration::from_millis(10),
        "the stop took {:?}",
        stopped_at.elapsed()
    );
    let acked = stats.delivered.load(Ordering::Relaxed);
    assert!((3..=5).contains(&acked), "{acked} delivered of a run of 60");
    assert_eq!(target.offsets().len(), 1, "one run, cut short");
    assert_eq!(
        stats.retries.load(Ordering::Relaxed),
        0,
        "a stop is no failure"
    );
    let stored = s
        .topic
        .checkpoints
        .read(&ConsumerId::new("w").unwrap())
        .unwrap();
    assert_eq!(stored, Some(acked));
}

/// Retention deletes what a running worker has not delivered yet (its consumer was down): the
/// message in flight is still delivered, then the worker continues at the first offset still
/// stored, counting exactly what it skipped.
#[tokio::test(start_paused = true)]
async fn a_worker_behind_the_retention_horizon_continues_at_the_first_offset() {
    let s = setup(10).await;
    let target = Scripted::new(&[Say::Fail]);
    let Running {
        task,
        stats,
        cancel,
    } = spawn_worker(&s, spec(3, 1, 50), target.clone());
    while target.offsets().is_empty() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // The consumer is down and the worker backs off; retention takes the whole log.
    s.topic.log.roll().await.unwrap();
    let log = s.topic.log.clone();
    let removed = tokio::task::spawn_blocking(move || log.remove_segments_before(10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((removed, s.topic.log.first_offset()), (1, 10));
    for i in 10..12 {
        let payload = StoredMessage {
            timestamp: 0,
            key: None,
            content: RawValue::from_string(format!("{i}")).unwrap(),
            id: None,
            origin: None,
            binary: Default::default(),
        }
        .to_payload();
        s.topic.log.append(&payload).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(3600);
    while stats.next_offset.load(Ordering::Relaxed) != 12 {
        assert!(Instant::now() < deadline, "the worker never got there");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    cancel.cancel();
    task.await.unwrap();
    assert_eq!(target.offsets(), [vec![0], vec![0], vec![10], vec![11]]);
    assert_eq!(stats.skipped.load(Ordering::Relaxed), 9);
    assert_eq!(stats.delivered.load(Ordering::Relaxed), 3);
}

#[path = "at_most_once_tests.rs"]
mod at_most_once_tests;
