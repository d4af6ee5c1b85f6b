//! A cluster of brokers (docs/cluster.md): partitions replicated on Raft, a metadata group, and
//! the forwarding that makes any broker answer for all. Every use of openraft is in this module.

pub mod log_store;
pub mod machine;
pub mod types;
