//! The kinds of target, and the factory that builds them from `dispatchers.json` specs.
//!
//! - `http`: a remote consumer over HTTP.
//! - [`wasm`]: a WebAssembly component, hot-reloaded when its file changes.
//! - `in_process`: a Rust closure of an application that embeds the broker.

mod fleet;
mod http;
mod in_process;
mod shadow;
pub mod wasm;
mod watch;

use std::sync::Arc;

use crate::config::{DeliveryMode, DispatcherSpec, TargetSpec};
use crate::dispatch::target::{BoxFuture, Target};
use crate::emit::Emitter;
use crate::handled::Handlers;
use crate::plugin::{LogRecord, LogSink, PluginEngine};
pub use fleet::FleetTarget;
pub use http::HttpTarget;
pub use in_process::{Handler, InProcessTarget};
pub use wasm::PluginTarget;

/// Builds targets from specs: the seam where the kinds of target plug in.
pub trait TargetFactory: Send + Sync {
    /// A target for `spec`, or why it cannot be built.
    fn build<'a>(
        &'a self,
        spec: &'a DispatcherSpec,
        emitter: &'a Arc<Emitter>,
    ) -> BoxFuture<'a, Result<Arc<dyn Target>, String>>;

    /// The plugin log lines its targets produce, for `__logs.<consumerId>`; taken once by the
    /// broker at open.
    fn take_log_records(&self) -> Option<tokio::sync::mpsc::Receiver<LogRecord>> {
        None
    }
}

/// Host targets (HTTP consumers) and plugin targets (WebAssembly components). The WebAssembly
/// engine ([`PluginEngine::shared`]) is created with the first plugin dispatcher or deploy, so a
/// broker without plugins runs none.
pub struct Targets {
    logs: LogSink,
    log_records: parking_lot::Mutex<Option<tokio::sync::mpsc::Receiver<LogRecord>>>,
}

/// Plugin log lines waiting to be appended; past this they are dropped (the broker's log keeps
/// them).
const LOG_QUEUE: usize = 8192;

impl Default for Targets {
    fn default() -> Self {
        let (logs, rx) = tokio::sync::mpsc::channel(LOG_QUEUE);
        Self {
            logs,
            log_records: parking_lot::Mutex::new(Some(rx)),
        }
    }
}

impl TargetFactory for Targets {
    fn build<'a>(
        &'a self,
        spec: &'a DispatcherSpec,
        emitter: &'a Arc<Emitter>,
    ) -> BoxFuture<'a, Result<Arc<dyn Target>, String>> {
        Box::pin(async move {
            match &spec.target {
                TargetSpec::Host(h) => HttpTarget::new(h, spec.batch_max_messages > 1)
                    .map(|t| Arc::new(t) as Arc<dyn Target>)
                    .map_err(|e| e.to_string()),
                TargetSpec::Hosts(hosts) => hosts
                    .iter()
                    .map(|h| HttpTarget::new(h, spec.batch_max_messages > 1).map(|t| (t, h.url())))
                    .collect::<Result<Vec<_>, _>>()
                    .map(|members| {
                        let at_most_once = spec.delivery == DeliveryMode::AtMostOnce;
                        Arc::new(FleetTarget::new(members, at_most_once)) as Arc<dyn Target>
                    })
                    .map_err(|e| e.to_string()),
                TargetSpec::Plugin(p) => {
                    let engine = PluginEngine::shared().await.map_err(|e| e.to_string())?;
                    let target = PluginTarget::start(
                        engine,
                        p.clone(),
                        spec.consumer_id.as_str(),
                        Some(self.logs.clone()),
                        emitter.for_consumer(&spec.consumer_id),
                        Some(Handlers::new(
                            emitter.registry().clone(),
                            spec.consumer_id.clone(),
                            spec.max_in_flight as u32,
                        )),
                    )
                    .await;
                    Ok(Arc::new(target) as Arc<dyn Target>)
                }
                TargetSpec::InProcess => {
                    Err("in-process handlers are registered by the embedding application".into())
                }
            }
        })
    }

    fn take_log_records(&self) -> Option<tokio::sync::mpsc::Receiver<LogRecord>> {
        self.log_records.lock().take()
    }
}
