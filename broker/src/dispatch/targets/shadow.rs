//! Shadow runs (docs/plugins.md, "Deploying plugins by API"): `plugin.shadow` names a kept version of the
//! dispatcher's plugin, run on every message after the current version has handled it, side-effect
//! free — its emits are dropped, it has no network, its log lines go to the broker's log only —
//! and its verdicts compared with the current version's. Its answer never changes what happens to
//! the message. Status counts the comparisons; the first disagreements are logged with their
//! offsets.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use mmmq_core::{ShadowStatus, Topic};
use parking_lot::Mutex;

use crate::config::ShadowSpec;
use crate::plugin::runtime::{
    Call, Compiled, Instance, Limits, PluginEngine, PluginError, Verdict,
};
use crate::plugin::{Grants, GuestLog};

/// Disagreements logged one by one; past this only counted.
const LOGGED_DISAGREEMENTS: u64 = 20;

/// The shadow of one dispatcher.
pub(super) struct Shadow {
    version: String,
    compiled: Result<Arc<Compiled>, String>,
    grants: Grants,
    log: GuestLog,
    consumer_id: String,
    idle: Mutex<HashMap<(Topic, u32, u32), Instance>>,
    compared: AtomicU64,
    agreed: AtomicU64,
    disagreed: AtomicU64,
    faults: AtomicU64,
}

impl Shadow {
    /// Compiles the shadow version's file (a failure shows in status; the dispatcher runs on).
    /// Blocking.
    pub(super) fn load(
        engine: &PluginEngine,
        spec: &ShadowSpec,
        consumer_id: &str,
        config: Arc<std::collections::BTreeMap<String, String>>,
    ) -> Self {
        let compiled = std::fs::read(&spec.path)
            .map_err(|e| {
                format!(
                    "version {} is not kept ({}): {e}",
                    spec.version,
                    spec.path.display()
                )
            })
            .and_then(|bytes| engine.compile(&bytes).map_err(|e| e.to_string()));
        if let Err(e) = &compiled {
            tracing::error!(consumer_id, version = spec.version, error = %crate::plugin::escape_controls(&e.to_string()), "the shadow version cannot run");
        }
        Self {
            version: spec.version.clone(),
            compiled,
            // The same configuration, and no network whatever the dispatcher allows.
            grants: Grants {
                config,
                allowed_hosts: Arc::default(),
            },
            log: GuestLog::new(&format!("{consumer_id}.shadow"), None),
            consumer_id: consumer_id.to_owned(),
            idle: Mutex::new(HashMap::new()),
            compared: AtomicU64::new(0),
            agreed: AtomicU64::new(0),
            disagreed: AtomicU64::new(0),
            faults: AtomicU64::new(0),
        }
    }

    /// Runs the shadow on `call`, which the current version answered with `current`, and counts
    /// the comparison. Blocking.
    pub(super) fn compare(
        &self,
        engine: &PluginEngine,
        lane: (Topic, u32, u32),
        call: &Call,
        current: &Result<Verdict, PluginError>,
        limits: Limits,
    ) {
        let Ok(compiled) = &self.compiled else {
            return;
        };
        let idle = self.idle.lock().remove(&lane);
        let instance = match idle {
            Some(i) => Ok(i),
            None => Instance::new(engine, compiled, limits, &self.log, &self.grants),
        };
        let shadow = instance.and_then(|mut i| {
            let verdict = i.handle(call);
            drop(i.take_emits());
            if verdict.is_ok() {
                self.idle.lock().insert(lane, i);
            }
            verdict
        });
        self.compared.fetch_add(1, Ordering::Relaxed);
        let agrees = match (current, &shadow) {
            (_, Err(_)) => {
                self.faults.fetch_add(1, Ordering::Relaxed);
                return;
            }
            (Ok(c), Ok(s)) => c == s,
            (Err(_), Ok(_)) => false,
        };
        if agrees {
            self.agreed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let n = self.disagreed.fetch_add(1, Ordering::Relaxed) + 1;
        if n <= LOGGED_DISAGREEMENTS {
            let current = match current {
                Ok(v) => format!("{v:?}"),
                Err(e) => format!("fault ({e})"),
            };
            tracing::warn!(
                consumer_id = self.consumer_id,
                topic = call.topic,
                partition = call.partition,
                offset = call.offset,
                current,
                shadow = ?shadow.as_ref().ok(),
                version = self.version,
                "the shadow version disagrees"
            );
        }
    }

    /// For status.
    pub(super) fn status(&self) -> ShadowStatus {
        ShadowStatus {
            version: self.version.clone(),
            compared: self.compared.load(Ordering::Relaxed),
            agreed: self.agreed.load(Ordering::Relaxed),
            disagreed: self.disagreed.load(Ordering::Relaxed),
            faults: self.faults.load(Ordering::Relaxed),
            load_error: self.compiled.as_ref().err().cloned(),
        }
    }
}
