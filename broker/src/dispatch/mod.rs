//! Dispatchers: the configured consumers, each subscribed to every topic its pattern matches, with
//! one drain worker per (dispatcher, topic).
//!
//! # Layout
//! - [`target`]: the [`Target`] trait, what a delivery answers ([`RunAnswer`], [`Outcome`]) and
//!   why it may get no answer ([`TargetError`]).
//! - [`targets`]: the kinds of target (`http`, `wasm`, `in_process`) and [`Targets`], which builds
//!   them from specs.
//! - `worker`: the drain loop of one (dispatcher, topic, partition): reading, order, positions;
//!   `retries`: at-least-once sending (NACK resends, backoff, dead letters).
//! - `last_error`: a worker's last problem, when, and whether delivery has worked since.
//! - `backoff`: the 1 s → 60 s schedule of retries while a consumer or the disk is down.
//! - `checkpoint_saver`: persisting a worker's position in the background, batched; `claims`:
//!   at-most-once positions made durable before sending, and `at_most_once`: sending each
//!   message once.
//! - `lanes`: `maxInFlight` lanes over one partition.
//! - [`redrive`]: dead letters delivered again to their dispatcher; `redrive_cluster`: a
//!   cluster's redrive, run on every broker; `redrive_range`: what one redrive worker covers
//!   (below both `redrive` and `worker`).
//! - this module: [`Dispatch`], which starts and stops workers as dispatchers are configured and
//!   topics appear; `status`: what it reports of them.

mod at_most_once;
mod backoff;
mod checkpoint_saver;
mod claims;
mod lanes;
mod last_error;
mod positions;
pub mod redrive;
mod redrive_cluster;
pub use redrive_cluster::ClusterRedrive;
mod redrive_range;
mod retries;
mod status;
pub mod target;
pub mod targets;
mod topic_events;
mod worker;
#[cfg(test)]
mod worker_tests;

use std::collections::BTreeMap;
use std::sync::Arc;

use mmmq_core::{ConsumerId, Topic};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::config::DispatcherSpec;
use crate::emit::Emitter;
use crate::metrics::Metrics;
use crate::topics::{Partition, Registry, TopicLog};
pub use lanes::{LaneHash, lane_of};
pub use mmmq_core::{DispatcherStatus, ReloadReport, TargetStatus, TopicStatus};
pub use target::{BoxFuture, Delivery, Outcome, RunAnswer, Target, TargetError};
pub use targets::{Handler, InProcessTarget, TargetFactory, Targets};
pub use worker::WorkerStats;

/// Why a dispatcher could not be started.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// The broker is shutting down: nothing new starts.
    #[error("the broker is shutting down")]
    ShuttingDown,
    /// The target could not be built (an HTTP client, a plugin that does not load).
    #[error("dispatcher {consumer_id:?}: {reason}")]
    Target {
        /// The dispatcher.
        consumer_id: String,
        /// What went wrong.
        reason: String,
    },
}

struct WorkerHandle {
    join: tokio::task::JoinHandle<()>,
    stats: Arc<WorkerStats>,
    partition: Arc<Partition>,
    /// Stops this worker alone (its topic is being deleted).
    cancel: CancellationToken,
}

struct Running {
    /// Registered in-process by an embedding application: `dispatchers.json` does not own it.
    pinned: bool,
    spec: Arc<DispatcherSpec>,
    target: Arc<dyn Target>,
    cancel: CancellationToken,
    /// One worker per (topic, partition): partitions are delivered independently.
    workers: BTreeMap<(Topic, u32), WorkerHandle>,
    /// The last dead-letter redrive, running or done.
    redrive: Option<redrive::RedriveRun>,
}

/// A running dispatcher as a reload sees it before deciding what to change.
struct Snapshot {
    spec: Arc<DispatcherSpec>,
    target: Arc<dyn Target>,
    pinned: bool,
}

/// All running dispatchers.
///
/// Two locks, for two jobs. `running` (a plain mutex, never held across an `.await`) guards the
/// map of dispatchers and their workers: status, metrics and new topics take it for microseconds.
/// `reloading` (async) makes reloads, in-process registrations and shutdown take turns; it is held
/// across plugin compiles and worker stops, which take seconds, and nothing that answers a user
/// waits for it.
pub struct Dispatch {
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    factory: Arc<dyn TargetFactory>,
    /// Where plugins' emits go.
    emitter: Arc<Emitter>,
    running: Mutex<BTreeMap<ConsumerId, Running>>,
    /// The pattern of every configured dispatcher, running or not — during a reload both the
    /// old and the new ones — whose positions `keepUndelivered` protects
    /// ([`Dispatch::protected_positions`]).
    configured: Mutex<BTreeMap<ConsumerId, Vec<mmmq_core::TopicPattern>>>,
    reloading: tokio::sync::Mutex<()>,
    shutdown: CancellationToken,
    /// In a cluster, the newest redrive run followed per dispatcher: a run is never followed
    /// after a newer one (a metadata snapshot read before the newer one was applied).
    followed: Mutex<BTreeMap<ConsumerId, u64>>,
    /// Whether `configured` holds the broker's configuration: on a cluster member it is empty
    /// until the cluster's `dispatchers.json` is applied, and retention must not take it for
    /// "no dispatcher holds anything" ([`Dispatch::configuration_known`]).
    known: std::sync::atomic::AtomicBool,
}

impl Dispatch {
    /// Starts watching for new topics; no dispatchers until [`Dispatch::apply`].
    pub fn start(
        registry: Arc<Registry>,
        metrics: Arc<Metrics>,
        factory: Arc<dyn TargetFactory>,
        emitter: Arc<Emitter>,
    ) -> Arc<Self> {
        let this = Arc::new(Self {
            registry,
            metrics,
            factory,
            emitter,
            running: Mutex::new(BTreeMap::new()),
            configured: Mutex::new(BTreeMap::new()),
            reloading: tokio::sync::Mutex::new(()),
            shutdown: CancellationToken::new(),
            followed: Mutex::new(BTreeMap::new()),
            known: std::sync::atomic::AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&this);
        let mut created = this.registry.subscribe_created();
        let stop = this.shutdown.clone();
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    _ = stop.cancelled() => return,
                    e = created.recv() => e,
                };
                let Some(this) = weak.upgrade() else { return };
                match event {
                    Ok(topic) => this.attach(&[topic]),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        let all = this.registry.all();
                        this.attach(&all);
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        this
    }

    /// Whether the dispatchers whose positions `keepUndelivered` protects are known here: after
    /// the first reload on one broker (at boot); on a cluster member once the cluster's
    /// `dispatchers.json` is applied, or found to name none. Until then retention keeps every
    /// `keepUndelivered` topic whole (docs/cluster.md, "Retention in a cluster").
    pub fn configuration_known(&self) -> bool {
        self.known.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The configuration is known (see [`Dispatch::configuration_known`]).
    pub fn configuration_is_known(&self) {
        self.known.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Subscribes every dispatcher whose pattern matches to `topics` (idempotent).
    fn attach(&self, topics: &[Arc<TopicLog>]) {
        let mut running = self.running.lock();
        for r in running.values_mut() {
            for t in topics {
                self.start_worker(r, t);
            }
        }
    }

    /// A worker of dispatcher `r` over one partition: its position saved under `checkpoint_id`
    /// (`None`: kept in memory only), over all of the partition or a redrive's `range`.
    fn worker(
        &self,
        r: &Running,
        (topic, partition): (&Topic, &Arc<Partition>),
        cancel: &CancellationToken,
        checkpoint_id: Option<ConsumerId>,
        range: Option<redrive_range::Range>,
    ) -> worker::Worker {
        worker::Worker {
            topic: topic.clone(),
            partition: partition.clone(),
            spec: r.spec.clone(),
            target: r.target.clone(),
            stats: Arc::new(WorkerStats::default()),
            cancel: cancel.clone(),
            registry: self.registry.clone(),
            metrics: self.metrics.clone(),
            checkpoint_id,
            redrive: range,
            grant: None,
        }
    }

    /// Starts a worker for each partition of `topic` that has none (a new topic, or one that
    /// grew), if the dispatcher's pattern matches.
    fn start_worker(&self, r: &mut Running, topic: &Arc<TopicLog>) {
        if !r.spec.pattern.matches(&topic.topic) {
            return;
        }
        for partition in topic.partitions() {
            let key = (topic.topic.clone(), partition.number);
            if r.workers.contains_key(&key) {
                continue;
            }
            let cancel = r.cancel.child_token();
            let checkpoint_id = Some(r.spec.consumer_id.clone());
            let worker = self.worker(r, (&topic.topic, &partition), &cancel, checkpoint_id, None);
            let stats = worker.stats.clone();
            tracing::info!(consumer_id = %r.spec.consumer_id, topic = %topic.topic, partition = partition.number, "dispatcher subscribed");
            r.workers.insert(
                key,
                WorkerHandle {
                    join: tokio::spawn(worker.run()),
                    stats,
                    partition,
                    cancel,
                },
            );
        }
    }

    /// Makes the running set equal `specs`: starts added dispatchers, stops removed ones (their
    /// checkpoints stay), restarts changed ones from their checkpoints. All targets are built
    /// before anything changes, so a target that cannot be built leaves everything as it was.
    ///
    /// The work runs in a task of its own and always to its end, even when the caller stops
    /// waiting (a request deadline, a client that hangs up): a reload dropped between stopping the
    /// old workers and starting the new ones would leave a dispatcher stopped, and the next reload
    /// would start it while the old workers might still run. Old workers are always joined before
    /// their replacements start, so a (dispatcher, topic) never has two.
    pub async fn apply(
        self: &Arc<Self>,
        specs: Vec<DispatcherSpec>,
    ) -> Result<ReloadReport, DispatchError> {
        let this = self.clone();
        tokio::spawn(async move { this.apply_to_the_end(specs).await })
            .await
            .expect("the reload task panicked")
    }

    async fn apply_to_the_end(
        &self,
        specs: Vec<DispatcherSpec>,
    ) -> Result<ReloadReport, DispatchError> {
        let _one_at_a_time = self.reloading.lock().await;
        if self.shutdown.is_cancelled() {
            return Err(DispatchError::ShuttingDown);
        }
        // What runs now, seen without holding the map while targets compile or reload.
        let current: BTreeMap<ConsumerId, Snapshot> = self
            .running
            .lock()
            .iter()
            .map(|(id, r)| {
                let snapshot = Snapshot {
                    spec: r.spec.clone(),
                    target: r.target.clone(),
                    pinned: r.pinned,
                };
                (id.clone(), snapshot)
            })
            .collect();
        let mut report = ReloadReport::default();
        let mut to_start = Vec::new();
        for spec in specs {
            match current.get(&spec.consumer_id) {
                Some(Snapshot { pinned: true, .. }) => {
                    return Err(DispatchError::Target {
                        consumer_id: spec.consumer_id.to_string(),
                        reason: "this consumerId belongs to an in-process handler".into(),
                    });
                }
                Some(Snapshot {
                    spec: running,
                    target,
                    ..
                }) if **running == spec => {
                    let id = spec.consumer_id.to_string();
                    match target.reload().await {
                        Ok(true) => report.reloaded.push(id.clone()),
                        Ok(false) => {}
                        Err(e) => report.reload_errors.push(format!("{id}: {e}")),
                    }
                    if awaits_deploy(target.as_ref()) {
                        report.awaiting_deploy.push(id.clone());
                    }
                    report.unchanged.push(id);
                    continue;
                }
                Some(_) => report.changed.push(spec.consumer_id.to_string()),
                None => report.added.push(spec.consumer_id.to_string()),
            }
            let target = self
                .factory
                .build(&spec, &self.emitter)
                .await
                .map_err(|reason| DispatchError::Target {
                    consumer_id: spec.consumer_id.to_string(),
                    reason,
                })?;
            if awaits_deploy(target.as_ref()) {
                report.awaiting_deploy.push(spec.consumer_id.to_string());
            }
            to_start.push((spec, target));
        }
        let keep: std::collections::HashSet<&str> = report
            .unchanged
            .iter()
            .chain(&report.changed)
            .map(String::as_str)
            .collect();
        report.removed = current
            .iter()
            .filter(|(id, r)| !r.pinned && !keep.contains(id.as_str()))
            .map(|(id, _)| id.to_string())
            .collect();
        // While dispatchers are replaced, both the old and the new ones' positions hold
        // `keepUndelivered` topics.
        {
            let mut configured = self.configured.lock();
            for (spec, _) in &to_start {
                let patterns = configured.entry(spec.consumer_id.clone()).or_default();
                if !patterns.contains(&spec.pattern) {
                    patterns.push(spec.pattern.clone());
                }
            }
        }
        self.configuration_is_known();
        let stopping: Vec<Running> = {
            let mut running = self.running.lock();
            let leaving = report.removed.iter().chain(&report.changed);
            leaving
                .filter_map(|id| running.remove(id.as_str()))
                .collect()
        };
        for r in stopping {
            stop(r).await;
        }
        let topics = self.registry.all();
        let mut running = self.running.lock();
        for (spec, target) in to_start {
            let mut r = Running {
                pinned: false,
                spec: Arc::new(spec),
                target,
                cancel: self.shutdown.child_token(),
                workers: BTreeMap::new(),
                redrive: None,
            };
            for t in &topics {
                self.start_worker(&mut r, t);
            }
            running.insert(r.spec.consumer_id.clone(), r);
        }
        *self.configured.lock() = running
            .iter()
            .map(|(id, r)| (id.clone(), vec![r.spec.pattern.clone()]))
            .collect();
        Ok(report)
    }

    /// Starts a dispatcher whose target the caller built (an in-process handler). It is not
    /// touched by reloads of `dispatchers.json`; its id must not be in use.
    pub async fn add_pinned(
        &self,
        spec: DispatcherSpec,
        target: Arc<dyn Target>,
    ) -> Result<(), DispatchError> {
        let _one_at_a_time = self.reloading.lock().await;
        let mut running = self.running.lock();
        if running.contains_key(&spec.consumer_id) {
            return Err(DispatchError::Target {
                consumer_id: spec.consumer_id.to_string(),
                reason: "a dispatcher with this consumerId is already running".into(),
            });
        }
        let mut r = Running {
            pinned: true,
            spec: Arc::new(spec),
            target,
            cancel: self.shutdown.child_token(),
            workers: BTreeMap::new(),
            redrive: None,
        };
        for t in &self.registry.all() {
            self.start_worker(&mut r, t);
        }
        self.configured
            .lock()
            .insert(r.spec.consumer_id.clone(), vec![r.spec.pattern.clone()]);
        running.insert(r.spec.consumer_id.clone(), r);
        Ok(())
    }

    /// The consumerIds of the dispatchers whose plugin is the deployed plugin `name`.
    pub fn users_of_plugin(&self, name: &str) -> Vec<String> {
        self.running
            .lock()
            .values()
            .filter(|r| plugin_name(&r.spec) == Some(name))
            .map(|r| r.spec.consumer_id.to_string())
            .collect()
    }

    /// Reloads the dispatchers whose plugin is the deployed plugin `name` (its current version
    /// changed): they switch before this returns. Each also notices by its file watch.
    pub async fn reload_plugin(&self, name: &str) {
        let targets: Vec<(String, Arc<dyn Target>)> = self
            .running
            .lock()
            .values()
            .filter(|r| plugin_name(&r.spec) == Some(name))
            .map(|r| (r.spec.consumer_id.to_string(), r.target.clone()))
            .collect();
        for (consumer_id, target) in targets {
            if let Err(e) = target.reload().await {
                tracing::warn!(consumer_id, plugin = name, error = %e, "the new version did not load; the old one keeps serving");
            }
        }
    }

    /// Stops every worker: waits cut short, deliveries in flight finished (each bounded by its
    /// target's timeout), checkpoints written. A reload in progress finishes first; one that
    /// starts later is refused.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        let _no_reload = self.reloading.lock().await;
        let all: Vec<Running> = std::mem::take(&mut *self.running.lock())
            .into_values()
            .collect();
        for r in all {
            stop(r).await;
        }
    }
}

async fn stop(r: Running) {
    tracing::info!(consumer_id = %r.spec.consumer_id, workers = r.workers.len(), "stopping dispatcher");
    r.cancel.cancel();
    r.target.stopping();
    for (_, w) in r.workers {
        let _ = w.join.await;
    }
    if let Some(run) = r.redrive {
        run.stop().await;
    }
    // What the target still stores in the background (a plugin's emits) ends before a new
    // target of this dispatcher can start.
    r.target.closed().await;
    tracing::info!(consumer_id = %r.spec.consumer_id, "dispatcher stopped");
}

fn plugin_name(spec: &DispatcherSpec) -> Option<&str> {
    match &spec.target {
        crate::config::TargetSpec::Plugin(p) => p.name.as_deref(),
        _ => None,
    }
}

/// Whether `target` is a named plugin that was never deployed (a reload reports it as waiting,
/// not as an error).
fn awaits_deploy(target: &dyn Target) -> bool {
    matches!(
        target.status(),
        TargetStatus::Plugin {
            awaiting_deploy: true,
            ..
        }
    )
}
