//! The WebAssembly host: one shared engine, components compiled once per file version, and
//! sandboxed instances with a memory cap and a time limit per call.
//!
//! # Choices (measured: see docs/benchmarks.md)
//! - **Instance reuse.** A call into a reused instance costs about a microsecond; a fresh instance
//!   per message costs tens of microseconds. Each (dispatcher, topic) has its own instance, reused
//!   for its consecutive messages and thrown away after any fault (trap, timeout, memory cap), so
//!   a broken instance never serves again. The price, and a feature: state a guest keeps in
//!   statics survives from one message of its topic to the next (the SDK documents it). A
//!   dispatcher keeps at most [`crate::dispatch::targets::wasm::MAX_IDLE_INSTANCES`] of them between calls.
//! - **One memory budget per instance**: `maxMemoryBytes` caps all linear memories and tables of
//!   an instance together.
//! - **No pooling allocator.** With reuse, instantiation is rare (start, reload, after a fault), so
//!   reserving pooled slots sized for the largest `maxMemoryBytes` would cost more than it saves.
//! - **Epochs, not fuel**, for time limits: a ticker thread bumps the engine's epoch every
//!   millisecond and each call gets a deadline of `timeoutMs` ticks; fuel would tax every
//!   instruction. Epochs interrupt guest code only, so every wait in the host (a sleep, an HTTP
//!   answer) is bounded by the same deadline on its own (`plugin::waits`).
//! - **WASI with nothing in it**: Rust's std for `wasm32-wasip2` imports WASI, so it is linked, but
//!   with no directories, no environment, no sockets and frozen clocks; stdout and stderr go to the
//!   broker's log. `wasi:http` is linked too, and sends only to `plugin.allowedHosts` (`plugin::http`).

use std::sync::{Arc, Weak};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, Store, Trap};

use super::guest_log::{GuestLog, LineContext};
use super::host::HostState;
use super::waits::OutOfTime;
use crate::produce::ProduceItem;

pub use super::error::PluginError;
pub use super::host::Grants;
pub use super::worlds::{Call, Verdict, WORLD_V1, WORLD_V2};
use super::worlds::{Handler, Pre};

/// How often the epoch advances: the granularity of `timeoutMs`.
const TICK: Duration = Duration::from_millis(1);

/// The shared engine and linker.
pub struct PluginEngine {
    engine: Engine,
    linker: Linker<HostState>,
    /// The last versions compiled, newest last: a deploy's validation, the dispatchers that then
    /// load it, a shadow of a kept version and a rollback to one all get the same compilation.
    recent: parking_lot::Mutex<std::collections::VecDeque<Arc<Compiled>>>,
}

/// Compiled versions [`PluginEngine::compile`] keeps for reuse.
const RECENT_COMPILED: usize = 8;

impl PluginEngine {
    /// Builds the engine and starts its epoch ticker (which stops when the engine is dropped).
    pub fn new() -> Result<Arc<Self>, PluginError> {
        Self::build(false)
    }

    /// An engine whose traps name the source file and line of each WebAssembly frame when the
    /// component carries debug info (`mmmq plugin replay`; it costs compile time and memory the
    /// broker does not spend).
    pub fn with_backtrace_details() -> Result<Arc<Self>, PluginError> {
        Self::build(true)
    }

    fn build(details: bool) -> Result<Arc<Self>, PluginError> {
        let mut config = Config::new();
        config.wasm_backtrace_details(if details {
            wasmtime::WasmBacktraceDetails::Enable
        } else {
            wasmtime::WasmBacktraceDetails::Environment
        });
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        config.max_wasm_stack(1 << 20);
        let engine = Engine::new(&config).map_err(|e| PluginError::Compile(e.to_string()))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(|e| PluginError::Compile(e.to_string()))?;
        super::waits::add_to_linker(&mut linker)
            .map_err(|e| PluginError::Compile(e.to_string()))?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_sync(&mut linker)
            .map_err(|e| PluginError::Compile(e.to_string()))?;
        super::worlds::add_to_linker(&mut linker)
            .map_err(|e| PluginError::Compile(e.to_string()))?;
        let this = Arc::new(Self {
            engine,
            linker,
            recent: parking_lot::Mutex::new(std::collections::VecDeque::new()),
        });
        let weak: Weak<Self> = Arc::downgrade(&this);
        std::thread::Builder::new()
            .name("mmmq-epoch".into())
            .spawn(move || {
                while let Some(engine) = weak.upgrade() {
                    engine.engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(TICK);
                }
            })
            .expect("spawn the epoch ticker");
        Ok(this)
    }

    /// The process's engine, made on first use (off the async executor): a deploy's
    /// validation and every dispatcher compile with it, so they share its compilations.
    pub async fn shared() -> Result<Arc<Self>, PluginError> {
        static SHARED: tokio::sync::OnceCell<Arc<PluginEngine>> =
            tokio::sync::OnceCell::const_new();
        SHARED
            .get_or_try_init(|| async {
                tokio::task::spawn_blocking(PluginEngine::new)
                    .await
                    .expect("engine task panicked")
            })
            .await
            .cloned()
    }

    /// Compiles `bytes` and checks it against the handler world, or returns the compilation of
    /// the same version made lately. Blocking (milliseconds to seconds: keep it off the delivery
    /// path).
    pub fn compile(&self, bytes: &[u8]) -> Result<Arc<Compiled>, PluginError> {
        let version = version_of(bytes);
        {
            let mut recent = self.recent.lock();
            if let Some(i) = recent.iter().position(|c| c.version == version) {
                let hit = recent.remove(i).expect("found");
                recent.push_back(hit.clone());
                return Ok(hit);
            }
        }
        let compiled = Arc::new(self.compile_new(bytes, version)?);
        let mut recent = self.recent.lock();
        recent.push_back(compiled.clone());
        if recent.len() > RECENT_COMPILED {
            recent.pop_front();
        }
        Ok(compiled)
    }

    fn compile_new(&self, bytes: &[u8], version: String) -> Result<Compiled, PluginError> {
        // wasmtime's answer for a file that is not WebAssembly at all is a multi-line dump of
        // its first bytes; a user uploading the wrong file needs one line that says so, and no
        // one may learn a file's content from it.
        if !bytes.starts_with(b"\0asm") {
            return Err(PluginError::BadMagic);
        }
        let component = Component::new(&self.engine, bytes).map_err(|e| {
            let msg = format!("{e:#}");
            if wasmparser_says_core_module(bytes) {
                PluginError::Compile(format!(
                    "this is a core WebAssembly module, not a component (build with --target wasm32-wasip2): {msg}"
                ))
            } else {
                PluginError::Compile(msg)
            }
        })?;
        let pre = Pre::new(&self.linker, &component)?;
        let imports = super::worlds::imports(&component, &self.engine);
        Ok(Compiled {
            world: pre.world(),
            pre,
            version,
            size: bytes.len(),
            imports,
        })
    }
}

/// A core module starts with the version 1 header; a component with a different layer byte.
fn wasmparser_says_core_module(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && bytes[..4] == *b"\0asm" && bytes[4..8] == [1, 0, 0, 0]
}

/// The version of a component file: the first 16 hex digits of its SHA-256.
pub fn version_of(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// A compiled, type-checked component.
pub struct Compiled {
    pre: Pre,
    /// The world it implements: [`WORLD_V1`] or [`WORLD_V2`].
    pub world: &'static str,
    /// See [`version_of`].
    pub version: String,
    /// File size.
    pub size: usize,
    /// What the component imports (for `mmmq plugin check`).
    pub imports: Vec<String>,
}

/// Limits of one instance.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Memory cap.
    pub max_memory_bytes: u64,
    /// Time per call.
    pub timeout: Duration,
    /// The largest message a 0.2.0 plugin may emit (`--max-body-bytes`); a call may emit
    /// [`super::emit_buffer::EMIT_BYTES_FACTOR`] times this in all.
    pub max_message_bytes: usize,
}

/// A live instance of one version, with its store.
pub struct Instance {
    store: Store<HostState>,
    handler: Handler,
    /// The version it runs.
    pub version: String,
    limits: Limits,
}

impl Instance {
    /// Instantiates `compiled` in a fresh sandbox with the dispatcher's `plugin.config`. Blocking.
    pub fn new(
        engine: &PluginEngine,
        compiled: &Compiled,
        limits: Limits,
        log: &GuestLog,
        grants: &Grants,
    ) -> Result<Self, PluginError> {
        let state = HostState::new(
            log.for_instance(),
            limits.max_memory_bytes,
            limits.max_message_bytes,
            grants,
        );
        let mut store = Store::new(&engine.engine, state);
        // Start code gets the time of a call, in WebAssembly and in the host alike.
        store
            .data_mut()
            .set_deadline(std::time::Instant::now() + limits.timeout);
        store.limiter(HostState::limiter);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(ticks(limits.timeout));
        let handler = compiled.pre.instantiate(&mut store).map_err(|e| {
            if store.data().memory_refused() {
                PluginError::Memory(limits.max_memory_bytes)
            } else {
                PluginError::Instantiate(format!("{e:#}"))
            }
        })?;
        Ok(Self {
            store,
            handler,
            version: compiled.version.clone(),
            limits,
        })
    }

    /// Calls `handle`. After an `Err` the instance must be dropped. Blocking.
    ///
    /// What the call emitted is kept for [`Instance::take_emits`] only when it answers `ack`:
    /// after any other verdict or a fault it is gone.
    pub fn handle(&mut self, call: &Call) -> Result<Verdict, PluginError> {
        let state = self.store.data_mut();
        state.emits.clear();
        state.set_deadline(std::time::Instant::now() + self.limits.timeout);
        self.store.set_epoch_deadline(ticks(self.limits.timeout));
        self.store.data().log.set_context(Some(LineContext {
            topic: call.topic.clone(),
            partition: call.partition,
            offset: call.offset,
            version: self.version.clone(),
        }));
        let verdict = self
            .handler
            .call(&mut self.store, call)
            .map_err(|e| self.classify(e));
        self.store.data().log.set_context(None);
        if !matches!(verdict, Ok(Verdict::Ack)) {
            self.store.data_mut().emits.clear();
        }
        verdict
    }

    /// What the last call emitted, in order (nothing unless it answered `ack`).
    pub fn take_emits(&mut self) -> Vec<ProduceItem> {
        self.store.data_mut().emits.take()
    }

    fn classify(&self, e: wasmtime::Error) -> PluginError {
        if self.store.data().memory_refused() {
            return PluginError::Memory(self.limits.max_memory_bytes);
        }
        // A wait in the host that reached the deadline (`waits`) is the same timeout as the
        // epoch's interrupt of guest code.
        if e.is::<OutOfTime>() {
            return PluginError::Timeout(self.limits.timeout.as_millis() as u64);
        }
        match e.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => PluginError::Timeout(self.limits.timeout.as_millis() as u64),
            Some(Trap::StackOverflow) => PluginError::Trap("stack overflow".into()),
            _ => PluginError::Trap(format!("{e:#}")),
        }
    }
}

fn ticks(timeout: Duration) -> u64 {
    (timeout.as_micros() / TICK.as_micros()).max(1) as u64 + 1
}
