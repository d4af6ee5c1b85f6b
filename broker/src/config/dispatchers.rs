//! `dispatchers.json` (docs/dispatchers.md, "Dispatchers"): the specs of the configured dispatchers.
//!
//! The file is validated strictly and as a whole: any problem refuses the file, and the
//! error names the entry (its position and consumerId) and the field. A broker that starts with a
//! half-understood configuration would deliver messages where nobody meant them to go.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use mmmq_core::{ConsumerId, TopicPattern};
use serde::Deserialize;

pub use super::plugin_spec::{
    DEFAULT_PLUGIN_MEMORY, DEFAULT_PLUGIN_TIMEOUT_MS, PluginSpec, ShadowSpec,
};
use super::plugin_spec::{RawPlugin, plugin_spec};
use super::{ConfigError, positive_ms};

/// Where a dispatcher delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetSpec {
    /// A remote HTTP consumer (docs/dispatchers.md, "Dispatchers").
    Host(HostSpec),
    /// A fleet of remote HTTP consumers serving one dispatcher: lanes are spread over them.
    Hosts(Vec<HostSpec>),
    /// A local WebAssembly component (docs/plugins.md, "WebAssembly handlers").
    Plugin(PluginSpec),
    /// A Rust handler registered in-process by an application embedding the broker (never from
    /// `dispatchers.json`).
    InProcess,
}

/// A remote consumer's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSpec {
    /// `http` or `https`.
    pub https: bool,
    /// Host name or IP.
    pub address: String,
    /// TCP port.
    pub port: u16,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Sent as `Authorization: Bearer <token>` to the consumer, when set.
    pub auth_token: Option<String>,
}

impl HostSpec {
    /// The URL the broker POSTs to: `{protocol}://{address}:{port}/mmmq/messages`.
    pub fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        let host = if self.address.contains(':') && !self.address.starts_with('[') {
            format!("[{}]", self.address) // an IPv6 literal
        } else {
            self.address.clone()
        };
        format!("{scheme}://{host}:{}/mmmq/messages", self.port)
    }
}

/// What a dispatcher promises about repeats and losses (`delivery`, docs/delivery.md, "Delivery modes").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeliveryMode {
    /// The position moves after the answer: a crash may deliver a message again, nothing is lost.
    #[default]
    AtLeastOnce,
    /// The position moves (durably) before the message is sent: nothing is ever sent twice; a
    /// failure drops the message, a NACK dead-letters it at once, a crash may lose what was
    /// claimed but not yet sent.
    AtMostOnce,
}

impl DeliveryMode {
    /// The name in `dispatchers.json` and in status.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AtLeastOnce => "at-least-once",
            Self::AtMostOnce => "at-most-once",
        }
    }
}

/// One validated dispatcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DispatcherSpec {
    /// Unique id; names the checkpoint file and the dead-letter topic.
    pub consumer_id: ConsumerId,
    /// Which topics it receives.
    pub pattern: TopicPattern,
    /// Where it delivers.
    pub target: TargetSpec,
    /// Resends after a NACK before the message is dead-lettered.
    pub max_nack_retries: u32,
    /// Messages per delivery (host targets).
    pub batch_max_messages: usize,
    /// Requests in flight per (topic, partition): messages go to this many lanes by key, each
    /// lane one request at a time in offset order (`maxInFlight`, docs/dispatchers.md, "Dispatchers").
    pub max_in_flight: usize,
    /// Positions ACKed within this long of a checkpoint write go out together in the next one:
    /// the redelivery window after a crash, traded against fsyncs (`checkpointIntervalMs`).
    pub checkpoint_interval: Duration,
    /// At-least-once (the default) or at-most-once (`delivery`).
    pub delivery: DeliveryMode,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawDispatcher {
    consumer_id: String,
    pattern: String,
    host: Option<RawHost>,
    hosts: Option<Vec<RawHost>>,
    plugin: Option<RawPlugin>,
    max_nack_retries: Option<u32>,
    batch_max_messages: Option<u64>,
    checkpoint_interval_ms: Option<u64>,
    max_in_flight: Option<u64>,
    delivery: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawHost {
    protocol: String,
    address: String,
    port: u16,
    timeout_ms: Option<u64>,
    auth_token: Option<String>,
}

/// Defaults of `dispatchers.json` (docs/dispatchers.md, "Dispatchers").
pub const DEFAULT_HOST_TIMEOUT_MS: u64 = 30_000;
/// Default NACK resends.
pub const DEFAULT_MAX_NACK_RETRIES: u32 = 3;
/// Most hosts in a fleet.
pub const MAX_HOSTS: usize = 64;
/// Upper bound for `maxInFlight`.
pub const MAX_IN_FLIGHT: u64 = 1024;
/// Upper bound for `batchMaxMessages`.
pub const MAX_BATCH_MESSAGES: u64 = 1000;
/// Default `checkpointIntervalMs`: a busy consumer costs at most 20 checkpoint writes a second.
pub const DEFAULT_CHECKPOINT_INTERVAL_MS: u64 = 50;
/// Upper bound for `checkpointIntervalMs` (a minute of ACKs to redeliver after a crash).
pub const MAX_CHECKPOINT_INTERVAL_MS: u64 = 60_000;

/// Reads and validates `{root-dir}/dispatchers.json`, creating it as `[]` when it is missing.
/// Blocking.
pub fn load_dispatchers(root_dir: &Path) -> Result<Vec<DispatcherSpec>, ConfigError> {
    if let Some(specs) = read_dispatchers(root_dir)? {
        return Ok(specs);
    }
    let path = root_dir.join("dispatchers.json");
    let io = |error| ConfigError::Io {
        path: path.clone(),
        error,
    };
    std::fs::create_dir_all(root_dir).map_err(io)?;
    std::fs::write(&path, "[]\n").map_err(io)?;
    Ok(Vec::new())
}

/// Reads and validates `{root-dir}/dispatchers.json`; `None` when there is none. `serve` calls it
/// before it takes the port, so a broken file is one clear line, not a half-started broker.
/// Blocking.
pub fn read_dispatchers(root_dir: &Path) -> Result<Option<Vec<DispatcherSpec>>, ConfigError> {
    let path = root_dir.join("dispatchers.json");
    match std::fs::read_to_string(&path) {
        Ok(text) => parse_dispatchers(&text, &path, root_dir).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(ConfigError::Io { path, error }),
    }
}

/// Validates the text of a `dispatchers.json`; `path` is only used in messages.
pub fn parse_dispatchers(
    text: &str,
    path: &Path,
    root_dir: &Path,
) -> Result<Vec<DispatcherSpec>, ConfigError> {
    let entries: Vec<serde_json::Value> =
        serde_json::from_str(text).map_err(|e| ConfigError::Syntax {
            path: path.to_owned(),
            reason: format!("not a JSON array of dispatchers: {e}"),
        })?;
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(entries.len());
    for (index, value) in entries.into_iter().enumerate() {
        let id = value
            .get("consumerId")
            .and_then(|v| v.as_str())
            .map(|s| format!(" (consumerId {s:?})"))
            .unwrap_or_default();
        let entry_err = |reason: String| ConfigError::Entry {
            path: path.to_owned(),
            index,
            id: id.clone(),
            reason,
        };
        let spec = parse_entry(value, root_dir).map_err(&entry_err)?;
        if !seen.insert(spec.consumer_id.clone()) {
            return Err(entry_err(format!(
                "duplicate consumerId {:?}",
                spec.consumer_id.as_str()
            )));
        }
        out.push(spec);
    }
    Ok(out)
}

fn parse_entry(value: serde_json::Value, root_dir: &Path) -> Result<DispatcherSpec, String> {
    if !value.is_object() {
        return Err(format!("expected an object, found {value}"));
    }
    // The path names the field in nested objects ("host.port: invalid value …").
    let raw: RawDispatcher = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            e.inner().to_string()
        } else {
            format!("{path}: {}", e.inner())
        }
    })?;
    let consumer_id = ConsumerId::new(raw.consumer_id).map_err(|e| e.to_string())?;
    let pattern = TopicPattern::new(raw.pattern).map_err(|e| e.to_string())?;
    let target = match (raw.host, raw.hosts, raw.plugin) {
        (None, None, None) => {
            return Err("has neither `host`, `hosts` nor `plugin`; give exactly one".into());
        }
        (Some(_), Some(_), _) => {
            return Err("has both `host` and `hosts`; give one (`hosts` for a fleet)".into());
        }
        (Some(_), None, Some(_)) | (None, Some(_), Some(_)) => {
            return Err("has both a host and `plugin`; give exactly one".into());
        }
        (Some(h), None, None) => TargetSpec::Host(host_spec(h, "host")?),
        (None, Some(hosts), None) => {
            if hosts.is_empty() || hosts.len() > MAX_HOSTS {
                return Err(format!("`hosts` must list 1 to {MAX_HOSTS} hosts"));
            }
            TargetSpec::Hosts(
                hosts
                    .into_iter()
                    .enumerate()
                    .map(|(i, h)| host_spec(h, &format!("hosts[{i}]")))
                    .collect::<Result<_, _>>()?,
            )
        }
        (None, None, Some(p)) => TargetSpec::Plugin(plugin_spec(p, root_dir)?),
    };
    let batch = raw.batch_max_messages.unwrap_or(1);
    if !(1..=MAX_BATCH_MESSAGES).contains(&batch) {
        return Err(format!(
            "`batchMaxMessages` must be 1 to {MAX_BATCH_MESSAGES}, not {batch}"
        ));
    }
    if batch > 1 && matches!(target, TargetSpec::Plugin(_)) {
        return Err("`batchMaxMessages` applies to host targets only".into());
    }
    let max_in_flight = raw.max_in_flight.unwrap_or(1);
    if !(1..=MAX_IN_FLIGHT).contains(&max_in_flight) {
        return Err(format!(
            "`maxInFlight` must be 1 to {MAX_IN_FLIGHT}, not {max_in_flight}"
        ));
    }
    let max_nack_retries = raw.max_nack_retries.unwrap_or(DEFAULT_MAX_NACK_RETRIES);
    if max_nack_retries > 1000 {
        return Err("`maxNackRetries` must be at most 1000".into());
    }
    let checkpoint_ms = raw
        .checkpoint_interval_ms
        .unwrap_or(DEFAULT_CHECKPOINT_INTERVAL_MS);
    if checkpoint_ms > MAX_CHECKPOINT_INTERVAL_MS {
        return Err(format!(
            "`checkpointIntervalMs` must be 0 to {MAX_CHECKPOINT_INTERVAL_MS}, not {checkpoint_ms}"
        ));
    }
    let delivery = match raw.delivery.as_deref() {
        None | Some("at-least-once") => DeliveryMode::AtLeastOnce,
        Some("at-most-once") => DeliveryMode::AtMostOnce,
        Some(other) => {
            return Err(format!(
                "`delivery` must be \"at-least-once\" or \"at-most-once\", not {other:?}"
            ));
        }
    };
    Ok(DispatcherSpec {
        consumer_id,
        pattern,
        target,
        max_nack_retries,
        batch_max_messages: batch as usize,
        max_in_flight: max_in_flight as usize,
        checkpoint_interval: Duration::from_millis(checkpoint_ms),
        delivery,
    })
}

/// Checks one host object (`host`, or an element of `hosts`, named by `field`).
fn host_spec(h: RawHost, field: &str) -> Result<HostSpec, String> {
    let https = match h.protocol.to_ascii_uppercase().as_str() {
        "HTTP" => false,
        "HTTPS" => true,
        _ => {
            return Err(format!(
                "unknown protocol {:?} in `{field}`; use HTTP or HTTPS",
                h.protocol
            ));
        }
    };
    if h.address.trim().is_empty() || h.address.contains(['/', ' ', '?', '#', '@']) {
        return Err(format!(
            "`{field}.address` {:?} is not a host name or IP address",
            h.address
        ));
    }
    if h.port == 0 {
        return Err(format!("`{field}.port` must be 1 to 65535"));
    }
    Ok(HostSpec {
        https,
        address: h.address,
        port: h.port,
        timeout: positive_ms(
            h.timeout_ms,
            DEFAULT_HOST_TIMEOUT_MS,
            &format!("{field}.timeoutMs"),
        )?,
        auth_token: h.auth_token,
    })
}

#[cfg(test)]
mod tests {

    use super::*;

    fn parse(text: &str) -> Result<Vec<DispatcherSpec>, String> {
        parse_dispatchers(text, Path::new("dispatchers.json"), Path::new("/root"))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_readme_example_parses_with_defaults() {
        let specs = parse(
            r#"[{"consumerId":"order-created","host":{"protocol":"http","address":"consumer-host","port":8080},"pattern":"order.created"},
                {"consumerId":"audit","pattern":"**","plugin":{"path":"plugins/audit.wasm"}}]"#,
        )
        .unwrap();
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[0].max_nack_retries, 3);
        assert_eq!(specs[0].batch_max_messages, 1);
        assert_eq!(specs[0].checkpoint_interval, Duration::from_millis(50));
        match &specs[0].target {
            TargetSpec::Host(h) => {
                assert_eq!(h.url(), "http://consumer-host:8080/mmmq/messages");
                assert_eq!(h.timeout, Duration::from_secs(30));
            }
            other => panic!("{other:?}"),
        }
        match &specs[1].target {
            TargetSpec::Plugin(p) => {
                assert_eq!(p.path, Path::new("/root/plugins/audit.wasm"));
                assert_eq!(p.timeout, Duration::from_secs(1));
                assert_eq!(p.max_memory_bytes, 64 * 1024 * 1024);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_broken_variant_names_the_entry_and_the_problem() {
        let host = r#""host":{"protocol":"HTTP","address":"h","port":1}"#;
        let cases = [
            ("{", "not a JSON array"),
            (r#"{"consumerId":"a"}"#, "not a JSON array"),
            (r#"[1]"#, "entry 0: expected an object"),
            (
                &format!(
                    r#"[{{"consumerId":"a","pattern":"x",{host}}},{{"consumerId":"a","pattern":"y",{host}}}]"#
                ),
                "entry 1 (consumerId \"a\"): duplicate consumerId",
            ),
            (
                r#"[{"consumerId":"a","pattern":"x","host":{"protocol":"FTP","address":"h","port":1}}]"#,
                "unknown protocol \"FTP\"",
            ),
            (
                r#"[{"consumerId":"a","pattern":"x"}]"#,
                "has neither `host`, `hosts` nor `plugin`",
            ),
            (
                &format!(
                    r#"[{{"consumerId":"a","pattern":"x",{host},"plugin":{{"path":"p.wasm"}}}}]"#
                ),
                "has both a host and `plugin`",
            ),
            (
                &format!(r#"[{{"consumerId":"a","pattern":"x",{host},"colour":"red"}}]"#),
                "unknown field `colour`",
            ),
            (
                r#"[{"consumerId":"a","pattern":"x","host":{"protocol":"HTTP","address":"h","port":1,"tls":true}}]"#,
                "unknown field `tls`",
            ),
            (
                &format!(r#"[{{"consumerId":"../etc","pattern":"x",{host}}}]"#),
                "consumerId \"../etc\" contains '/'",
            ),
            (
                &format!(r#"[{{"pattern":"x",{host}}}]"#),
                "missing field `consumerId`",
            ),
            (
                &format!(r#"[{{"consumerId":"a","pattern":"a..b",{host}}}]"#),
                "empty word",
            ),
            (
                &format!(r#"[{{"consumerId":"a","pattern":"x",{host},"batchMaxMessages":0}}]"#),
                "batchMaxMessages",
            ),
            (
                &format!(r#"[{{"consumerId":"a","pattern":"x",{host},"hosts":[]}}]"#),
                "has both `host` and `hosts`",
            ),
            (
                r#"[{"consumerId":"a","pattern":"x","hosts":[]}]"#,
                "`hosts` must list 1 to 64 hosts",
            ),
            (
                r#"[{"consumerId":"a","pattern":"x","hosts":[{"protocol":"HTTP","address":"h","port":1},{"protocol":"FTP","address":"h","port":1}]}]"#,
                "unknown protocol \"FTP\" in `hosts[1]`",
            ),
            (
                &format!(r#"[{{"consumerId":"a","pattern":"x",{host},"maxInFlight":0}}]"#),
                "`maxInFlight` must be 1 to 1024, not 0",
            ),
            (
                &format!(r#"[{{"consumerId":"a","pattern":"x",{host},"maxInFlight":1025}}]"#),
                "`maxInFlight` must be 1 to 1024, not 1025",
            ),
            (
                &format!(
                    r#"[{{"consumerId":"a","pattern":"x",{host},"delivery":"exactly-once"}}]"#
                ),
                "`delivery` must be \"at-least-once\" or \"at-most-once\", not \"exactly-once\"",
            ),
            (
                &format!(r#"[{{"consumerId":"a","pattern":"x",{host},"delivery":1}}]"#),
                "delivery: invalid type",
            ),
            (
                r#"[{"consumerId":"a","pattern":"x","host":{"protocol":"HTTP","address":"h","port":70000}}]"#,
                "port",
            ),
            (
                r#"[{"consumerId":"a","pattern":"x","host":{"protocol":"HTTP","address":"h","port":1,"timeoutMs":0}}]"#,
                "timeoutMs",
            ),
            (
                r#"[{"consumerId":"a","pattern":"x","plugin":{"path":"p.wasm","config":{"n":1}}}]"#,
                "plugin.config.n: invalid type: integer `1`, expected a string",
            ),
            (
                r#"[{"consumerId":"a","pattern":"x","plugin":{"path":"p.wasm","config":["a"]}}]"#,
                "plugin.config: invalid type: sequence, expected a map",
            ),
            (
                r#"[{"consumerId":"a","pattern":"x","plugin":{"path":"p.wasm","allowedHosts":"http://x"}}]"#,
                "plugin.allowedHosts: invalid type: string \"http://x\", expected a sequence",
            ),
            (
                r#"[{"consumerId":"a","pattern":"x","plugin":{"path":"p.wasm","allowedHosts":["https://x","x.com"]}}]"#,
                "`plugin.allowedHosts[1]`: \"x.com\" must start with http:// or https://",
            ),
            (
                r#"[{"consumerId":"a","pattern":"x","plugin":{"path":"p.wasm","name":"p"}}]"#,
                "exactly one of `path` and `name`",
            ),
            (
                r#"[{"consumerId":"a","pattern":"x","plugin":{"timeoutMs":5}}]"#,
                "exactly one of `path` and `name`",
            ),
            (
                r#"[{"consumerId":"a","pattern":"x","plugin":{"name":"../etc"}}]"#,
                "`plugin.name`: bad plugin name",
            ),
            (
                r#"[{"consumerId":"a","pattern":"x","plugin":{"path":"p.wasm","shadow":"0123456789abcdef"}}]"#,
                "`plugin.shadow` names a kept version of a `plugin.name`",
            ),
            (
                r#"[{"consumerId":"a","pattern":"x","plugin":{"name":"p","shadow":"v2"}}]"#,
                "\"v2\" is not a version (16 hex digits)",
            ),
            (
                r#"[{"consumerId":"a","pattern":"x","plugin":{"path":"p.wasm"},"batchMaxMessages":5}]"#,
                "host targets only",
            ),
            (
                &format!(
                    r#"[{{"consumerId":"a","pattern":"x",{host},"checkpointIntervalMs":60001}}]"#
                ),
                "`checkpointIntervalMs` must be 0 to 60000",
            ),
        ];
        for (text, want) in cases {
            let err = parse(text).unwrap_err();
            assert!(err.contains(want), "{text}\n  gave: {err}\n  want: {want}");
            assert!(err.starts_with("dispatchers.json"), "{err}");
        }
    }
}
