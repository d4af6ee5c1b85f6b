//! WebAssembly handlers (docs/plugins.md, "WebAssembly handlers").
//!
//! # Layout
//! - [`runtime`]: the engine, compilation, the instance and its time limit.
//! - `worlds`: the two WIT worlds served (0.1.0 and 0.2.0) behind one call and one verdict.
//! - `host`: what an instance's store carries: the sandbox, its memory budget, its grants.
//! - `waits`: `wasi:io` whose every wait in the host ends at the call's deadline.
//! - `error`: [`PluginError`], why a component cannot be used or a call failed.
//! - [`store`]: deployed plugins and their kept versions (`{root-dir}/plugins/{name}/`).
//! - [`kept`]: a directory of kept versions, a deployed plugin's or what a `plugin.path`
//!   dispatcher loaded (`{root-dir}/plugins/.path/{consumerId}/`), for `mmmq plugin replay`.
//! - [`tools`]: `mmmq plugin check`.
//! - [`scaffold`]: `mmmq plugin new`, a plugin crate that builds anywhere.
//! - [`emit_buffer`]: what a call emits, checked and held until its verdict is known.
//! - `http`: outbound `wasi:http` limited to `plugin.allowedHosts` and the call's time.
//! - `guest_log`: a guest's log lines and stdout/stderr into `tracing`, rate-limited.
//!
//! Imports go one way: `runtime` uses `worlds`, `waits` and `host`, `worlds` and `waits` use
//! `host`, `host` uses `http`, `guest_log` and `emit_buffer`, and none of these uses one above it;
//! `error` is below them all.
//!
//! The dispatcher target that runs plugins, with instance reuse and hot reload, is
//! [`crate::dispatch::targets::wasm`]: this module knows nothing of dispatchers.

pub mod emit_buffer;
mod error;
mod guest_log;
mod host;
mod http;
pub mod kept;
pub mod runtime;
pub mod scaffold;
pub mod store;
pub mod tools;
mod waits;
mod worlds;

pub use guest_log::{GuestLog, LineContext, LogRecord, LogSink, escape_controls};
pub use runtime::{Compiled, Grants, PluginEngine, PluginError};
pub use worlds::{WORLD_V1, WORLD_V2};

/// The worlds this broker runs, newest first (`mmmq --version` prints them).
pub const SERVED_WORLDS: [&str; 2] = [WORLD_V2, WORLD_V1];
