//! Prometheus metrics (`GET /metrics`), through the `prometheus-client` crate.
//!
//! Counters are updated where things happen; the per-dispatcher lag is a gauge filled in at scrape
//! time from the workers' positions, because it is a difference of two moving numbers.

pub mod kafka;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A topic label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopicLabel {
    /// The topic name.
    pub topic: String,
}

/// A (dispatcher, topic) label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DispatchLabel {
    /// The dispatcher's consumerId.
    pub consumer: String,
    /// The topic name.
    pub topic: String,
    /// The partition.
    pub partition: u32,
}

/// A dispatcher label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConsumerLabel {
    /// The dispatcher's consumerId.
    pub consumer: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 100 µs to ~100 s.
    Histogram::new(exponential_buckets(0.0001, 2.0, 21))
}

/// Every metric the broker exports.
pub struct Metrics {
    registry: Registry,
    /// Messages durably appended, by topic.
    pub messages_in: Family<TopicLabel, Counter>,
    /// Payload bytes durably appended, by topic.
    pub bytes_in: Family<TopicLabel, Counter>,
    /// Group commits (one data fsync and one index fsync each).
    pub commits: Counter,
    /// Entries per group commit.
    pub commit_size: Histogram,
    /// Messages a consumer acknowledged.
    pub delivered: Family<DispatchLabel, Counter>,
    /// NACK answers.
    pub nacked: Family<DispatchLabel, Counter>,
    /// Communication failures that led to a retry.
    pub retries: Family<DispatchLabel, Counter>,
    /// Messages moved to a dead-letter topic.
    pub dead_lettered: Family<DispatchLabel, Counter>,
    /// Corrupt entries skipped by dispatchers.
    pub corrupt_skipped: Family<DispatchLabel, Counter>,
    /// Messages retention deleted before a dispatcher delivered them.
    pub skipped: Family<DispatchLabel, Counter>,
    /// Messages an at-most-once dispatcher dropped after a communication failure.
    pub dropped: Family<DispatchLabel, Counter>,
    /// Messages plugins emitted and the broker appended (once each), by dispatcher.
    pub emitted: Family<ConsumerLabel, Counter>,
    /// Segments deleted by retention, by topic.
    pub segments_deleted: Family<TopicLabel, Counter>,
    /// Retention passes over every topic completed (one at boot, then every check interval).
    pub retention_passes: Counter,
    /// Seconds from append to the consumer's ACK.
    pub delivery_latency: HistogramFamily<ConsumerLabel>,
    /// Messages not yet delivered, by dispatcher and topic (filled at scrape).
    pub lag: Family<DispatchLabel, Gauge>,
    /// Segment files open now (filled at scrape): near the cap, topics take turns reopening.
    pub open_segment_files: Gauge,
    /// The cap on open segment files (`--max-open-files`).
    pub max_open_segment_files: Gauge,
    /// Produce ids remembered now, over every topic (filled at scrape).
    pub produce_ids: Gauge,
    /// Their budget (`--max-produce-ids`).
    pub max_produce_ids: Gauge,
    /// Produce ids forgotten before their window ended because the budget was full.
    pub produce_ids_forgotten_early: Counter,
    /// Pull consumer groups held now (filled at scrape).
    pub groups: Gauge,
    /// Their cap (`--max-groups`).
    pub max_groups: Gauge,
    /// First polls of a new group refused at `--max-groups`, and new members past a group's
    /// 1,000.
    pub groups_refused: Counter,
    /// Partitions over all topics now (filled at scrape), against `--max-partitions`.
    pub partitions: Gauge,
    /// The cap on partitions over all topics (`--max-partitions`).
    pub max_partitions: Gauge,
    /// The Kafka listener's.
    pub kafka: kafka::KafkaMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("mmmq");
        let m = Self {
            messages_in: Family::default(),
            bytes_in: Family::default(),
            commits: Counter::default(),
            commit_size: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            delivered: Family::default(),
            nacked: Family::default(),
            retries: Family::default(),
            dead_lettered: Family::default(),
            corrupt_skipped: Family::default(),
            skipped: Family::default(),
            dropped: Family::default(),
            emitted: Family::default(),
            segments_deleted: Family::default(),
            retention_passes: Counter::default(),
            delivery_latency: Family::new_with_constructor(latency_histogram),
            lag: Family::default(),
            open_segment_files: Gauge::default(),
            max_open_segment_files: Gauge::default(),
            produce_ids: Gauge::default(),
            max_produce_ids: Gauge::default(),
            produce_ids_forgotten_early: Counter::default(),
            groups: Gauge::default(),
            max_groups: Gauge::default(),
            groups_refused: Counter::default(),
            partitions: Gauge::default(),
            max_partitions: Gauge::default(),
            kafka: kafka::KafkaMetrics::default(),
            registry: Registry::default(),
        };
        registry.register(
            "messages_in",
            "Messages durably appended",
            m.messages_in.clone(),
        );
        registry.register(
            "bytes_in",
            "Payload bytes durably appended",
            m.bytes_in.clone(),
        );
        registry.register(
            "fsync_batches",
            "Group commits (data fsync + index fsync)",
            m.commits.clone(),
        );
        registry.register(
            "fsync_batch_size",
            "Entries per group commit",
            m.commit_size.clone(),
        );
        registry.register(
            "messages_delivered",
            "Messages acknowledged by a consumer",
            m.delivered.clone(),
        );
        registry.register(
            "messages_nacked",
            "NACK answers from consumers",
            m.nacked.clone(),
        );
        registry.register(
            "delivery_retries",
            "Deliveries retried after a communication failure",
            m.retries.clone(),
        );
        registry.register(
            "messages_dead_lettered",
            "Messages moved to a dead-letter topic",
            m.dead_lettered.clone(),
        );
        registry.register(
            "corrupt_entries_skipped",
            "Corrupt entries skipped by dispatchers",
            m.corrupt_skipped.clone(),
        );
        registry.register(
            "messages_skipped_by_retention",
            "Messages retention deleted before a dispatcher delivered them",
            m.skipped.clone(),
        );
        registry.register(
            "messages_dropped",
            "Messages an at-most-once dispatcher dropped after a communication failure",
            m.dropped.clone(),
        );
        registry.register(
            "messages_emitted",
            "Messages plugins emitted, appended once each",
            m.emitted.clone(),
        );
        registry.register(
            "retention_segments_deleted",
            "Segments deleted by retention",
            m.segments_deleted.clone(),
        );
        registry.register(
            "retention_passes",
            "Retention passes over every topic completed",
            m.retention_passes.clone(),
        );
        registry.register(
            "delivery_latency_seconds",
            "Seconds from append to the consumer's ACK",
            m.delivery_latency.clone(),
        );
        registry.register(
            "dispatcher_lag",
            "Messages not yet delivered, per dispatcher and topic",
            m.lag.clone(),
        );
        registry.register(
            "open_segment_files",
            "Segment files open now",
            m.open_segment_files.clone(),
        );
        registry.register(
            "max_open_segment_files",
            "Cap on open segment files (--max-open-files)",
            m.max_open_segment_files.clone(),
        );
        registry.register(
            "produce_ids",
            "Produce ids remembered now, over every topic",
            m.produce_ids.clone(),
        );
        registry.register(
            "max_produce_ids",
            "Budget of remembered produce ids (--max-produce-ids)",
            m.max_produce_ids.clone(),
        );
        registry.register(
            "produce_ids_forgotten_early",
            "Produce ids forgotten before their window ended because the budget was full",
            m.produce_ids_forgotten_early.clone(),
        );
        registry.register("groups", "Pull consumer groups held", m.groups.clone());
        registry.register(
            "max_groups",
            "Cap on pull consumer groups (--max-groups)",
            m.max_groups.clone(),
        );
        registry.register(
            "groups_refused",
            "First polls refused: a new group past --max-groups, a new member past a group's 1000",
            m.groups_refused.clone(),
        );
        registry.register(
            "partitions",
            "Partitions over all topics",
            m.partitions.clone(),
        );
        registry.register(
            "max_partitions",
            "Cap on partitions over all topics (--max-partitions)",
            m.max_partitions.clone(),
        );
        m.kafka.register(&mut registry);
        Self { registry, ..m }
    }

    /// The Prometheus text exposition, with the HTTP server's metrics and a cluster member's
    /// (`cluster::metrics`) when given.
    pub fn encode(&self, http: Option<&HttpMetrics>, cluster: Option<&Registry>) -> String {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let mut out = String::new();
        encode_registry(&mut out, &self.registry).expect("writing to a String cannot fail");
        if let Some(http) = http {
            encode_registry(&mut out, &http.registry).expect("writing to a String cannot fail");
        }
        if let Some(cluster) = cluster {
            encode_registry(&mut out, cluster).expect("writing to a String cannot fail");
        }
        encode_eof(&mut out).expect("writing to a String cannot fail");
        out
    }

    /// Counts `messages` of `bytes` appended to `topic` (a produce, or a plugin's emits).
    pub fn count_in(&self, topic: &mmmq_core::Topic, messages: u64, bytes: usize) {
        let label = TopicLabel {
            topic: topic.to_string(),
        };
        self.messages_in.get_or_create(&label).inc_by(messages);
        self.bytes_in.get_or_create(&label).inc_by(bytes as u64);
    }

    /// Records one group commit of `entries` entries.
    pub fn observe_commit(&self, entries: u64) {
        self.commits.inc();
        self.commit_size.observe(entries as f64);
    }
}

/// Why the HTTP server refused a request before any handler (docs/http-api.md, "What a web page can do").
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Refusal {
    /// A `Host` that is neither loopback nor allowed (DNS rebinding): `403`.
    Host,
    /// Another site's `Origin` or `Sec-Fetch-Site`: `403`.
    Site,
    /// A missing or wrong bearer token: `401`.
    Token,
    /// A body without the right `Content-Type`: `415`.
    ContentType,
}

impl prometheus_client::encoding::EncodeLabelValue for Refusal {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelValueEncoder,
    ) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        encoder.write_str(match self {
            Self::Host => "host",
            Self::Site => "site",
            Self::Token => "token",
            Self::ContentType => "content_type",
        })
    }
}

/// A refusal label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabel {
    /// Why.
    pub reason: Refusal,
}

/// The HTTP server's metrics: its budgets and what it refused. They exist before the broker has
/// recovered (the server answers from the start), so they live apart from [`Metrics`] and are
/// encoded with it.
pub struct HttpMetrics {
    registry: Registry,
    /// Requests refused before any handler, by reason.
    pub requests_refused: Family<RefusalLabel, Counter>,
    /// Request body bytes being received or held now (`--max-inflight-body-bytes`).
    pub inflight_body_bytes: Gauge,
    /// The body budget itself.
    pub max_inflight_body_bytes: Gauge,
    /// Requests answered `503` because the body budget was used up.
    pub body_budget_refusals: Counter,
    /// Client connections open now.
    pub connections_open: Gauge,
    /// Connections refused (`503`) because their address held `--max-connections-per-ip`.
    pub connections_refused: Counter,
    /// Connections closed because they sent nothing within `--first-byte-timeout-ms`.
    pub connections_silent_closed: Counter,
}

impl HttpMetrics {
    /// Registers every metric; `max_inflight_body_bytes` is the budget's size.
    pub fn new(max_inflight_body_bytes: usize) -> Self {
        let mut registry = Registry::with_prefix("mmmq");
        let m = Self {
            requests_refused: Family::default(),
            inflight_body_bytes: Gauge::default(),
            max_inflight_body_bytes: Gauge::default(),
            body_budget_refusals: Counter::default(),
            connections_open: Gauge::default(),
            connections_refused: Counter::default(),
            connections_silent_closed: Counter::default(),
            registry: Registry::default(),
        };
        m.max_inflight_body_bytes
            .set(max_inflight_body_bytes.min(i64::MAX as usize) as i64);
        registry.register(
            "http_requests_refused",
            "Requests refused before any handler: host (403), site (403), token (401), content_type (415)",
            m.requests_refused.clone(),
        );
        registry.register(
            "http_inflight_body_bytes",
            "Request body bytes being received or held now",
            m.inflight_body_bytes.clone(),
        );
        registry.register(
            "http_max_inflight_body_bytes",
            "Cap on request body bytes in flight (--max-inflight-body-bytes)",
            m.max_inflight_body_bytes.clone(),
        );
        registry.register(
            "http_body_budget_refusals",
            "Requests answered 503 because the body budget was used up",
            m.body_budget_refusals.clone(),
        );
        registry.register(
            "http_connections_open",
            "Client connections open now",
            m.connections_open.clone(),
        );
        registry.register(
            "http_connections_refused",
            "Connections answered 503 because their address held --max-connections-per-ip",
            m.connections_refused.clone(),
        );
        registry.register(
            "http_connections_silent_closed",
            "Connections closed for sending nothing within --first-byte-timeout-ms",
            m.connections_silent_closed.clone(),
        );
        Self { registry, ..m }
    }

    /// Counts one request refused before any handler.
    pub fn refused(&self, reason: Refusal) {
        self.requests_refused
            .get_or_create(&RefusalLabel { reason })
            .inc();
    }
}
