//! What the log's writer works with, shared by the writer ([`super::writer`]) and by poison and
//! heal ([`super::heal`]): the queue of operations and their replies, the poison, and the tail.
//! Kept below both so that the dependency runs one way: the writer calls into heal (poison on a
//! failure, heal before the next batch), heal needs nothing of the writer's, and both use this.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;

use crate::storage::error::StorageError;
use crate::storage::segment::Segment;

/// What an append that must not be forgotten does with its outcome, exactly once, before its
/// caller hears it — also when the caller has gone away meanwhile: the first offset of the
/// append, or the error that refused it. A produce with an id resolves its claim through it
/// (docs/delivery.md, "Idempotent produce"), so no task has to outlive the request for it.
/// On success it hears the first offset and the payload bytes stored.
pub type Settle = Box<dyn FnOnce(Result<(u64, usize), &StorageError>) + Send>;

/// The answer to an append: its settle hook, then the caller's channel. One dropped unanswered
/// (a writer that panicked, a runtime shutting down) settles as [`StorageError::Closed`], so a
/// produce id's claim is never left pending.
pub(super) struct Reply {
    tx: Option<oneshot::Sender<Result<u64, StorageError>>>,
    settle: Option<Settle>,
    /// The payload bytes of the append (what `settle` hears on success).
    bytes: usize,
}

impl Reply {
    pub(super) fn new(
        tx: oneshot::Sender<Result<u64, StorageError>>,
        settle: Option<Settle>,
        bytes: usize,
    ) -> Self {
        Self {
            tx: Some(tx),
            settle,
            bytes,
        }
    }

    pub(super) fn send(mut self, result: Result<u64, StorageError>) {
        if let Some(settle) = self.settle.take() {
            settle(result.as_ref().map(|&first| (first, self.bytes)));
        }
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(result);
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if let Some(settle) = self.settle.take() {
            settle(Err(&StorageError::Closed));
        }
    }
}
pub(super) type Done = oneshot::Sender<Result<(), StorageError>>;

/// One append request: the frames of its payloads, already encoded (CRCs are computed on the
/// caller's thread, in parallel, not by the single writer).
pub(super) struct Pending {
    pub(super) frames: Vec<u8>,
    pub(super) lens: Vec<u32>,
    pub(super) reply: Reply,
}

/// What the writer does, in queue order.
pub(super) enum Op {
    Append(Pending),
    /// Seal the tail now (retention: a tail that outlived `retentionMs`), if it holds entries.
    Roll(Done),
    /// Leave the exact layout (index synced, preallocation cut) and take no more appends.
    Close(Done),
    /// A clustered log: remove every entry from this offset on.
    Truncate(u64, Done),
    /// A clustered log: remove every entry and start over, empty, at this offset.
    Reset(u64, Done),
}

impl Op {
    pub(super) fn fail(self, error: StorageError) {
        match self {
            Op::Append(p) => p.reply.send(Err(error)),
            Op::Roll(done) | Op::Close(done) | Op::Truncate(_, done) | Op::Reset(_, done) => {
                drop(done.send(Err(error)))
            }
        }
    }
}

/// Why a log refuses appends, and from when it will try to recover.
pub(super) struct Poison {
    pub(super) cause: String,
    pub(super) retry_at: Instant,
}

/// The queue and what decides whether it takes appends (behind one mutex of the log).
#[derive(Default)]
pub(super) struct Writer {
    pub(super) pending: VecDeque<Op>,
    pub(super) running: bool,
    pub(super) poisoned: Option<Poison>,
    pub(super) closed: bool,
    /// How many appends a commit held lately, times 16 (a moving average over about eight
    /// commits): whether an idle log's next append leads. One small batch among big ones (the
    /// first producers back after a big commit) does not make the log look idle.
    pub(super) batch_x16: usize,
}

/// Where the next entry goes. Only the writer touches it.
pub(super) struct Tail {
    pub(super) segment: Arc<Segment>,
    pub(super) write_pos: u64,
    pub(super) next_offset: u64,
    /// When the tail's index was last synced (it is synced at most every
    /// [`super::LogConfig::index_sync_interval`]).
    pub(super) index_synced: Instant,
}
