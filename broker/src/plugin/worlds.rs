//! The two plugin worlds the host serves (docs/plugins.md, "WebAssembly handlers"): `mmmq:plugin@0.1.0`
//! (`wit/plugin.wit`) and `mmmq:plugin@0.2.0` (`wit/0.2.0/plugin.wit`). A component is checked
//! against 0.2.0 first, then 0.1.0; either way the rest of the broker sees one [`Call`] in and one
//! [`Verdict`] out, so a 0.1.0 component keeps working unchanged.

use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Engine, Store};

use super::error::PluginError;
use super::guest_log::GuestLevel;
use super::host::HostState;

// The message is passed to the guest borrowed from the `Call`, not copied into the bindings'
// own types first (a call copies its content once, into the guest's memory).
mod v1 {
    wasmtime::component::bindgen!({
        world: "handler",
        path: "wit",
        ownership: Borrowing { duplicate_if_necessary: true },
    });
}

mod v2 {
    wasmtime::component::bindgen!({
        world: "handler",
        path: "wit/0.2.0",
        ownership: Borrowing { duplicate_if_necessary: true },
    });
}

/// The world of 0.1.0 components.
pub const WORLD_V1: &str = "mmmq:plugin/handler@0.1.0";
/// The world of 0.2.0 components.
pub const WORLD_V2: &str = "mmmq:plugin/handler@0.2.0";

/// One message as a plugin of either world receives it (a 0.1.0 plugin sees no partition, id or
/// attempt).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// The offset in the partition.
    pub offset: u64,
    /// Milliseconds since the Unix epoch, set at append.
    pub timestamp: u64,
    /// The producer's key.
    pub key: Option<String>,
    /// The producer's idempotency id.
    pub id: Option<String>,
    /// 1 for the first delivery, then one more for each resend.
    pub attempt: u32,
    /// The content as JSON text.
    pub content: String,
}

/// A plugin's answer (a 0.1.0 plugin answers `Ack` or `Nack` only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Done.
    Ack,
    /// Refused: resend up to `maxNackRetries`, then dead-letter.
    Nack,
    /// Resend after this many milliseconds (counted as an attempt).
    RetryAfter(u32),
    /// Straight to the dead-letter topic with this reason.
    DeadLetter(String),
}

/// Adds what both worlds import to `linker`.
pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    v1::Handler::add_to_linker::<_, HasSelf<_>>(linker, |s| s)?;
    v2::Handler::add_to_linker::<_, HasSelf<_>>(linker, |s| s)?;
    Ok(())
}

/// A component checked against one of the worlds, ready to instantiate.
pub(super) enum Pre {
    V1(v1::HandlerPre<HostState>),
    V2(v2::HandlerPre<HostState>),
}

impl Pre {
    /// Checks `component` against 0.2.0, then 0.1.0.
    pub(super) fn new(
        linker: &Linker<HostState>,
        component: &Component,
    ) -> Result<Self, PluginError> {
        let pre = linker
            .instantiate_pre(component)
            .map_err(|e| PluginError::World(format!("{e:#}")))?;
        match v2::HandlerPre::new(pre.clone()) {
            Ok(p) => Ok(Self::V2(p)),
            Err(v2_error) => v1::HandlerPre::new(pre).map(Self::V1).map_err(|v1_error| {
                PluginError::World(format!(
                    "as {WORLD_V2}: {v2_error:#}; as {WORLD_V1}: {v1_error:#}"
                ))
            }),
        }
    }

    /// The world it implements.
    pub(super) fn world(&self) -> &'static str {
        match self {
            Self::V1(_) => WORLD_V1,
            Self::V2(_) => WORLD_V2,
        }
    }

    pub(super) fn instantiate(&self, store: &mut Store<HostState>) -> wasmtime::Result<Handler> {
        Ok(match self {
            Self::V1(p) => Handler::V1(p.instantiate(store)?),
            Self::V2(p) => Handler::V2(p.instantiate(store)?),
        })
    }
}

/// A live instance's exports.
pub(super) enum Handler {
    V1(v1::Handler),
    V2(v2::Handler),
}

impl Handler {
    pub(super) fn call(
        &self,
        store: &mut Store<HostState>,
        call: &Call,
    ) -> wasmtime::Result<Verdict> {
        match self {
            Self::V1(h) => {
                use v1::mmmq::plugin::types::{Ack, Message};
                let message = Message {
                    topic: &call.topic,
                    offset: call.offset,
                    timestamp: call.timestamp,
                    key: call.key.as_deref(),
                    content: &call.content,
                };
                Ok(match h.call_handle(store, message)? {
                    Ack::Ack => Verdict::Ack,
                    Ack::Nack => Verdict::Nack,
                })
            }
            Self::V2(h) => {
                use v2::mmmq::plugin::types::{Message, Verdict as V};
                let message = Message {
                    topic: &call.topic,
                    partition: call.partition,
                    offset: call.offset,
                    timestamp: call.timestamp,
                    key: call.key.as_deref(),
                    id: call.id.as_deref(),
                    attempt: call.attempt,
                    content: &call.content,
                };
                Ok(match h.call_handle(store, message)? {
                    V::Ack => Verdict::Ack,
                    V::Nack => Verdict::Nack,
                    V::RetryAfter(ms) => Verdict::RetryAfter(ms),
                    V::DeadLetter(reason) => Verdict::DeadLetter(reason),
                })
            }
        }
    }
}

/// The engine's view of a component's world without instantiating it (`mmmq plugin check`).
pub(super) fn imports(component: &Component, engine: &Engine) -> Vec<String> {
    component
        .component_type()
        .imports(engine)
        .map(|(name, _)| name.to_owned())
        .collect()
}

/// The `log` import of one world: the same levels under each world's own generated types.
macro_rules! log_host {
    ($world:ident) => {
        impl $world::mmmq::plugin::types::Host for HostState {}

        impl $world::mmmq::plugin::log::Host for HostState {
            fn log(&mut self, level: $world::mmmq::plugin::log::Level, message: String) {
                use $world::mmmq::plugin::log::Level;
                let level = match level {
                    Level::Trace => GuestLevel::Trace,
                    Level::Debug => GuestLevel::Debug,
                    Level::Info => GuestLevel::Info,
                    Level::Warn => GuestLevel::Warn,
                    Level::Error => GuestLevel::Error,
                };
                self.log.emit(level, "log", &message);
            }
        }
    };
}

log_host!(v1);
log_host!(v2);

impl v2::mmmq::plugin::host::Host for HostState {
    fn emit(&mut self, topic: String, key: Option<String>, content: String) -> Result<(), String> {
        self.emits.push(topic, key, content)
    }

    fn get_config(&mut self, key: String) -> Option<String> {
        self.config.get(&key).cloned()
    }
}
