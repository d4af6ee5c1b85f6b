//! WebAssembly handlers (contract §5).
//!
//! # Layout
//! - [`runtime`]: the engine, compilation, the sandboxed instance and its limits.
//! - [`target`]: the `plugin` dispatcher target, instance reuse, and hot reload.
//! - [`tools`]: `mmmq plugin check` and `mmmq plugin new`.
//! - `guest_log`: a guest's log lines and stdout/stderr into `tracing`, rate-limited.

pub(crate) mod guest_log;
pub mod runtime;
pub mod target;
pub mod tools;

pub use runtime::{Compiled, PluginEngine, PluginError};
pub use target::PluginTarget;
