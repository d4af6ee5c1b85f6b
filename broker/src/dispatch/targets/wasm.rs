//! The plugin target: delivers each message to a WebAssembly component (run by
//! [`crate::plugin::runtime`]), and swaps in a new version of the component when its file changes.
//!
//! Hot reload: a debounced watcher on the file's directory (`watch`) and
//! `POST /mmmq/admin/reload` both lead to [`PluginTarget::reload`]. The new file is compiled on a
//! blocking thread, off the delivery path; if it compiles and implements the world it becomes
//! current and the next message goes to it, while a message already in a call finishes on the old
//! version. If it does not, the old version keeps serving and the error shows in the status.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use lru::LruCache;
use parking_lot::Mutex;
use tokio_util::sync::{CancellationToken, DropGuard};

use mmmq_core::{ConsumerId, Topic};

use crate::config::PluginSpec;
use crate::dispatch::redrive::REDRIVE_CHECKPOINT;
use crate::dispatch::target::{
    BoxFuture, Delivery, Outcome, RUN_TIME_BUDGET, RunAnswer, Target, TargetError, TargetStatus,
};
use crate::emit::{ConsumerEmits, Outputs};
use crate::handled::Handlers;
use crate::plugin::kept::keep_loaded;
use crate::plugin::runtime::{
    Call, Compiled, Instance, Limits, PluginEngine, PluginError, Verdict, version_of,
};
use crate::plugin::{Grants, GuestLog, LogSink};
use crate::storage::OsFs;

struct Shared {
    engine: Arc<PluginEngine>,
    spec: PluginSpec,
    consumer_id: String,
    log: GuestLog,
    /// Where `ack`ed calls' emits are appended, exactly once.
    emits: ConsumerEmits,
    /// `plugin.config` and `plugin.allowedHosts`.
    grants: Grants,
    /// Which version handled which offsets, for `mmmq plugin replay` (none for an embedded
    /// target without topics).
    handled: Option<Handlers>,
    /// `plugin.shadow`: a kept version run after the current one, its verdicts compared.
    shadow: Option<super::shadow::Shadow>,
    current: ArcSwapOption<Compiled>,
    load_error: Mutex<Option<String>>,
    /// A named plugin with no deployed version yet (no `current.wasm`): its messages wait, and
    /// status and reload say so instead of reporting a missing file.
    awaiting_deploy: AtomicBool,
    /// Each lane's instance between calls. One instance per (dispatcher, topic, partition, lane),
    /// so state a plugin keeps between calls (a per-key window) sees every message of its lane,
    /// in order (a key's messages are all in one partition, and in one lane of it).
    /// Least recently used out past [`MAX_IDLE_INSTANCES`].
    idle: Mutex<LruCache<PartitionKey, Instance>>,
    reloading: tokio::sync::Mutex<()>,
}

/// Most instances a plugin dispatcher keeps between calls. A dispatcher over more topics than
/// this forgets the least recently used topic's instance (and the state it kept) and makes a new
/// one when that topic's next message comes: memory stays bounded by this many times
/// `maxMemoryBytes`, however many topics match.
pub const MAX_IDLE_INSTANCES: usize = 64;

const IDLE_CAPACITY: NonZeroUsize = NonZeroUsize::new(MAX_IDLE_INSTANCES).unwrap();

/// A topic, one of its partitions, and a lane of it.
type PartitionKey = (Topic, u32, u32);

/// A dispatcher target that runs a component.
pub struct PluginTarget {
    shared: Arc<Shared>,
    /// Ends the file watch when the target goes.
    _watch: Option<DropGuard>,
}

enum CallResult {
    Answered(Instance, Verdict),
    Stopped(Instance),
    /// The run's time was up: the rest of it is handed back untried.
    Yielded(Instance),
    Faulted(PluginError),
    NoInstance(PluginError),
    /// The record of which version handles the run could not be written: nothing was called.
    Unrecorded(String),
}

/// What a run's calls gave: the emits of those ACKed, in order, and how the run ended.
struct RunCalls {
    outputs: Vec<Outputs>,
    result: CallResult,
}

impl PluginTarget {
    /// Loads the component (a failure is recorded, not fatal: the dispatcher waits for a good
    /// file) and starts watching its file.
    pub async fn start(
        engine: Arc<PluginEngine>,
        spec: PluginSpec,
        consumer_id: &str,
        log_sink: Option<LogSink>,
        emits: ConsumerEmits,
        handled: Option<Handlers>,
    ) -> Self {
        let shadow = match spec.shadow.clone() {
            Some(shadow) => {
                let (engine, id, config) =
                    (engine.clone(), consumer_id.to_owned(), spec.config.clone());
                Some(
                    tokio::task::spawn_blocking(move || {
                        super::shadow::Shadow::load(&engine, &shadow, &id, config)
                    })
                    .await
                    .expect("shadow compile task panicked"),
                )
            }
            None => None,
        };
        let shared = Arc::new(Shared {
            shadow,
            handled,
            engine,
            log: GuestLog::new(consumer_id, log_sink),
            emits,
            grants: Grants {
                config: spec.config.clone(),
                allowed_hosts: spec.allowed_hosts.clone(),
            },
            consumer_id: consumer_id.to_owned(),
            spec,
            current: ArcSwapOption::empty(),
            load_error: Mutex::new(None),
            awaiting_deploy: AtomicBool::new(false),
            idle: Mutex::new(LruCache::new(IDLE_CAPACITY)),
            reloading: tokio::sync::Mutex::new(()),
        });
        let _ = shared.reload().await;
        let weak: Weak<Shared> = Arc::downgrade(&shared);
        let watch = super::watch::watch_file(
            shared.spec.path.clone(),
            shared.consumer_id.clone(),
            move || {
                let shared = weak.upgrade()?;
                Some(Box::pin(async move {
                    let _ = shared.reload().await;
                }) as BoxFuture<'static, ()>)
            },
        );
        Self {
            shared,
            _watch: watch,
        }
    }
}

/// What a reload found at the plugin's path.
enum Read {
    /// The version already serving.
    Same,
    /// A new version, compiled.
    New(Arc<Compiled>),
    /// No file yet for a named plugin that was never deployed.
    AwaitingDeploy,
}

impl Shared {
    /// Keeps `instance` for its topic's next message, unless a newer version serves by now.
    fn keep_idle(&self, topic: PartitionKey, instance: Instance) {
        if self
            .current
            .load()
            .as_ref()
            .is_some_and(|c| c.version == instance.version)
        {
            self.idle.lock().put(topic, instance);
        }
    }

    /// Reads and, if it changed, compiles the file. `Ok(true)` when a new version now serves.
    ///
    /// A `plugin.path` dispatcher first keeps the new version where `mmmq plugin replay` finds it
    /// once the file has changed again (docs/plugins.md, "Replay"), durably: a version it cannot keep does
    /// not serve (as a version whose handling cannot be recorded handles nothing).
    async fn reload(self: &Arc<Self>) -> Result<bool, String> {
        let _one_at_a_time = self.reloading.lock().await;
        let path = self.spec.path.clone();
        let engine = self.engine.clone();
        let serving = self.current.load().as_ref().map(|c| c.version.clone());
        let named = self.spec.name.is_some();
        let keep_in = match (&self.handled, named) {
            (Some(handled), false) => handled.loaded_dir(),
            _ => None,
        };
        let consumer_id = self.consumer_id.clone();
        let result = tokio::task::spawn_blocking(move || {
            let bytes = match std::fs::read(&path) {
                Ok(bytes) => bytes,
                // A named plugin's `current.wasm` appears with its first deploy (docs/plugins.md,
                // "Deploying plugins by API"); until then there is nothing wrong to report.
                Err(e)
                    if e.kind() == std::io::ErrorKind::NotFound && named && serving.is_none() =>
                {
                    return Ok(Read::AwaitingDeploy);
                }
                Err(e) => {
                    return Err(PluginError::Read {
                        path: path.display().to_string(),
                        reason: e.to_string(),
                    }
                    .to_string());
                }
            };
            if serving.as_deref() == Some(&*version_of(&bytes)) {
                return Ok(Read::Same);
            }
            let compiled = engine.compile(&bytes).map_err(|e| e.to_string())?;
            if let Some(dir) = keep_in {
                keep_loaded(&OsFs, &dir, &consumer_id, &bytes, compiled.world).map_err(|e| {
                    format!(
                        "cannot keep version {} for replay in {}: {e}",
                        compiled.version,
                        dir.display()
                    )
                })?;
            }
            Ok(Read::New(compiled))
        })
        .await
        .expect("plugin compile task panicked");
        match result {
            Ok(Read::AwaitingDeploy) => {
                if !self.awaiting_deploy.swap(true, Ordering::Relaxed) {
                    tracing::info!(consumer_id = %self.consumer_id, plugin = self.spec.name.as_deref(), "no version of the plugin is deployed yet; its messages wait for the first deploy");
                }
                *self.load_error.lock() = None;
                Ok(false)
            }
            Ok(Read::Same) => {
                *self.load_error.lock() = None;
                Ok(false)
            }
            Ok(Read::New(compiled)) => {
                tracing::info!(consumer_id = %self.consumer_id, version = %compiled.version, bytes = compiled.size, "plugin version loaded");
                self.current.store(Some(compiled));
                *self.load_error.lock() = None;
                self.awaiting_deploy.store(false, Ordering::Relaxed);
                self.idle.lock().clear();
                Ok(true)
            }
            Err(e) => {
                match self.current.load().as_ref() {
                    Some(c) => {
                        tracing::error!(consumer_id = %self.consumer_id, error = %crate::plugin::escape_controls(&e.to_string()), serving = %c.version, "plugin reload failed; the old version keeps serving")
                    }
                    None => {
                        tracing::error!(consumer_id = %self.consumer_id, error = %crate::plugin::escape_controls(&e.to_string()), "plugin cannot be loaded; its messages wait until the file is fixed")
                    }
                }
                *self.load_error.lock() = Some(e.clone());
                Err(e)
            }
        }
    }

    /// The calls of one run, on a blocking thread: `handle` for each message in order, stopping
    /// at the first that is not ACKed or when the run's time is up.
    #[allow(clippy::too_many_arguments)]
    fn calls(
        &self,
        compiled: &Compiled,
        idle: Option<Instance>,
        messages: &[Call],
        lane: &PartitionKey,
        redrive: bool,
        limits: Limits,
        stop: CancellationToken,
    ) -> RunCalls {
        let mut outputs = Vec::with_capacity(messages.len());
        // Recorded before the version handles a message the record does not give it yet; a
        // redrive's runs are not recorded (their offsets are the main position's past).
        if let Some(handled) = &self.handled
            && !redrive
            && let Err(e) = handled.note(
                &lane.0,
                lane.1,
                lane.2,
                messages[0].offset,
                &compiled.version,
            )
        {
            return RunCalls {
                outputs,
                result: CallResult::Unrecorded(e.to_string()),
            };
        }
        let mut instance = match idle {
            Some(i) => i,
            None => match Instance::new(&self.engine, compiled, limits, &self.log, &self.grants) {
                Ok(i) => i,
                Err(e) => {
                    return RunCalls {
                        outputs,
                        result: CallResult::NoInstance(e),
                    };
                }
            },
        };
        let started = std::time::Instant::now();
        let result = 'run: {
            for m in messages {
                // A stop waits for the call in progress, not for the rest of the run.
                if stop.is_cancelled() {
                    break 'run CallResult::Stopped(instance);
                }
                if !outputs.is_empty() && started.elapsed() >= RUN_TIME_BUDGET {
                    break 'run CallResult::Yielded(instance);
                }
                let answer = instance.handle(m);
                if let Some(shadow) = &self.shadow {
                    shadow.compare(&self.engine, lane.clone(), m, &answer, limits);
                }
                match answer {
                    Ok(Verdict::Ack) => outputs.push((m.offset, instance.take_emits())),
                    Ok(verdict) => break 'run CallResult::Answered(instance, verdict),
                    Err(e) => break 'run CallResult::Faulted(e),
                }
            }
            CallResult::Answered(instance, Verdict::Ack)
        };
        RunCalls { outputs, result }
    }

    /// Calls `handle` for each message in order on one blocking thread, stopping at the first that
    /// is not ACKed: how many were, and the outcome of the next.
    async fn call_run(self: &Arc<Self>, batch: &[Delivery], stop: CancellationToken) -> RunAnswer {
        let Some(compiled) = self.current.load_full() else {
            let why = match (self.load_error.lock().clone(), &self.spec.name) {
                (Some(e), _) => e,
                (None, Some(name)) if self.awaiting_deploy.load(Ordering::Relaxed) => format!(
                    "plugin `{name}` has no deployed version yet (mmmq plugin deploy --name {name})"
                ),
                (None, _) => "no file loaded yet".into(),
            };
            return RunAnswer::stopped(0, Outcome::Failed(TargetError::NotLoaded(why)));
        };
        let messages: Vec<Call> = batch
            .iter()
            .map(|d| Call {
                topic: d.envelope.topic.to_string(),
                partition: d.envelope.partition,
                offset: d.envelope.offset,
                timestamp: d.envelope.timestamp,
                key: d.envelope.key.clone(),
                id: d.envelope.id.clone(),
                attempt: d.attempt,
                content: d.envelope.content.get().to_owned(),
            })
            .collect();
        let topic = (
            batch[0].envelope.topic.clone(),
            batch[0].envelope.partition,
            batch[0].lane,
        );
        let idle = self
            .idle
            .lock()
            .pop(&topic)
            .filter(|i| i.version == compiled.version);
        let limits = Limits {
            max_memory_bytes: self.spec.max_memory_bytes,
            timeout: self.spec.timeout,
            max_message_bytes: self.emits.max_message_bytes(),
        };
        let this = self.clone();
        let lane = topic.clone();
        let redrive = batch[0].history.is_some();
        let RunCalls { outputs, result } = tokio::task::spawn_blocking(move || {
            this.calls(&compiled, idle, &messages, &lane, redrive, limits, stop)
        })
        .await
        .expect("plugin call task panicked");
        let acked = outputs.len();
        // The ACKed calls' emits are stored behind the calls, and the checkpoint waits for them
        // (`Target::settled`).
        let stored = match &batch[0].dead_letter {
            None => {
                let position = self.emits.consumer_id().clone();
                self.emits
                    .submit(&topic.0, topic.1, &position, outputs)
                    .await
            }
            // A redrive's emits come from the dead letters, guarded by the redrive's position:
            // its re-run after a crash finds them, and its checkpoint waits for them.
            Some(at) => {
                let outputs = outputs
                    .into_iter()
                    .zip(batch)
                    .map(|((offset, emits), d)| {
                        (d.dead_letter.as_ref().map_or(offset, |a| a.offset), emits)
                    })
                    .collect();
                let position = ConsumerId::new(REDRIVE_CHECKPOINT).expect("a valid name");
                self.emits
                    .submit(&at.topic, at.partition, &position, outputs)
                    .await
            }
        };
        if let Err(e) = stored {
            // The source topic is gone, or the dispatcher is stopping and the disk refused; the
            // run is tried again from its first message (after the restart), on a fresh instance
            // (this one is dropped with `result`).
            return RunAnswer::stopped(0, Outcome::Failed(TargetError::Storage(e.to_string())));
        }
        let outcome = match result {
            CallResult::Answered(instance, ack) => {
                self.keep_idle(topic, instance);
                match ack {
                    Verdict::Ack => None,
                    Verdict::Nack => Some(Outcome::Nack("plugin answered nack".into())),
                    Verdict::RetryAfter(ms) => {
                        Some(Outcome::RetryAfter(Duration::from_millis(u64::from(ms))))
                    }
                    Verdict::DeadLetter(reason) => Some(Outcome::DeadLetter(reason)),
                }
            }
            CallResult::Unrecorded(e) => Some(Outcome::Failed(TargetError::Storage(format!(
                "cannot record which plugin version handles the message: {e}"
            )))),
            CallResult::Yielded(instance) => {
                self.keep_idle(topic, instance);
                None
            }
            CallResult::Stopped(instance) => {
                self.keep_idle(topic, instance);
                Some(Outcome::Failed(TargetError::Stopping))
            }
            CallResult::Faulted(e) => {
                let env = &batch[acked].envelope;
                tracing::warn!(consumer_id = %self.consumer_id, offset = env.offset, topic = %env.topic, error = %crate::plugin::escape_controls(&e.to_string()), "plugin call failed; counted as NACK");
                Some(Outcome::Nack(format!("plugin {e}")))
            }
            // A fault of the plugin (its start code traps, its initial memory is over the cap),
            // like a trap in `handle`: NACKed with the reason, then dead-lettered (docs/plugins.md,
            // "WebAssembly handlers"). Retrying it forever as if a consumer were down would stall
            // the topic on a version that can never run.
            CallResult::NoInstance(e) => {
                let env = &batch[acked].envelope;
                tracing::warn!(consumer_id = %self.consumer_id, offset = env.offset, topic = %env.topic, error = %crate::plugin::escape_controls(&e.to_string()), "plugin cannot be instantiated; counted as NACK");
                Some(Outcome::Nack(format!("plugin cannot be instantiated: {e}")))
            }
        };
        RunAnswer {
            acked,
            stopped: outcome,
        }
    }
}

impl Target for PluginTarget {
    fn answers_per_message(&self) -> bool {
        true
    }

    fn deliver_run<'a>(
        &'a self,
        batch: &'a [Delivery],
        stop: &'a CancellationToken,
    ) -> BoxFuture<'a, RunAnswer> {
        Box::pin(self.shared.call_run(batch, stop.clone()))
    }

    fn status(&self) -> TargetStatus {
        TargetStatus::Plugin {
            path: self.shared.spec.path.display().to_string(),
            version: self
                .shared
                .current
                .load()
                .as_ref()
                .map(|c| c.version.clone()),
            load_error: self.shared.load_error.lock().clone(),
            world: self
                .shared
                .current
                .load()
                .as_ref()
                .map(|c| c.world.to_owned()),
            name: self.shared.spec.name.clone(),
            shadow: self.shared.shadow.as_ref().map(|s| s.status()),
            emit_error: self.shared.emits.failing(),
            awaiting_deploy: self.shared.awaiting_deploy.load(Ordering::Relaxed),
        }
    }

    fn reload(&self) -> BoxFuture<'_, Result<bool, String>> {
        Box::pin(self.shared.reload())
    }

    fn settled<'a>(&'a self, topic: &'a Topic, partition: u32) -> BoxFuture<'a, bool> {
        Box::pin(self.shared.emits.settled(topic, partition))
    }

    fn stopping(&self) {
        self.shared.emits.stop();
    }

    fn closed(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.shared.emits.closed())
    }

    fn forget_topic(&self, topic: &Topic) {
        self.shared.emits.forget(topic);
    }
}
