//! What the broker reports about itself, as its HTTP API answers it: the topic list, dispatcher
//! status and what a reload changed. The broker builds these, `mmmq-client` reads them back as
//! the same types, so the two cannot drift apart.

use serde::{Deserialize, Serialize};

use crate::Envelope;

/// A topic as `GET /mmmq/topics` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct TopicInfo {
    /// The name.
    pub name: String,
    /// The id of this incarnation of the topic (docs/topics-and-groups.md, "Topics"); absent from a broker that
    /// predates topic ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_id: Option<crate::TopicId>,
    /// The offset the next message will get.
    pub next_offset: u64,
    /// Segment files.
    pub segments: u64,
    /// Stored bytes.
    pub bytes: u64,
    /// Partitions (1 until partitioned topics exist).
    #[serde(default = "one")]
    pub partition_count: u32,
    /// The first offset still stored (partition 0's): retention moves it.
    #[serde(default)]
    pub first_offset: u64,
    /// The topic's retention by time, `None` forever (an extension of the contract's list, so
    /// that `mmmq topics` can show it).
    #[serde(default)]
    pub retention_ms: Option<u64>,
    /// The topic's retention by size per partition, `None` unbounded.
    #[serde(default)]
    pub retention_bytes: Option<u64>,
}

fn one() -> u32 {
    1
}

fn one_usize() -> usize {
    1
}

fn at_least_once() -> String {
    "at-least-once".into()
}

/// A topic's configuration (`topics/{topic}/topic.json`, `PUT /mmmq/topics/{topic}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TopicConfig {
    /// Partitions, 1–1024; may grow, never shrink.
    pub partitions: u32,
    /// Messages older than this are deleted (whole segments); `None` keeps them forever.
    pub retention_ms: Option<u64>,
    /// Per partition, the oldest segments are deleted while more than this is stored.
    pub retention_bytes: Option<u64>,
    /// Retention never deletes what a dispatcher matching the topic has not yet passed.
    pub keep_undelivered: bool,
    /// How long a produce `id` is remembered.
    pub dedup_window_ms: u64,
}

impl Default for TopicConfig {
    /// The contract's defaults (a broker may change `partitions` and `retentionMs` by flags).
    fn default() -> Self {
        Self {
            partitions: 1,
            retention_ms: Some(DEFAULT_RETENTION_MS),
            retention_bytes: None,
            keep_undelivered: false,
            dedup_window_ms: 120_000,
        }
    }
}

/// Fourteen days, seed 004's default retention.
pub const DEFAULT_RETENTION_MS: u64 = 14 * 24 * 60 * 60 * 1000;

/// One partition as `GET /mmmq/topics/{topic}` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct PartitionInfo {
    /// Its number.
    pub partition: u32,
    /// The first offset still stored.
    pub first_offset: u64,
    /// The offset the next message will get.
    pub next_offset: u64,
    /// Segment files.
    pub segments: u64,
    /// Stored bytes.
    pub bytes: u64,
}

/// `GET /mmmq/topics/{topic}` (and the answer to `PUT`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct TopicDetail {
    /// The name.
    pub name: String,
    /// The id of this incarnation of the topic: a topic deleted and created again gets a new
    /// one (docs/topics-and-groups.md, "Topics").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_id: Option<crate::TopicId>,
    /// Every configuration field.
    pub config: TopicConfig,
    /// Each partition.
    pub partitions: Vec<PartitionInfo>,
}

/// A page of a pull (`GET /mmmq/topics/{topic}/messages`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PullPage {
    /// Envelopes in offset order; a corrupt entry is left out (the gap in offsets shows it).
    pub messages: Vec<Envelope>,
    /// Where the next pull starts.
    pub next: u64,
}

/// One host of a fleet, as `GET /mmmq/dispatchers` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct HostHealth {
    /// Where it POSTs.
    pub url: String,
    /// Whether it is taking lanes (`false` while it is resting after a communication failure).
    pub healthy: bool,
    /// Requests it answered (ACK or NACK).
    pub answered: u64,
    /// Communication failures.
    pub failures: u64,
}

/// A shadow version run after the current one on every message (docs/plugins.md, "Deploying plugins by API").
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ShadowStatus {
    /// The shadow version.
    pub version: String,
    /// Messages both versions were given.
    pub compared: u64,
    /// Messages on which the shadow answered as the current version did.
    pub agreed: u64,
    /// Messages on which it answered otherwise (or the current version faulted and it did not).
    pub disagreed: u64,
    /// Messages on which the shadow trapped, timed out or hit its memory cap.
    pub faults: u64,
    /// Why the shadow version cannot run, if it cannot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_error: Option<String>,
}

/// What `GET /mmmq/dispatchers` shows of a target.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "kebab-case")]
// One per dispatcher in a status answer: the plugin variant's size costs nothing worth a box that
// every `match` on it would have to see through.
#[allow(clippy::large_enum_variant)]
pub enum TargetStatus {
    /// A remote consumer.
    Host {
        /// Where it POSTs.
        url: String,
    },
    /// A fleet of remote consumers serving one dispatcher (`hosts`).
    Hosts {
        /// Each host, in configuration order.
        hosts: Vec<HostHealth>,
    },
    /// A Rust handler inside the embedding application.
    InProcess,
    /// A WebAssembly component.
    Plugin {
        /// The component file.
        path: String,
        /// Hash of the version serving now.
        version: Option<String>,
        /// Why the newest file is not serving, if it is not.
        #[serde(rename = "loadError")]
        load_error: Option<String>,
        /// The WIT world of the version serving (`mmmq:plugin/handler@0.1.0` or `@0.2.0`).
        #[serde(default)]
        world: Option<String>,
        /// The deployed plugin it follows (`plugin.name`), if it names one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// The shadow version's comparison (`plugin.shadow`), if it has one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        shadow: Option<ShadowStatus>,
        /// Why the plugin's emits are not being stored right now, if they are not: they are
        /// tried again, and the checkpoint waits for them.
        #[serde(default, rename = "emitError", skip_serializing_if = "Option::is_none")]
        emit_error: Option<String>,
        /// A named plugin (`plugin.name`) with no deployed version yet: nothing is wrong, its
        /// messages wait for the first `mmmq plugin deploy`.
        #[serde(default, rename = "awaitingDeploy", skip_serializing_if = "is_false")]
        awaiting_deploy: bool,
    },
    /// A kind of target this version does not know (a newer broker's).
    #[serde(other)]
    Other,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// What a reload changed.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ReloadReport {
    /// New dispatchers.
    pub added: Vec<String>,
    /// Dispatchers that are gone (their checkpoints stay).
    pub removed: Vec<String>,
    /// Dispatchers whose definition changed (restarted from their checkpoints).
    pub changed: Vec<String>,
    /// Dispatchers left running as they were.
    pub unchanged: Vec<String>,
    /// Plugin dispatchers whose component file changed and now run the new version.
    pub reloaded: Vec<String>,
    /// Plugin dispatchers whose changed component file could not be loaded (the old version
    /// keeps serving).
    pub reload_errors: Vec<String>,
    /// Dispatchers of a named plugin (`plugin.name`) that has no deployed version yet: not an
    /// error, their messages wait for the first deploy.
    #[serde(default)]
    pub awaiting_deploy: Vec<String>,
}

/// Status of one dispatcher on one topic.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct TopicStatus {
    /// The topic.
    pub topic: String,
    /// The partition (status is per partition: each is delivered on its own).
    #[serde(default)]
    pub partition: u32,
    /// Next offset to deliver.
    pub next_offset: u64,
    /// Committed messages not yet delivered.
    pub lag: u64,
    /// Messages ACKed.
    pub delivered: u64,
    /// NACK answers.
    pub nacked: u64,
    /// Messages dead-lettered.
    pub dead_lettered: u64,
    /// Corrupt entries skipped.
    pub corrupt_skipped: u64,
    /// Messages retention deleted before this dispatcher delivered them (it continued at the
    /// first offset still stored).
    #[serde(default)]
    pub skipped: u64,
    /// Communication failures retried.
    pub retries: u64,
    /// Messages an at-most-once dispatcher dropped after a communication failure.
    #[serde(default)]
    pub dropped: u64,
    /// The last problem on this partition.
    pub last_error: Option<String>,
    /// When `lastError` happened (milliseconds since the Unix epoch).
    #[serde(default)]
    pub last_error_at: Option<u64>,
    /// When a later delivery was ACKed (on the lane of `lastError`, with `maxInFlight` > 1): the
    /// problem is over. `null` while it is not.
    #[serde(default)]
    pub last_error_resolved_at: Option<u64>,
    /// In a cluster: the broker that delivers this partition (its leader when it last took
    /// over delivery); its counters are that broker's. Absent on a single broker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered_by: Option<u64>,
}

/// Status of one dispatcher (`GET /mmmq/dispatchers`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct DispatcherStatus {
    /// Its id.
    pub consumer_id: String,
    /// Its pattern.
    pub pattern: String,
    /// Where it delivers.
    pub target: TargetStatus,
    /// NACK resends before dead-lettering.
    pub max_nack_retries: u32,
    /// Messages per delivery.
    pub batch_max_messages: usize,
    /// Requests in flight per partition (lanes).
    #[serde(default = "one_usize")]
    pub max_in_flight: usize,
    /// Most time between checkpoint writes while positions keep coming.
    pub checkpoint_interval_ms: u64,
    /// `"at-least-once"` or `"at-most-once"`.
    #[serde(default = "at_least_once")]
    pub delivery: String,
    /// Sum over topics.
    pub delivered: u64,
    /// Sum over topics.
    pub nacked: u64,
    /// Sum over topics.
    pub dead_lettered: u64,
    /// Sum over topics (at-most-once dispatchers).
    #[serde(default)]
    pub dropped: u64,
    /// Sum over topics.
    pub lag: u64,
    /// The last problem of one of its partitions: the most recent one not resolved, or, when all
    /// are, the most recent one.
    pub last_error: Option<String>,
    /// When `lastError` happened (milliseconds since the Unix epoch).
    #[serde(default)]
    pub last_error_at: Option<u64>,
    /// When `lastError` was resolved, as a partition's is; set only when every partition's is.
    #[serde(default)]
    pub last_error_resolved_at: Option<u64>,
    /// Per topic.
    pub topics: Vec<TopicStatus>,
    /// The last dead-letter redrive since the dispatcher started, running or finished.
    #[serde(default)]
    pub redrive: Option<RedriveStatus>,
    /// Where the next redrive without `from` starts in each partition of the dead-letter topic
    /// (the position the redrives keep): the dead letters below it were redriven. Empty without
    /// dead letters.
    #[serde(default)]
    pub redrive_next: Vec<RedriveNext>,
}

/// One partition of a dead-letter topic: the dead letters below `next` were redriven.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RedriveNext {
    /// The partition of the dead-letter topic.
    pub partition: u32,
    /// The first offset the next redrive without `from` takes.
    pub next: u64,
}

/// A dead-letter redrive (`POST /mmmq/dispatchers/{consumerId}/redrive`): the dead letters of
/// `__dlq.<consumerId>` delivered again to the dispatcher's own target.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RedriveStatus {
    /// Still delivering.
    pub running: bool,
    /// When it was asked for (milliseconds since the Unix epoch).
    pub started_at: u64,
    /// Dead letters redriven so far (delivered, dead-lettered again or dropped).
    pub redriven: u64,
    /// Dead letters still to go.
    pub remaining: u64,
    /// Redriven messages the consumer ACKed.
    pub delivered: u64,
    /// NACK answers during the redrive.
    pub nacked: u64,
    /// Redriven messages that failed again and were dead-lettered again (with their history).
    pub dead_lettered: u64,
    /// Redriven messages dropped after a communication failure (at-most-once dispatchers).
    pub dropped: u64,
    /// The range of each partition of the dead-letter topic, and how far it got.
    pub partitions: Vec<RedrivePartition>,
    /// The last problem, chosen over the partitions as a dispatcher's `lastError` is.
    pub last_error: Option<String>,
    /// When `lastError` happened (milliseconds since the Unix epoch).
    #[serde(default)]
    pub last_error_at: Option<u64>,
    /// When a later redriven message was ACKed: the problem is over.
    #[serde(default)]
    pub last_error_resolved_at: Option<u64>,
}

/// One partition of a redrive: offsets `from`…`to`−1 of the dead-letter topic.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RedrivePartition {
    /// The partition of the dead-letter topic.
    pub partition: u32,
    /// The first offset redriven.
    pub from: u64,
    /// The end (exclusive).
    pub to: u64,
    /// The next offset to redrive.
    pub next: u64,
}

/// A partition of a topic, as group assignments name it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TopicPartition {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// The incarnation of the topic (docs/topics-and-groups.md, "Topics"); a commit that names it is refused
    /// (`409`) once the topic was deleted and created again.
    #[serde(rename = "topicId", default, skip_serializing_if = "Option::is_none")]
    pub topic_id: Option<crate::TopicId>,
}

/// The answer to a group poll (`GET /mmmq/groups/{group}/messages`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GroupPoll {
    /// Messages of the member's partitions, each partition's in offset order.
    pub messages: Vec<Envelope>,
    /// The partitions the member owns now.
    pub assignment: Vec<TopicPartition>,
}

/// A group as `GET /mmmq/groups/{group}` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct GroupStatus {
    /// The group.
    pub group: String,
    /// `"kafka"` for a Kafka consumer group (docs/kafka.md, "Consumer groups"); absent for a
    /// pull group of the HTTP API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// The topic pattern it was created with (the topics it consumes, comma-separated, for a
    /// Kafka group).
    pub pattern: String,
    /// Live members.
    pub members: Vec<GroupMember>,
    /// Every partition the group consumes.
    pub partitions: Vec<GroupPartition>,
}

/// One member of a group.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct GroupMember {
    /// Its name.
    pub member: String,
    /// Milliseconds since its last poll.
    pub last_poll_ms_ago: u64,
    /// How long it may go without polling before it is removed.
    pub session_timeout_ms: u64,
    /// The partitions it owns.
    pub assignment: Vec<TopicPartition>,
}

/// One partition of a group.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct GroupPartition {
    /// The topic.
    pub topic: String,
    /// The incarnation of the topic (docs/topics-and-groups.md, "Topics").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_id: Option<crate::TopicId>,
    /// The partition.
    pub partition: u32,
    /// Its owner, if the group has live members.
    pub owner: Option<String>,
    /// The group's committed next offset.
    pub committed: u64,
    /// The partition's next offset.
    pub next_offset: u64,
    /// `nextOffset − committed`.
    pub lag: u64,
    /// Messages retention deleted before the group read them (docs/topics-and-groups.md, "Retention"), since
    /// the group was last loaded.
    #[serde(default)]
    pub skipped: u64,
}
