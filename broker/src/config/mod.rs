//! Configuration: the `serve` settings (docs/operations.md, "`mmmq serve`") and `dispatchers.json` (docs/dispatchers.md,
//! "Dispatchers").
//!
//! # Layout
//! - [`serve`]: [`ServeConfig`], its defaults (which the flags point at) and its validation.
//! - [`dispatchers`]: the strict `dispatchers.json` loader and the specs it yields.
//! - `plugin_spec`: an entry's `plugin` object ([`PluginSpec`]).
//! - [`allowed_hosts`]: the origins a plugin may call (`plugin.allowedHosts`).
//! - [`cluster`]: `--node-id` and `--peers` of a cluster member.

pub mod allowed_hosts;
pub mod cluster;
pub mod dispatchers;
mod plugin_spec;
pub mod serve;

use std::path::PathBuf;
use std::time::Duration;

pub use allowed_hosts::AllowedOrigin;
pub use dispatchers::*;
pub use serve::*;

/// Why `dispatchers.json` or a `serve` setting was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A `serve` setting is out of range.
    #[error("{name}: {reason}")]
    Setting {
        /// The flag.
        name: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The file could not be read or created.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        error: std::io::Error,
    },
    /// The file is not a JSON array.
    #[error("{path}: {reason}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        reason: String,
    },
    /// One entry is wrong.
    #[error("{path}: entry {index}{id}: {reason}")]
    Entry {
        /// The file.
        path: PathBuf,
        /// Position of the entry in the array, from 0.
        index: usize,
        /// ` (consumerId "…")` when the entry has a readable id.
        id: String,
        /// What is wrong.
        reason: String,
    },
}

/// A duration field in milliseconds: `default` when absent, 1 ms to an hour.
fn positive_ms(v: Option<u64>, default: u64, field: &str) -> Result<Duration, String> {
    match v.unwrap_or(default) {
        0 => Err(format!("`{field}` must be at least 1")),
        ms if ms > 3_600_000 => Err(format!("`{field}` must be at most 3600000 (one hour)")),
        ms => Ok(Duration::from_millis(ms)),
    }
}
