//! The `plugin` dispatcher target: delivers each message to a WebAssembly component, and swaps in
//! a new version of the component when its file changes.
//!
//! Hot reload: a debounced watcher on the file's directory (so in-place writes, a rename over the
//! file and an editor's temporary files are all seen, and only the plugin's own name counts) and
//! `POST /mmmq/admin/reload` both lead to [`PluginTarget::reload`]. The new file is compiled on a
//! blocking thread, off the delivery path; if it compiles and implements the world it becomes
//! current and the next message goes to it, while a message already in a call finishes on the old
//! version. If it does not, the old version keeps serving and the error shows in the status.

use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use notify_debouncer_mini::notify::{RecommendedWatcher, RecursiveMode};
use notify_debouncer_mini::{DebounceEventResult, Debouncer, new_debouncer};
use parking_lot::Mutex;

use super::guest_log::GuestLog;
use super::runtime::{
    Compiled, Instance, Limits, PluginEngine, PluginError, WitAck, WitMessage, version_of,
};
use crate::config::PluginSpec;
use crate::dispatch::{BoxFuture, Delivery, Outcome, Target, TargetStatus};

/// How long a file must be quiet before it is reloaded (editors write in several steps).
const DEBOUNCE: Duration = Duration::from_millis(150);

struct Shared {
    engine: Arc<PluginEngine>,
    spec: PluginSpec,
    consumer_id: String,
    log: GuestLog,
    current: ArcSwapOption<Compiled>,
    load_error: Mutex<Option<String>>,
    /// Instances between calls, ready for the next message of any topic.
    idle: Mutex<Vec<Instance>>,
    reloading: tokio::sync::Mutex<()>,
}

/// A dispatcher target that runs a component.
pub struct PluginTarget {
    shared: Arc<Shared>,
    _watcher: Option<Debouncer<RecommendedWatcher>>,
}

enum CallResult {
    Answered(Instance, WitAck),
    Faulted(PluginError),
    NoInstance(PluginError),
}

impl PluginTarget {
    /// Loads the component (a failure is recorded, not fatal: the dispatcher waits for a good
    /// file) and starts watching its file.
    pub async fn start(engine: Arc<PluginEngine>, spec: PluginSpec, consumer_id: &str) -> Self {
        let shared = Arc::new(Shared {
            engine,
            log: GuestLog::new(consumer_id),
            consumer_id: consumer_id.to_owned(),
            spec,
            current: ArcSwapOption::empty(),
            load_error: Mutex::new(None),
            idle: Mutex::new(Vec::new()),
            reloading: tokio::sync::Mutex::new(()),
        });
        let _ = shared.reload().await;
        let watcher = watch(&shared);
        Self {
            shared,
            _watcher: watcher,
        }
    }
}

fn watch(shared: &Arc<Shared>) -> Option<Debouncer<RecommendedWatcher>> {
    let path = shared.spec.path.clone();
    let dir = path.parent()?.to_owned();
    let name = path.file_name()?.to_owned();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut debouncer = match new_debouncer(DEBOUNCE, move |res: DebounceEventResult| {
        if let Ok(events) = res
            && events.iter().any(|e| e.path.file_name() == Some(&name))
        {
            let _ = tx.send(());
        }
    }) {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(consumer_id = %shared.consumer_id, error = %e, "cannot watch the plugin file; reload with POST /mmmq/admin/reload");
            return None;
        }
    };
    if let Err(e) = debouncer.watcher().watch(&dir, RecursiveMode::NonRecursive) {
        tracing::warn!(consumer_id = %shared.consumer_id, dir = %dir.display(), error = %e, "cannot watch the plugin directory; reload with POST /mmmq/admin/reload");
        return None;
    }
    let weak: Weak<Shared> = Arc::downgrade(shared);
    tokio::spawn(async move {
        while rx.recv().await.is_some() {
            let Some(shared) = weak.upgrade() else { return };
            let _ = shared.reload().await;
        }
    });
    Some(debouncer)
}

impl Shared {
    /// Reads and, if it changed, compiles the file. `Ok(true)` when a new version now serves.
    async fn reload(self: &Arc<Self>) -> Result<bool, String> {
        let _one_at_a_time = self.reloading.lock().await;
        let path = self.spec.path.clone();
        let engine = self.engine.clone();
        let serving = self.current.load().as_ref().map(|c| c.version.clone());
        let result = tokio::task::spawn_blocking(move || {
            let bytes = std::fs::read(&path).map_err(|e| PluginError::Read {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
            if serving.as_deref() == Some(&*version_of(&bytes)) {
                return Ok(None);
            }
            engine.compile(&bytes).map(Some)
        })
        .await
        .expect("plugin compile task panicked");
        match result {
            Ok(None) => {
                *self.load_error.lock() = None;
                Ok(false)
            }
            Ok(Some(compiled)) => {
                tracing::info!(consumer_id = %self.consumer_id, version = %compiled.version, bytes = compiled.size, "plugin version loaded");
                self.current.store(Some(Arc::new(compiled)));
                *self.load_error.lock() = None;
                self.idle.lock().clear();
                Ok(true)
            }
            Err(e) => {
                let e = e.to_string();
                match self.current.load().as_ref() {
                    Some(c) => {
                        tracing::error!(consumer_id = %self.consumer_id, error = %e, serving = %c.version, "plugin reload failed; the old version keeps serving")
                    }
                    None => {
                        tracing::error!(consumer_id = %self.consumer_id, error = %e, "plugin cannot be loaded; its messages wait until the file is fixed")
                    }
                }
                *self.load_error.lock() = Some(e.clone());
                Err(e)
            }
        }
    }

    /// Calls `handle` for each message in order on one blocking thread, stopping at the first that
    /// is not ACKed: how many were, and the outcome of the next.
    async fn call_run(self: &Arc<Self>, batch: &[Delivery]) -> (usize, Option<Outcome>) {
        let Some(compiled) = self.current.load_full() else {
            let why = self
                .load_error
                .lock()
                .clone()
                .unwrap_or_else(|| "not loaded".into());
            return (
                0,
                Some(Outcome::Failed(format!("plugin not loaded: {why}"))),
            );
        };
        let messages: Vec<WitMessage> = batch
            .iter()
            .map(|d| WitMessage {
                topic: d.envelope.topic.to_string(),
                offset: d.envelope.offset,
                timestamp: d.envelope.timestamp,
                key: d.envelope.key.clone(),
                content: d.envelope.content.get().to_owned(),
            })
            .collect();
        let idle = {
            let mut idle = self.idle.lock();
            idle.retain(|i| i.version == compiled.version);
            idle.pop()
        };
        let limits = Limits {
            max_memory_bytes: self.spec.max_memory_bytes,
            timeout: self.spec.timeout,
        };
        let this = self.clone();
        let (acked, result) = tokio::task::spawn_blocking(move || {
            let mut instance = match idle {
                Some(i) => i,
                None => match Instance::new(&this.engine, &compiled, limits, &this.log) {
                    Ok(i) => i,
                    Err(e) => return (0, CallResult::NoInstance(e)),
                },
            };
            for (i, m) in messages.iter().enumerate() {
                match instance.handle(m) {
                    Ok(WitAck::Ack) => {}
                    Ok(ack) => return (i, CallResult::Answered(instance, ack)),
                    Err(e) => return (i, CallResult::Faulted(e)),
                }
            }
            (messages.len(), CallResult::Answered(instance, WitAck::Ack))
        })
        .await
        .expect("plugin call task panicked");
        let outcome = match result {
            CallResult::Answered(instance, ack) => {
                if self
                    .current
                    .load()
                    .as_ref()
                    .is_some_and(|c| c.version == instance.version)
                {
                    self.idle.lock().push(instance);
                }
                match ack {
                    WitAck::Ack => None,
                    WitAck::Nack => Some(Outcome::Nack("plugin answered nack".into())),
                }
            }
            CallResult::Faulted(e) => {
                let env = &batch[acked].envelope;
                tracing::warn!(consumer_id = %self.consumer_id, offset = env.offset, topic = %env.topic, error = %e, "plugin call failed; counted as NACK");
                Some(Outcome::Nack(format!("plugin {e}")))
            }
            // Nothing the message did: retried with backoff like an unreachable consumer.
            CallResult::NoInstance(e) => Some(Outcome::Failed(e.to_string())),
        };
        (acked, outcome)
    }
}

impl Target for PluginTarget {
    fn answers_per_message(&self) -> bool {
        true
    }

    fn deliver_prefix<'a>(
        &'a self,
        batch: &'a [Delivery],
    ) -> BoxFuture<'a, (usize, Option<Outcome>)> {
        Box::pin(self.shared.call_run(batch))
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
        }
    }

    fn reload(&self) -> BoxFuture<'_, Result<bool, String>> {
        Box::pin(self.shared.reload())
    }
}
