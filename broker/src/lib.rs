//! mmmq: a durable message broker in one binary.
//!
//! # Layout
//! - [`storage`]: the segment store: framing, segments and indexes, the group-commit log,
//!   recovery, checkpoints, and the file abstraction under all of it.
//! - [`topics`]: the registry of topics (one log and its checkpoints each), created on first use.
//! - [`config`]: `serve` settings and the strict `dispatchers.json` loader.
//! - [`dispatch`]: dispatchers, their drain workers and their targets (remote HTTP consumers).
//! - [`broker`]: [`broker::Broker`], the handle that ties topics, dispatchers and metrics together.
//! - [`http`]: the HTTP API on axum; [`server`]: `run(listener, config, shutdown)`.
//! - [`plugin`]: WebAssembly handlers: the sandboxed runtime and the hot-reloading plugin target.
//! - [`metrics`]: Prometheus metrics.
//! - [`cli`]: the client commands `produce`, `tail`, `topics`, `dispatchers`.
//! - [`inspect`]: `mmmq inspect`, an offline reader of a topic directory for when a disk misbehaves.
//! - [`bench`]: `mmmq bench`, benchmarks that print JSON lines.
//!
//! # Embedding
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use mmmq::broker::Broker;
//! use mmmq::config::ServeConfig;
//! use mmmq_client::Message;
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

pub mod bench;
pub mod broker;
pub mod cli;
pub mod config;
pub mod dispatch;
pub mod http;
pub mod inspect;
pub mod metrics;
pub mod plugin;
pub mod server;
pub mod storage;
pub mod topics;
