//! Types every part of mmmq agrees on: what a topic name may be, how a dispatcher's pattern selects
//! topics, what is stored for a message and what a consumer receives.
//!
//! # Layout
//! - [`topic`]: [`Topic`] and [`ConsumerId`], validated names that are safe to use as file names.
//! - [`pattern`]: [`TopicPattern`], the word-wise wildcard a dispatcher subscribes with.
//! - [`message`]: [`StoredMessage`] (the payload of a log entry) and [`Envelope`] (what consumers see).
//! - [`record`]: what a Kafka record carries beyond JSON, and the binary payload it is stored as.
//! - [`ack`]: [`Ack`], the one-bit answer of a broker or a consumer.
//! - [`status`]: what the broker reports about itself (topic list, dispatcher status, reloads).
//! - [`handler`]: [`Message`], a typed envelope, and the handler shape shared by the push
//!   consumer of `mmmq-client` and the broker's in-process handlers.
//!
//! The crate has no I/O and no runtime: the broker, the clients and the plugin SDK all depend on
//! it.
#![deny(missing_docs)]

pub mod ack;
pub mod cluster;
pub mod handler;
pub mod message;
mod message_serde;
pub mod partition;
pub mod pattern;
pub mod plugins;
pub mod record;
pub mod status;
pub mod topic;
pub mod topic_id;

pub use ack::Ack;
pub use handler::{ErasedHandler, HandlerFuture, Message, erase};
pub use message::{
    ContentShape, Envelope, MAX_CONTENT_DEPTH, Origin, PayloadError, StoredMessage, content_shape,
    now_ms, write_produced_payload,
};
pub use partition::{MAX_PARTITIONS, murmur2, partition_for_key};
pub use pattern::{PatternError, TopicPattern};
pub use plugins::{Deployed, PluginListing, VersionInfo};
pub use record::{BinaryParts, Header};
pub use status::{
    DEFAULT_RETENTION_MS, DispatcherStatus, GroupMember, GroupPartition, GroupPoll, GroupStatus,
    HostHealth, PartitionInfo, PullPage, RedriveNext, RedrivePartition, RedriveStatus,
    ReloadReport, ShadowStatus, TargetStatus, TopicConfig, TopicDetail, TopicInfo, TopicPartition,
    TopicStatus,
};
pub use topic::{ConsumerId, MAX_CONSUMER_ID_LEN, NameError, Topic};
pub use topic_id::{BadTopicId, TopicId};

/// An error and its causes on one line ("error sending request: connection refused …"): an HTTP
/// client's own message hides the cause that tells a user what to fix.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}
