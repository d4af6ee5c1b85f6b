//! A cluster of brokers (docs/cluster.md): partitions replicated on Raft, a metadata group, and
//! the forwarding that makes any broker answer for all. Every use of openraft is in this module.
//!
//! # Layout
//! - `types`: the Raft type configuration every group shares, and what entries carry.
//! - `log_store`: openraft's log store on a segment log (a partition's log is its Raft log).
//! - `machine`: a partition's state machine (applying moves the log's visible end).
//! - `meta_state`, `meta_topic`, `meta_groups`, `meta_config`, `meta_machine`: the metadata (pull groups'
//!   commits, `dispatchers.json` and plugin versions too) and the metadata group's state machine.
//! - `network`, `rpc`, `faults`: Raft's traffic between brokers, both ends, and a fault switch;
//!   `identity`: the cluster's id every message carries, and the guard that checks it;
//!   `secret`: the members' secret that makes an internal request a member's; `screen`: what
//!   the receiving end refuses before a group sees it (wrong kinds of entries, wild terms).
//! - `coordinator`: the pull groups' coordinator (the metadata group's leader).
//! - `node`: a broker's part of the cluster, the metadata group's start; `forward`: writes
//!   through a group's leader; `status`: `GET /mmmq/cluster`.
//! - `supervise`: a partition group opened again after a storage error stopped it, and its
//!   metrics kept; `metrics`: the groups' Prometheus metrics.
//! - `ids`: produce ids kept with each partition's replicated log, decided by its leader.
//! - `membership`: member changes made by a group's leader; `admin`: the operator's commands
//!   (add or remove a broker, move a partition) built on them.
//! - `kafka`: what Kafka's protocol needs: brokers' Kafka addresses, writes at a leader only.
//! - `retention`: retention's purge of a partition's segments through its group.

pub mod admin;
pub mod coordinator;
pub mod delivery;
pub mod faults;
pub mod forward;
pub mod identity;
pub mod ids;
pub mod kafka;
mod liveness;
pub mod log_store;
pub mod machine;
pub mod membership;
pub mod meta_config;
pub mod meta_delivery;
pub mod meta_groups;
pub mod meta_machine;
pub mod meta_redrive;
pub mod meta_state;
pub mod meta_topic;
pub mod metrics;
pub mod network;
pub mod node;
pub mod partitions;
pub mod retention;
pub mod rpc;
mod screen;
pub mod secret;
pub mod status;
pub mod supervise;
pub mod types;
