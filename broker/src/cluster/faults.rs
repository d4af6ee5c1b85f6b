//! The fault switch of a broker (docs/cluster.md, "Testing faults"): tests cut or slow its
//! outgoing Raft traffic to chosen brokers to make a partitioned minority, without network
//! namespaces, and make its disk refuse writes. Off (and unreachable from outside) unless the
//! broker was started with `--fault-injection`; then `PUT /mmmq/internal/faults` sets it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

use super::types::BrokerId;
use crate::storage::vfs::fault::{FaultyFs, Op};

/// What happens to messages to one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Rule {
    /// Every message fails as if the peer were unreachable.
    Drop,
    /// Every message waits this many milliseconds before it is sent.
    DelayMs(u64),
}

/// How the broker's disk refuses: every write and fsync of its storage fails with this error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskFault {
    /// `ENOSPC`: the disk is full.
    Enospc,
    /// `EIO`: the disk fails.
    Eio,
}

/// The body of `PUT /mmmq/internal/faults`: rules by peer id (`{"2": "drop", "3": {"delayMs":
/// 50}}`) and, optionally, `"disk"`. A PUT replaces everything: `{}` heals every link and the
/// disk.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FaultRules {
    /// The disk's fault; absent or `null`: the disk works.
    #[serde(default)]
    pub disk: Option<DiskFault>,
    /// Rules by peer id (JSON object keys are strings).
    #[serde(flatten)]
    pub peers: HashMap<String, Rule>,
}

/// The rules by peer and the disk's switch; cheap to clone, shared with the router.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    rules: Arc<RwLock<HashMap<BrokerId, Rule>>>,
    /// The file system the broker's storage runs on, when it can be made to fail.
    disk: Option<FaultyFs>,
}

impl Faults {
    /// Faults whose disk switch fails `disk` (the broker's storage runs on it).
    pub fn with_disk(disk: FaultyFs) -> Self {
        Self {
            disk: Some(disk),
            ..Self::default()
        }
    }

    /// Replaces every rule.
    pub fn set(&self, rules: HashMap<BrokerId, Rule>) {
        *self.rules.write() = rules;
    }

    /// Replaces every rule and the disk's fault; refuses a peer key that is not a broker id, or
    /// a disk fault on a broker whose storage cannot fail on demand.
    pub fn apply(&self, body: FaultRules) -> Result<(), String> {
        let rules = body
            .peers
            .into_iter()
            .map(|(k, r)| {
                k.parse::<BrokerId>()
                    .map(|id| (id, r))
                    .map_err(|_| format!("{k:?} is neither a broker id nor \"disk\""))
            })
            .collect::<Result<HashMap<_, _>, _>>()?;
        match (&self.disk, body.disk) {
            (Some(fs), fault) => {
                fs.clear();
                if let Some(fault) = fault {
                    let errno = match fault {
                        DiskFault::Enospc => libc::ENOSPC,
                        DiskFault::Eio => libc::EIO,
                    };
                    fs.fail(Op::Write, "", errno);
                    fs.fail(Op::Sync, "", errno);
                }
            }
            (None, Some(_)) => return Err("this broker's storage cannot fail on demand".into()),
            (None, None) => {}
        }
        self.set(rules);
        Ok(())
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
