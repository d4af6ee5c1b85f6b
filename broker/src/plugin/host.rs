//! What a plugin's store carries (the sandbox of one instance): its WASI context with nothing
//! in it, its memory budget, its log, its grants (`plugin.config`, `plugin.allowedHosts`), what
//! the call in progress emits, and its `wasi:http` hooks. The worlds' host functions
//! (`worlds`) and the runtime's instances (`runtime`) are built on it; it knows neither.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtxView, WasiHttpView};

use super::emit_buffer::EmitBuffer;
use super::guest_log::{GuestLog, GuestOutput};
use super::http::HttpHooks;
use crate::config::AllowedOrigin;

/// The memory budget of one instance: `maxMemoryBytes` caps everything the instance allocates
/// (all its linear memories and its tables together, a table element counted as
/// [`TABLE_ELEMENT_BYTES`]), not each memory on its own, so a component with several memories or
/// a growing table cannot multiply the cap. Records whether a growth was refused, so a trap can be
/// told apart from the cap.
struct Limiter {
    budget: usize,
    used: usize,
    refused: bool,
}

/// What a table element costs against the budget: a reference, as wasmtime stores one.
const TABLE_ELEMENT_BYTES: usize = 8;
/// Instances, memories and tables a component may create: far above what a handler needs (a Rust
/// component has a handful), far below what would let one exhaust the host's bookkeeping.
const MAX_INSTANCES: usize = 32;
const MAX_MEMORIES: usize = 16;
const MAX_TABLES: usize = 64;

impl Limiter {
    fn new(budget: u64) -> Self {
        Self {
            budget: usize::try_from(budget).unwrap_or(usize::MAX),
            used: 0,
            refused: false,
        }
    }

    fn grow(&mut self, more: usize) -> bool {
        match self.used.checked_add(more) {
            Some(total) if total <= self.budget => {
                self.used = total;
                true
            }
            _ => {
                self.refused = true;
                false
            }
        }
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.grow(desired.saturating_sub(current)))
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.grow(
            desired
                .saturating_sub(current)
                .saturating_mul(TABLE_ELEMENT_BYTES),
        ))
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }
}

/// What a store carries.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: Limiter,
    pub(super) log: GuestLog,
    /// The dispatcher's `plugin.config` (0.2.0 `get-config`).
    pub(super) config: Arc<BTreeMap<String, String>>,
    /// What the call in progress emitted (0.2.0 `emit`).
    pub(super) emits: EmitBuffer,
    http_ctx: wasmtime_wasi_http::WasiHttpCtx,
    http_hooks: HttpHooks,
    /// When the call in progress must end: no wait in the host lasts longer (`waits`).
    deadline: Instant,
}

/// What a dispatcher grants its plugin beyond the sandbox: `plugin.config` and
/// `plugin.allowedHosts`.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    /// What `get-config` reads.
    pub config: Arc<BTreeMap<String, String>>,
    /// The origins `wasi:http` requests may go to (none: no network).
    pub allowed_hosts: Arc<Vec<AllowedOrigin>>,
}

impl HostState {
    /// A fresh sandbox for one instance: no directories, no environment, frozen clocks, stdout
    /// and stderr into `log`, `max_memory_bytes` for all its memories and tables, emits of at
    /// most `max_message_bytes` each.
    pub(super) fn new(
        log: GuestLog,
        max_memory_bytes: u64,
        max_message_bytes: usize,
        grants: &Grants,
    ) -> Self {
        let wasi = WasiCtx::builder()
            .stdout(GuestOutput::new(log.clone(), false))
            .stderr(GuestOutput::new(log.clone(), true))
            .wall_clock(FrozenClock)
            .monotonic_clock(FrozenClock)
            .build();
        Self {
            wasi,
            table: ResourceTable::new(),
            limiter: Limiter::new(max_memory_bytes),
            http_hooks: HttpHooks::new(grants.allowed_hosts.clone(), log.clone()),
            log,
            config: grants.config.clone(),
            emits: EmitBuffer::new(max_message_bytes),
            http_ctx: wasmtime_wasi_http::WasiHttpCtx::new(),
            deadline: Instant::now(),
        }
    }

    /// The store's resource limiter (`Store::limiter`).
    pub(super) fn limiter(&mut self) -> &mut dyn ResourceLimiter {
        &mut self.limiter
    }

    /// Whether the budget refused a growth: a trap that follows is the memory cap, not a bug.
    pub(super) fn memory_refused(&self) -> bool {
        self.limiter.refused
    }

    /// Sets when the call starting now (or the instantiation) must end: no wait in the host, an
    /// outbound request's included, lasts longer.
    pub(super) fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = deadline;
        self.http_hooks.deadline = deadline;
    }

    /// What the bounded `wasi:io` bindings (`waits`) work on.
    pub(super) fn waits(&mut self) -> Waits<'_> {
        Waits {
            table: &mut self.table,
            deadline: self.deadline,
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http_ctx,
            table: &mut self.table,
            hooks: &mut self.http_hooks,
        }
    }
}

/// What the bounded `wasi:io` bindings (`waits`) see of a store.
pub(super) struct Waits<'a> {
    /// The store's resources (pollables and streams among them).
    pub(super) table: &'a mut ResourceTable,
    /// When the call in progress must end.
    pub(super) deadline: Instant,
}

/// Clocks that never move: the sandbox grants no time beyond the message's timestamp.
struct FrozenClock;

impl wasmtime_wasi::HostWallClock for FrozenClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl wasmtime_wasi::HostMonotonicClock for FrozenClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_covers_every_memory_and_table_of_an_instance_together() {
        let mut l = Limiter::new(1 << 20);
        // Two memories of 512 KiB fit; a third 64 KiB page does not, though each memory alone is
        // under the cap.
        assert!(l.memory_growing(0, 512 << 10, None).unwrap());
        assert!(l.memory_growing(0, 512 << 10, None).unwrap());
        assert!(
            !l.memory_growing(512 << 10, (512 << 10) + 65536, None)
                .unwrap()
        );
        assert!(l.refused);
        let mut l = Limiter::new(1 << 20);
        assert!(l.memory_growing(0, 1 << 19, None).unwrap());
        // Tables count too: 65,536 elements of 8 bytes are the other half; one more is over.
        assert!(l.table_growing(0, 65536, None).unwrap());
        assert!(!l.table_growing(65536, 65537, None).unwrap());
        assert!(
            !l.table_growing(0, usize::MAX, None).unwrap(),
            "no overflow"
        );
    }
}
