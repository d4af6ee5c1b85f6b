//! What the broker reports about itself, as its HTTP API answers it: the topic list, dispatcher
//! status and what a reload changed. The broker builds these, `mmmq-client` reads them back as
//! the same types, so the two cannot drift apart.

use serde::{Deserialize, Serialize};

use crate::Envelope;

/// A topic as `GET /mmmq/topics` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopicInfo {
    /// The name.
    pub name: String,
    /// The offset the next message will get.
    pub next_offset: u64,
    /// Segment files.
    pub segments: u64,
    /// Stored bytes.
    pub bytes: u64,
}

/// A page of a pull (`GET /mmmq/topics/{topic}/messages`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PullPage {
    /// Envelopes in offset order; a corrupt entry is left out (the gap in offsets shows it).
    pub messages: Vec<Envelope>,
    /// Where the next pull starts.
    pub next: u64,
}

/// What `GET /mmmq/dispatchers` shows of a target.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum TargetStatus {
    /// A remote consumer.
    Host {
        /// Where it POSTs.
        url: String,
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
    },
    /// A kind of target this version does not know (a newer broker's).
    #[serde(other)]
    Other,
}

/// What a reload changed.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq, Eq)]
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
}

/// Status of one dispatcher on one topic.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TopicStatus {
    /// The topic.
    pub topic: String,
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
    /// Communication failures retried.
    pub retries: u64,
    /// The last problem on this topic.
    pub last_error: Option<String>,
}

/// Status of one dispatcher (`GET /mmmq/dispatchers`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
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
    /// Most time between checkpoint writes while positions keep coming.
    pub checkpoint_interval_ms: u64,
    /// Sum over topics.
    pub delivered: u64,
    /// Sum over topics.
    pub nacked: u64,
    /// Sum over topics.
    pub dead_lettered: u64,
    /// Sum over topics.
    pub lag: u64,
    /// The most recent problem on any topic.
    pub last_error: Option<String>,
    /// Per topic.
    pub topics: Vec<TopicStatus>,
}
