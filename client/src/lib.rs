//! Rust clients for an mmmq broker, over its HTTP API (docs/http-api.md, "HTTP API" and "Dispatchers").
//!
//! - [`Producer`]: produce one message or a batch with typed content; retries on NACK (503) and on
//!   connection failures with backoff; keep-alive connection pool; errors you can match on.
//! - [`Consumer`]: an HTTP server speaking the consumer side of the protocol; handlers registered
//!   by topic pattern with typed content; `Ok` is an ACK, `Err` a NACK.
//! - [`PullConsumer`]: read a topic from an offset with long polling, as a [`futures_util::Stream`].
//! - [`GroupConsumer`]: a member of a pull consumer group, with auto-commit.
//! - [`DedupeStore`]: exactly-once processing for [`Consumer`] and [`GroupConsumer`]: a durable
//!   record of handled messages, so that a redelivery does not run a handler twice.
//! - [`Admin`]: topics, groups, dispatcher status and dead-letter redrive.
//!
//! ```no_run
//! # async fn demo() -> Result<(), mmmq_client::ClientError> {
//! use mmmq_client::Producer;
//! use serde::Serialize;
//!
//! #[derive(Serialize)]
//! struct Order { id: u64 }
//!
//! let producer = Producer::new("http://127.0.0.1:8080")?;
//! let receipt = producer.send("order.created", &Order { id: 1 }).await?;
//! println!("stored at offset {}", receipt.offset);
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod admin;
mod conn;
mod consumer;
mod dedupe;
mod error;
mod group;
mod producer;
mod pull;
mod stream;

pub use admin::{Admin, TopicSettings};
pub use consumer::Consumer;
pub use dedupe::DedupeStore;
pub use error::ClientError;
pub use group::GroupConsumer;
pub use mmmq_core::error_chain;
pub use mmmq_core::{
    Ack, DispatcherStatus, Envelope, ErasedHandler, GroupPoll, GroupStatus, HostHealth, Message,
    PartitionInfo, PullPage, RedriveNext, RedrivePartition, RedriveStatus, ReloadReport,
    TargetStatus, TopicConfig, TopicDetail, TopicInfo, TopicPartition, TopicStatus, erase,
};
pub use producer::{Producer, Receipt, Record};
pub use pull::PullConsumer;

/// Where a broker is when nothing says otherwise (docs/operations.md, "Command-line client").
pub const DEFAULT_BROKER: &str = "http://127.0.0.1:8080";
