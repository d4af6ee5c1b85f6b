//! `mmmq plugin replay` (docs/plugins.md, "Replay"): runs a plugin dispatcher's plugin on one stored
//! message, offline, as the dispatcher ran it, and says what happened.
//!
//! - The message is read from the partition's files without changing a byte
//!   ([`crate::inspect::read_entry`]), so a broker may be running on the same root dir.
//! - The version is the one that last handled the message, by the record the dispatcher keeps
//!   beside its checkpoint ([`crate::handled`]), unless `--version` names another. A dispatcher
//!   with `plugin.name` runs it from the plugin store's kept versions; one with `plugin.path` from
//!   the versions it kept as it loaded them ([`crate::plugin::kept::keep_loaded`]).
//! - The limits and `plugin.config` are the dispatcher's, from `dispatchers.json`. The sandbox is
//!   the broker's, with no network unless `--allow-http` gives the dispatcher's
//!   `plugin.allowedHosts`. Emits are shown, not appended.
//! - A fault comes with its WebAssembly backtrace, with source lines when the component carries
//!   debug info.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use mmmq_core::{StoredMessage, Topic};
use serde::Serialize;

use crate::config::{DispatcherSpec, PluginSpec, TargetSpec, parse_dispatchers};
use crate::handled;
use crate::inspect::{Entry, read_entry};
use crate::plugin::kept::{is_version, kept_files, loaded_dir, version_file};
use crate::plugin::runtime::{Call, Instance, Limits, Verdict, version_of};
use crate::plugin::{Grants, GuestLog, PluginEngine, PluginError};
use crate::storage::{Checkpoints, OsFs, Vfs};
use crate::topics::partition::partition_dir;

/// What to replay.
#[derive(Debug, Clone)]
pub struct ReplayRequest {
    /// The broker's root dir.
    pub root_dir: PathBuf,
    /// The dispatcher's consumerId.
    pub consumer: String,
    /// The message's topic.
    pub topic: String,
    /// Its partition.
    pub partition: u32,
    /// Its offset.
    pub offset: u64,
    /// Run this version instead of the one that handled the message.
    pub version: Option<String>,
    /// Give the plugin the dispatcher's `plugin.allowedHosts`.
    pub allow_http: bool,
    /// The `attempt` the call is told (1 unless asked).
    pub attempt: u32,
    /// The broker's `--max-body-bytes`, which bounds what a plugin may emit.
    pub max_body_bytes: usize,
}

/// Why nothing could be replayed (a plugin's fault is a result, not this).
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// `dispatchers.json` cannot be read or is invalid.
    #[error("{0}")]
    Config(String),
    /// No such dispatcher, or not a plugin dispatcher.
    #[error("{0}")]
    Dispatcher(String),
    /// The message is not there.
    #[error("{0}")]
    Message(String),
    /// The version to run cannot be known or found.
    #[error("{0}")]
    Version(String),
    /// The component cannot be loaded.
    #[error(transparent)]
    Plugin(#[from] PluginError),
}

/// What the replay did.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Replayed {
    /// The dispatcher.
    pub consumer: String,
    /// The message, as the plugin got it.
    pub topic: String,
    /// Its partition.
    pub partition: u32,
    /// Its offset.
    pub offset: u64,
    /// Its key.
    pub key: Option<String>,
    /// The version run.
    pub version: String,
    /// Why that version: `recorded` (it handled the message) or `asked` (`--version`).
    pub version_from: &'static str,
    /// The world it implements.
    pub world: String,
    /// `ack`, `nack`, `retry-after(ms)`, `dead-letter(reason)`; absent after a fault.
    pub verdict: Option<String>,
    /// The fault, with its WebAssembly backtrace.
    pub fault: Option<String>,
    /// What the call emitted (kept only when it answered `ack`, as in the broker).
    pub emits: Vec<serde_json::Value>,
    /// The plugin's log lines and output, as `__logs.<consumerId>` would have them.
    pub logs: Vec<serde_json::Value>,
    /// How long the call took.
    pub elapsed_ms: f64,
}

/// Replays one message. Blocking (compiles the component).
pub fn replay(req: &ReplayRequest) -> Result<Replayed, ReplayError> {
    let spec = dispatcher(&req.root_dir, &req.consumer)?;
    let TargetSpec::Plugin(plugin) = &spec.target else {
        return Err(ReplayError::Dispatcher(format!(
            "dispatcher {:?} does not run a plugin",
            req.consumer
        )));
    };
    let topic = Topic::new(&req.topic)
        .map_err(|e| ReplayError::Message(format!("bad topic name {:?}: {e}", req.topic)))?;
    let dir = partition_dir(
        &req.root_dir.join("topics").join(topic.as_str()),
        req.partition,
    );
    let vfs: Arc<dyn Vfs> = Arc::new(OsFs);
    let message = read_message(&*vfs, &dir, req)?;
    let (version, version_from) = match &req.version {
        Some(v) => (v.clone(), "asked"),
        None => {
            let raw = Checkpoints::new(dir.join("checkpoints"), vfs.clone())
                .read_beside(&spec.consumer_id, handled::EXT)
                .map_err(|e| ReplayError::Version(e.to_string()))?
                .unwrap_or_default();
            let lines = handled::parse(&raw);
            let v = handled::version_for(&lines, req.offset, message.key.as_deref()).ok_or_else(|| {
                ReplayError::Version(format!(
                    "{:?} has no record of handling offset {} of {} partition {} (not handled yet, handled before this broker kept records, or by a redrive): name one with --version",
                    req.consumer, req.offset, req.topic, req.partition
                ))
            })?;
            (v, "recorded")
        }
    };
    let bytes = component(&req.root_dir, &req.consumer, plugin, &version)?;
    let engine = PluginEngine::with_backtrace_details()?;
    let compiled = engine.compile(&bytes)?;
    let (sink, mut lines) = tokio::sync::mpsc::channel(4096);
    let log = GuestLog::new(spec.consumer_id.as_str(), Some(sink));
    let grants = Grants {
        config: plugin.config.clone(),
        allowed_hosts: if req.allow_http {
            plugin.allowed_hosts.clone()
        } else {
            Arc::default()
        },
    };
    let limits = Limits {
        max_memory_bytes: plugin.max_memory_bytes,
        timeout: plugin.timeout,
        max_message_bytes: req.max_body_bytes,
    };
    let call = Call {
        topic: req.topic.clone(),
        partition: req.partition,
        offset: req.offset,
        timestamp: message.timestamp,
        key: message.key.clone(),
        id: message.id.clone(),
        attempt: req.attempt,
        content: message.content.get().to_owned(),
    };
    let started = Instant::now();
    let (verdict, emits) = match Instance::new(&engine, &compiled, limits, &log, &grants) {
        Ok(mut instance) => {
            let verdict = instance.handle(&call);
            (verdict, instance.take_emits())
        }
        Err(e) => (Err(e), Vec::new()),
    };
    let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
    let mut logs = Vec::new();
    while let Ok(record) = lines.try_recv() {
        logs.push(serde_json::from_str(&record.json).unwrap_or(serde_json::Value::Null));
    }
    Ok(Replayed {
        consumer: req.consumer.clone(),
        topic: req.topic.clone(),
        partition: req.partition,
        offset: req.offset,
        key: message.key,
        version,
        version_from,
        world: compiled.world.to_owned(),
        verdict: verdict.as_ref().ok().map(say),
        fault: verdict.err().map(|e| e.to_string()),
        emits: emits
            .iter()
            .map(|e| {
                serde_json::json!({
                    "topic": e.topic().as_str(),
                    "key": e.key(),
                    "content": e.content(),
                })
            })
            .collect(),
        logs,
        elapsed_ms,
    })
}

fn say(verdict: &Verdict) -> String {
    match verdict {
        Verdict::Ack => "ack".into(),
        Verdict::Nack => "nack".into(),
        Verdict::RetryAfter(ms) => format!("retry-after({ms} ms)"),
        Verdict::DeadLetter(reason) => format!("dead-letter({reason})"),
    }
}

fn dispatcher(root_dir: &Path, consumer: &str) -> Result<DispatcherSpec, ReplayError> {
    let path = root_dir.join("dispatchers.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| ReplayError::Config(format!("cannot read {}: {e}", path.display())))?;
    let specs = parse_dispatchers(&text, &path, root_dir)
        .map_err(|e| ReplayError::Config(e.to_string()))?;
    let names: Vec<&str> = specs.iter().map(|s| s.consumer_id.as_str()).collect();
    specs
        .iter()
        .find(|s| s.consumer_id.as_str() == consumer)
        .cloned()
        .ok_or_else(|| {
            ReplayError::Dispatcher(format!(
                "no dispatcher {consumer:?} in {} (there are: {})",
                path.display(),
                names.join(", ")
            ))
        })
}

fn read_message(
    vfs: &dyn Vfs,
    dir: &Path,
    req: &ReplayRequest,
) -> Result<StoredMessage, ReplayError> {
    let at = format!(
        "offset {} of {} partition {}",
        req.offset, req.topic, req.partition
    );
    if !vfs.is_dir(dir) {
        return Err(ReplayError::Message(format!(
            "no {} partition {} under {}",
            req.topic,
            req.partition,
            req.root_dir.display()
        )));
    }
    match read_entry(vfs, dir, req.offset).map_err(|e| ReplayError::Message(e.to_string()))? {
        Entry::Payload(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| ReplayError::Message(format!("{at} is not a stored message: {e}"))),
        Entry::Missing { first, next } => Err(ReplayError::Message(format!(
            "no message at {at}: it holds offsets {first} to {}",
            next.saturating_sub(1)
        ))),
        Entry::Corrupt(why) => Err(ReplayError::Message(format!("{at} is damaged: {why}"))),
    }
}

/// The bytes of `version` of the plugin of `consumer`'s dispatcher: a kept version of its
/// `plugin.name`, or of what its `plugin.path` loaded (or the file there, for a version loaded
/// before the broker kept them).
fn component(
    root_dir: &Path,
    consumer: &str,
    plugin: &PluginSpec,
    version: &str,
) -> Result<Vec<u8>, ReplayError> {
    if !is_version(version) {
        return Err(ReplayError::Version(format!(
            "{version:?} is not a version (16 hex digits, as `mmmq plugin list` shows)"
        )));
    }
    let (dir, whose) = match &plugin.name {
        Some(name) => (
            root_dir.join("plugins").join(name),
            format!("plugin {name:?}"),
        ),
        None => (
            loaded_dir(root_dir, consumer),
            format!("dispatcher {consumer:?}"),
        ),
    };
    if let Ok(bytes) = std::fs::read(version_file(&dir, version)) {
        return Ok(bytes);
    }
    if plugin.name.is_none()
        && let Ok(bytes) = std::fs::read(&plugin.path)
        && version_of(&bytes) == version
    {
        return Ok(bytes);
    }
    Err(ReplayError::Version(format!(
        "{whose} does not keep version {version} (kept: {})",
        kept_files(&OsFs, &dir).join(", ")
    )))
}
