//! The settings of `mmmq serve`: plain values with one source of defaults, checked as a whole.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mmmq_core::TopicConfig;

use super::ConfigError;
use crate::storage::{FileCache, FlushMode, LogConfig};

/// Defaults of `mmmq serve` (docs/operations.md, "`mmmq serve`"): the flags point at these, and
/// [`ServeConfig::new`] uses them, so the two cannot disagree.
pub mod defaults {
    /// `--root-dir`.
    pub const ROOT_DIR: &str = "./mmmq";
    /// `--listen`.
    pub const LISTEN: &str = "127.0.0.1:8080";
    /// `--segment-max-bytes` (64 MiB).
    pub const SEGMENT_MAX_BYTES: u64 = 64 * 1024 * 1024;
    /// `--max-body-bytes` (1 MiB).
    pub const MAX_BODY_BYTES: usize = 1024 * 1024;
    /// `--flush`.
    pub const FLUSH: &str = "group";
    /// `--max-topics`.
    pub const MAX_TOPICS: usize = 100_000;
    /// `--max-connections`.
    pub const MAX_CONNECTIONS: usize = 4096;
    /// `--max-connections-per-ip`: one client host may hold a sixteenth of the default
    /// `--max-connections`, so a single address cannot take every slot.
    pub const MAX_CONNECTIONS_PER_IP: usize = 256;
    /// `--first-byte-timeout-ms`: a new connection that has sent nothing by then is closed.
    pub const FIRST_BYTE_TIMEOUT_MS: u64 = 2_000;
    /// `--max-inflight-body-bytes` (256 MiB): request bodies being received or held, over all
    /// requests.
    pub const MAX_INFLIGHT_BODY_BYTES: usize = 256 * 1024 * 1024;
    /// `--header-timeout-ms`.
    pub const HEADER_TIMEOUT_MS: u64 = 10_000;
    /// `--request-timeout-ms`.
    pub const REQUEST_TIMEOUT_MS: u64 = 60_000;
    /// After a failed write, how long appends are refused before the log recovers in place.
    pub const RETRY_AFTER_MS: u64 = 1_000;
    /// `--retention-check-ms`.
    pub const RETENTION_CHECK_MS: u64 = 60_000;
    /// `--max-produce-ids` (~250 MiB of ids).
    pub const MAX_PRODUCE_IDS: usize = crate::topics::dedup::MAX_IDS;
    /// `--max-groups`.
    pub const MAX_GROUPS: usize = 1_000;
    /// `--max-partitions`: as many as `--max-topics` topics of one partition each, the budget
    /// that cap already allowed (idle, a partition costs about 7 KiB of memory and a few KiB of
    /// disk, docs/benchmarks.md; a busy one up to its tail's positions and 1 MiB of
    /// preallocation), now also for topics of up to 1,024 partitions.
    pub const MAX_PARTITIONS: usize = 100_000;
}

/// The settings of `mmmq serve`: plain values. What runs (the open-file cache, the metrics
/// observer) is built from them by [`crate::broker::Broker::open`].
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Root of everything on disk.
    pub root_dir: PathBuf,
    /// A new segment starts when the tail has reached this many bytes (a soft cap).
    pub segment_max_bytes: u64,
    /// When an append counts as durable.
    pub flush: FlushMode,
    /// After a failed write, how long a log refuses appends before it recovers in place.
    pub retry_after: Duration,
    /// Most segment files held open at once over all topics; `None`: the descriptor limit minus
    /// one per allowed connection and [`FD_RESERVE_BESIDES_CONNECTIONS`] (at least a quarter of
    /// the limit).
    pub max_open_files: Option<usize>,
    /// Largest accepted message body (a batch may carry up to [`BATCH_BODY_FACTOR`] of them).
    pub max_body_bytes: usize,
    /// When set, every endpoint but `/healthz` needs `Authorization: Bearer <token>`.
    pub auth_token: Option<String>,
    /// `Host` names served besides loopback ones (`--allowed-hosts`); when set, or while the
    /// broker listens on a loopback address, any other `Host` is refused (DNS rebinding).
    pub allowed_hosts: Vec<String>,
    /// Cap on the topics producers can create.
    pub max_topics: usize,
    /// Connection and request limits of the HTTP server.
    pub http: HttpLimits,
    /// The configuration of topics without a `topic.json` (`--default-partitions`,
    /// `--default-retention-ms`).
    pub topic_defaults: TopicConfig,
    /// How often retention runs (it also runs at boot).
    pub retention_check: Duration,
    /// Produce ids remembered over every topic; past it a topic forgets its oldest early.
    pub max_produce_ids: usize,
    /// Pull consumer groups held at once; a new group's first poll past it is refused.
    pub max_groups: usize,
    /// Cap on partitions over all topics (creating or growing a topic past it is refused).
    pub max_partitions: usize,
    /// Set when this broker is a cluster member (`--node-id`, `--peers`; docs/cluster.md).
    pub cluster: Option<super::cluster::ClusterSettings>,
    /// Set when it speaks Kafka's protocol too (`--kafka-listen`; docs/kafka.md).
    pub kafka: Option<crate::kafka::KafkaSettings>,
}

/// A batch request may be this many times the single-message body limit.
pub const BATCH_BODY_FACTOR: usize = 32;

/// Limits on what one HTTP client can hold.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// Concurrent connections; more wait in the listen backlog.
    pub max_connections: usize,
    /// Concurrent connections from one client address; past it a connection is answered `503`
    /// and closed.
    pub max_connections_per_ip: usize,
    /// Time a new connection has to send its first byte (capped by `header_read_timeout`).
    pub first_byte_timeout: Duration,
    /// Request body bytes being received or held at once, over all requests; past it a request
    /// is answered `503` with `Retry-After`.
    pub max_inflight_body_bytes: usize,
    /// Time to receive a request's headers, and how long a kept-alive connection may sit idle.
    pub header_read_timeout: Duration,
    /// Largest request head (request line and headers); larger gets 431.
    pub max_header_bytes: usize,
    /// Most header fields in one request.
    pub max_headers: usize,
    /// Time to read the body and answer (above the 30 s a long poll may wait).
    pub request_timeout: Duration,
    /// How long a graceful shutdown waits for requests in flight.
    pub shutdown_grace: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            max_connections: defaults::MAX_CONNECTIONS,
            max_connections_per_ip: defaults::MAX_CONNECTIONS_PER_IP,
            first_byte_timeout: Duration::from_millis(defaults::FIRST_BYTE_TIMEOUT_MS),
            max_inflight_body_bytes: defaults::MAX_INFLIGHT_BODY_BYTES,
            header_read_timeout: Duration::from_millis(defaults::HEADER_TIMEOUT_MS),
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            request_timeout: Duration::from_millis(defaults::REQUEST_TIMEOUT_MS),
            shutdown_grace: Duration::from_secs(35),
        }
    }
}

impl ServeConfig {
    /// Defaults (docs/operations.md, "`mmmq serve`"), rooted at `root_dir`.
    pub fn new(root_dir: impl Into<PathBuf>) -> Self {
        Self {
            root_dir: root_dir.into(),
            segment_max_bytes: defaults::SEGMENT_MAX_BYTES,
            flush: FlushMode::GroupCommit,
            retry_after: Duration::from_millis(defaults::RETRY_AFTER_MS),
            max_open_files: None,
            max_body_bytes: defaults::MAX_BODY_BYTES,
            auth_token: None,
            allowed_hosts: Vec::new(),
            max_topics: defaults::MAX_TOPICS,
            http: HttpLimits::default(),
            topic_defaults: TopicConfig::default(),
            retention_check: Duration::from_millis(defaults::RETENTION_CHECK_MS),
            max_produce_ids: defaults::MAX_PRODUCE_IDS,
            max_groups: defaults::MAX_GROUPS,
            max_partitions: defaults::MAX_PARTITIONS,
            cluster: None,
            kafka: None,
        }
    }

    /// Whether the settings make sense together: every count and time at least 1. The error
    /// names the setting as the command line spells it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = [
            ("--segment-max-bytes", self.segment_max_bytes),
            ("--max-body-bytes", self.max_body_bytes as u64),
            ("--max-connections", self.http.max_connections as u64),
            (
                "--max-connections-per-ip",
                self.http.max_connections_per_ip as u64,
            ),
            (
                "--first-byte-timeout-ms",
                self.http.first_byte_timeout.as_millis() as u64,
            ),
            (
                "--header-timeout-ms",
                self.http.header_read_timeout.as_millis() as u64,
            ),
            (
                "--request-timeout-ms",
                self.http.request_timeout.as_millis() as u64,
            ),
            ("--max-open-files", self.max_open_files.unwrap_or(1) as u64),
            (
                "--retention-check-ms",
                self.retention_check.as_millis() as u64,
            ),
            (
                "--default-retention-ms",
                self.topic_defaults.retention_ms.unwrap_or(1),
            ),
            ("--max-topics", self.max_topics as u64),
            ("--max-partitions", self.max_partitions as u64),
            ("--max-produce-ids", self.max_produce_ids as u64),
            ("--max-groups", self.max_groups as u64),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(ConfigError::Setting {
                    name,
                    reason: "must be at least 1".into(),
                });
            }
        }
        if self.cluster.is_some() && self.flush == FlushMode::NoSync {
            // Raft counts an entry a replica reported flushed; without its fsync a power cut
            // could take back a vote for a commit (docs/cluster.md, "Design").
            return Err(ConfigError::Setting {
                name: "--flush",
                reason: "a cluster member acknowledges only what is durable: not `none`".into(),
            });
        }
        let partitions = self.topic_defaults.partitions;
        let max = mmmq_core::MAX_PARTITIONS;
        if !(1..=max).contains(&partitions) {
            return Err(ConfigError::Setting {
                name: "--default-partitions",
                reason: format!("must be 1–{max}, got {partitions}"),
            });
        }
        if self.max_body_bytes > crate::storage::frame::MAX_PAYLOAD_LEN / 2 {
            return Err(ConfigError::Setting {
                name: "--max-body-bytes",
                reason: format!(
                    "must be at most {} (half the largest stored entry)",
                    crate::storage::frame::MAX_PAYLOAD_LEN / 2
                ),
            });
        }
        // A body the broker accepts must fit in the budget on its own, or it could never pass.
        let largest = self
            .max_body_bytes
            .saturating_mul(BATCH_BODY_FACTOR)
            .max(crate::plugin::store::MAX_PLUGIN_BYTES);
        if self.http.max_inflight_body_bytes < largest {
            return Err(ConfigError::Setting {
                name: "--max-inflight-body-bytes",
                reason: format!(
                    "must be at least {largest}, the largest request body accepted (a batch of \
                     32 × --max-body-bytes, or a 64 MiB plugin upload)"
                ),
            });
        }
        Ok(())
    }

    /// `{root-dir}/dispatchers.json`.
    pub fn dispatchers_file(&self) -> PathBuf {
        self.root_dir.join("dispatchers.json")
    }

    /// `{root-dir}/topics`.
    pub fn topics_dir(&self) -> PathBuf {
        self.root_dir.join("topics")
    }

    /// Uses `flush` for every log.
    pub fn with_flush(mut self, flush: FlushMode) -> Self {
        self.flush = flush;
        self
    }

    /// The segment-file cache these settings ask for (one per broker, shared by every log).
    pub fn file_cache(&self) -> Arc<FileCache> {
        match self.max_open_files {
            Some(n) => FileCache::new(n),
            // Kafka's listener has a `--max-connections` of its own.
            None => FileCache::for_process(
                self.http.max_connections as u64 * (1 + u64::from(self.kafka.is_some()))
                    + FD_RESERVE_BESIDES_CONNECTIONS,
            ),
        }
    }

    /// How every log writes, with the broker's file cache and commit observer.
    pub fn log_config(
        &self,
        files: Arc<FileCache>,
        on_commit: Option<crate::storage::log::CommitObserver>,
    ) -> LogConfig {
        LogConfig {
            segment_max_bytes: self.segment_max_bytes,
            flush: self.flush,
            retry_after: self.retry_after,
            files,
            on_commit,
            ..LogConfig::default()
        }
    }
}

/// Descriptors `serve` leaves outside the segment-file cache besides one per connection:
/// checkpoints being written, plugin files, the runtime's own.
pub const FD_RESERVE_BESIDES_CONNECTIONS: u64 = 512;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_settings_out_of_range_are_refused_by_their_flag() {
        assert!(ServeConfig::new("/x").validate().is_ok());
        let mut c = ServeConfig::new("/x");
        c.http.max_connections = 0;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "--max-connections: must be at least 1"
        );
        let mut c = ServeConfig::new("/x");
        c.max_open_files = Some(0);
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .starts_with("--max-open-files")
        );
        let mut c = ServeConfig::new("/x");
        c.max_partitions = 0;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "--max-partitions: must be at least 1"
        );
        for (name, zero) in [
            (
                "--max-produce-ids",
                (|c| c.max_produce_ids = 0) as fn(&mut ServeConfig),
            ),
            ("--max-groups", |c| c.max_groups = 0),
        ] {
            let mut c = ServeConfig::new("/x");
            zero(&mut c);
            assert_eq!(
                c.validate().unwrap_err().to_string(),
                format!("{name}: must be at least 1")
            );
        }
        let mut c = ServeConfig::new("/x");
        c.max_body_bytes = 64 << 20;
        assert!(c.validate().unwrap_err().to_string().contains("at most"));
        // The budget must hold the largest body: a batch of 32 × 16 MiB does not fit in 256 MiB.
        let mut c = ServeConfig::new("/x");
        c.max_body_bytes = 16 << 20;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .starts_with("--max-inflight-body-bytes: must be at least 536870912")
        );
        c.http.max_inflight_body_bytes = 512 << 20;
        assert!(c.validate().is_ok());
    }
}
