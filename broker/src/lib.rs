//! mmmq: a durable message broker in one binary.
//!
//! # Layout
//! Each module imports only modules listed after it, so there are no import cycles:
//! - [`server`]: `run(listener, config, shutdown)`: the HTTP API over a broker, signals at boot.
//! - [`http`]: the HTTP API on axum, a thin skin over [`broker::Broker`].
//! - [`broker`]: [`broker::Broker`], the composition root and the one API the HTTP layer, an
//!   embedding application and the binary use: produce, pull, topics, dispatcher status, reload,
//!   in-process handlers, metrics.
//! - [`cluster`]: a cluster of brokers (docs/cluster.md): every use of openraft — the Raft log
//!   store on the segment log, the partition and metadata state machines, Raft's traffic,
//!   writes through a group's leader, `GET /mmmq/cluster`. It uses `topics`, `config` and
//!   `storage`; `broker` and `http` use it.
//! - [`dispatch`]: dispatchers, their drain workers (`worker`, `lanes`, `backoff`,
//!   `checkpoint_saver`) and their targets (`dispatch::targets::{http, fleet, wasm, in_process}`).
//! - [`groups`]: pull consumer groups: membership, balanced partition ownership, commits.
//! - [`kafka`]: Kafka's wire protocol (docs/kafka.md): connections, the APIs, Kafka's consumer
//!   groups (their commits are `groups`' checkpoint files), idempotent producers. It uses
//!   `broker`, `topics` and `groups`; `server` starts it.
//! - [`emit`]: a plugin's emitted messages appended exactly once (origins, bounds, recovery).
//! - [`plugin`]: the WebAssembly runtime (engine, limits, sandbox) and the plugin tools; it knows
//!   nothing of dispatchers.
//! - [`produce`]: [`produce::ProduceItem`], what a produce may carry, checked in one place.
//! - [`topics`]: the registry of topics (each a set of partitions, one log and its checkpoints
//!   each), their configuration and retention; created on first use or by the topic API.
//! - [`config`]: `serve` settings with their defaults and validation, and the strict
//!   `dispatchers.json` loader.
//! - [`metrics`]: Prometheus metrics.
//! - [`listen`]: what every listener holds its clients to (connections per address).
//! - [`inspect`]: `mmmq inspect`, an offline reader of a topic directory for when a disk misbehaves.
//! - [`storage`]: the segment store: framing, the index, segments, the group-commit log,
//!   recovery and repair, checkpoints, and the file abstraction under all of it.
//!
//! The binary's own commands (flags, the client commands, `mmmq bench`) live in `src/cmd/`, next
//! to `main.rs`, outside the library.
//!
//! # Embedding
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use mmmq::broker::Broker;
//! use mmmq::config::ServeConfig;
//! use mmmq_core::Message;
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Notice { to: String }
//!
//! let broker = Broker::open(ServeConfig::new("./data")).await?;
//! broker
//!     .handle("mailer", "notify.*", |m: Message<Notice>| async move {
//!         println!("mail {} (offset {})", m.content.to, m.offset);
//!         Ok::<_, String>(())
//!     })
//!     .await?;
//! broker.produce_json("notify.weather", None, &Notice { to: "a@b.c".into() }).await?;
//! broker.shutdown().await;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod broker;
pub mod cluster;
pub mod config;
pub mod dispatch;
pub mod emit;
pub mod groups;
pub mod handled;
pub mod http;
pub mod inspect;
pub mod kafka;
pub mod listen;
pub mod metrics;
pub mod plugin;
pub mod produce;
pub mod replay;
pub mod server;
pub mod storage;
pub mod topics;
