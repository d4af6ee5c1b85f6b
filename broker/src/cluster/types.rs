//! The Raft type configuration every group of a cluster shares, and what its entries carry
//! (docs/cluster.md, "Design").
//!
//! One configuration serves the metadata group and every partition's group, so one network and
//! one log store serve them all. Leader ids are standard Raft's (one leader per term), so an
//! entry's log id is `(term, index)`: sixteen bytes in a clustered segment's frame header.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

openraft::declare_raft_types!(
    /// mmmq's Raft types: `u64` broker ids, brokers addressed by their HTTP address.
    pub Raft:
        D = Command,
        R = Applied,
        NodeId = u64,
        Node = openraft::BasicNode,
        LeaderId = openraft::impls::leader_id_std::LeaderId<u64, u64>,
);

/// A broker's id in a cluster (`--node-id`). Never reused.
pub type BrokerId = u64;

/// The log id of an entry: the term of the leader that wrote it and its index in the group's log.
pub type LogId = openraft::alias::LogIdOf<Raft>;

/// What a group's log holds besides Raft's own entries (blanks and memberships).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// One message of a partition: its stored payload, exactly the bytes a single-node log would
    /// frame (docs/storage.md, "Storage"), so that every replica frames the same bytes.
    Message(Bytes),
    /// A change to the cluster's metadata (the metadata group only), as JSON.
    Meta(Bytes),
}

/// What applying an entry answers to the write that proposed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Applied {
    /// A message's offset in its partition.
    Offset(u64),
    /// A metadata change's outcome, as JSON.
    Meta(Bytes),
    /// Entries that answer nothing (blanks, memberships).
    Nothing,
    /// A message whose produce id the partition's leader found stored (contract §9; docs/cluster.md,
    /// "Produce ids in a cluster"): where the first one is. Nothing was proposed for it.
    Duplicate {
        /// The first one's partition (a retry routed elsewhere can find it in another).
        partition: u32,
        /// Its offset there.
        offset: u64,
    },
}

/// Which kind of group a log belongs to: how its frames' payloads decode back into commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupKind {
    /// The metadata group: every normal entry is a [`Command::Meta`].
    Meta,
    /// A partition's group: every normal entry is a [`Command::Message`].
    Partition,
}

/// openraft logs entries at debug level: the members' secret is never shown
/// (docs/cluster.md, "Who may speak for the cluster").
impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Message(b) => write!(f, "message of {} bytes", b.len()),
            Command::Meta(b) if contains(b, b"\"setMemberSecret\"") => {
                f.write_str("meta setMemberSecret (the secret not shown)")
            }
            Command::Meta(b) => write!(f, "meta {}", String::from_utf8_lossy(b)),
        }
    }
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

impl Command {
    /// The bytes a log frames for this command (the header with its log id goes before them).
    pub fn payload(&self) -> &Bytes {
        match self {
            Command::Message(b) | Command::Meta(b) => b,
        }
    }

    /// The command a frame's payload holds, in a group of `kind`.
    pub fn from_payload(kind: GroupKind, payload: Bytes) -> Command {
        match kind {
            GroupKind::Meta => Command::Meta(payload),
            GroupKind::Partition => Command::Message(payload),
        }
    }
}
