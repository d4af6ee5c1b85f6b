//! The fault switch of a broker's outgoing Raft traffic (docs/cluster.md, "Testing faults"):
//! tests cut or slow the links between chosen brokers to make a partitioned minority, without
//! network namespaces. Off (and unreachable from outside) unless the broker was started with
//! `--fault-injection`; then `PUT /mmmq/internal/faults` sets it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

use super::types::BrokerId;

/// What happens to messages to one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Rule {
    /// Every message fails as if the peer were unreachable.
    Drop,
    /// Every message waits this many milliseconds before it is sent.
    DelayMs(u64),
}

/// The rules by peer; cheap to clone, shared with the router.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    rules: Arc<RwLock<HashMap<BrokerId, Rule>>>,
}

impl Faults {
    /// Replaces every rule.
    pub fn set(&self, rules: HashMap<BrokerId, Rule>) {
        *self.rules.write() = rules;
    }

    /// For a message to `peer`: `None` to send it now, `Some(None)` to drop it, `Some(Some(d))`
    /// to send it after `d`.
    pub fn outgoing(&self, peer: BrokerId) -> Option<Option<Duration>> {
        match self.rules.read().get(&peer)? {
            Rule::Drop => Some(None),
            Rule::DelayMs(ms) => Some(Some(Duration::from_millis(*ms))),
        }
    }
}
