//! A cluster of brokers (docs/cluster.md): partitions replicated on Raft, a metadata group, and
//! the forwarding that makes any broker answer for all. Every use of openraft is in this module.

pub mod faults;
pub mod forward;
pub mod meta_machine;
pub mod meta_state;
pub mod network;
pub mod node;
pub mod rpc;
pub mod status;
pub mod types;
