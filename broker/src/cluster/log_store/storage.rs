//! openraft's log store on the segment log (docs/cluster.md, "Clustered partitions on disk"):
//! appends, reads by index, cuts, purges and the vote.
//!
//! An append updates the store's memory first (so its entries can be read at once, as openraft
//! requires), writes and fsyncs its sidecar records, then queues its messages in the segment
//! log's group commit and hands its callback to the *flusher*: one task per store that reports
//! appends in order, each once its messages are durable. A failed write stops the store taking
//! writes (openraft stops the group on a storage error; reopening recovers).

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::PathBuf;
use std::sync::Arc;

use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::{EntryPayload, LogState, OptionalSend, RaftLogReader};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use super::layout::{Entry, Slot};
use super::{SegmentLogStore, Shared, StoreError, Vote, blocking, log_id};
use crate::cluster::types::{Command, GroupKind, LogId, Raft};
use crate::storage::frame::{LOG_ID_LEN, MAX_PAYLOAD_LEN};
use crate::storage::{Committing, StorageError};

/// What the flusher does, in the order it was asked.
pub(super) enum Flush {
    /// Reports an append once its messages (if any) are durable.
    Append {
        committing: Option<Committing>,
        callback: IOFlushed<Raft>,
    },
    /// Answers once everything before it was reported.
    Barrier(oneshot::Sender<Result<(), String>>),
}

/// The flusher: reports appends in the order they were made. The segment log commits in that
/// order too, so waiting for each in turn costs nothing.
pub(super) async fn flush(
    mut queue: mpsc::UnboundedReceiver<Flush>,
    failed: Arc<Mutex<Option<String>>>,
    dir: PathBuf,
) {
    while let Some(item) = queue.recv().await {
        match item {
            Flush::Append {
                committing,
                callback,
            } => {
                let done = match committing {
                    Some(c) => c.await.map(drop).map_err(|e| e.to_string()),
                    None => Ok(()),
                };
                let done = {
                    let mut failed = failed.lock();
                    match done {
                        Err(cause) => Err(failed.get_or_insert(cause).clone()),
                        Ok(()) => failed.clone().map_or(Ok(()), Err),
                    }
                };
                callback.io_completed(done.map_err(|cause| {
                    StoreError::Failed {
                        dir: dir.clone(),
                        cause,
                    }
                    .into()
                }));
            }
            Flush::Barrier(done) => {
                let _ = done.send(failed.lock().clone().map_or(Ok(()), Err));
            }
        }
    }
}

/// Most bytes of messages one limited read returns (replication of a log far behind goes in
/// steps of about this).
const READ_MAX_BYTES: usize = 8 << 20;
/// Most entries one limited read returns.
const READ_MAX_ENTRIES: u64 = 4096;

fn is_message(e: &Entry) -> bool {
    matches!(e.payload, EntryPayload::Normal(_))
}

impl Shared {
    /// Waits until every append made before was reported; fails if a write failed.
    pub(crate) async fn barrier(&self) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        let gone = || StoreError::Join("the store's flusher stopped".to_owned());
        self.flusher.send(Flush::Barrier(tx)).map_err(|_| gone())?;
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(cause)) => Err(StoreError::Failed {
                dir: self.dir(),
                cause,
            }),
            Err(_) => Err(gone()),
        }
    }

    async fn append(
        self: &Arc<Self>,
        entries: Vec<Entry>,
        callback: IOFlushed<Raft>,
    ) -> Result<(), StoreError> {
        self.check_failed()?;
        let mut messages = Vec::new();
        let mut others = Vec::new();
        for e in &entries {
            match &e.payload {
                EntryPayload::Normal(command) => {
                    let fits = matches!(
                        (self.kind, command),
                        (GroupKind::Partition, Command::Message(_))
                            | (GroupKind::Meta, Command::Meta(_))
                    );
                    let p = command.payload();
                    if !fits || p.len() + LOG_ID_LEN > MAX_PAYLOAD_LEN {
                        return Err(StoreError::Inconsistent {
                            dir: self.dir(),
                            reason: format!(
                                "entry {} ({command}) has no place in a {:?} group's log",
                                e.log_id, self.kind
                            ),
                        });
                    }
                    messages.push((e.log_id.leader_id.term, e.log_id.index, p.clone()));
                }
                _ => others.push(e.clone()),
            }
        }
        {
            let mut st = self.state.lock();
            let durable = self.log.durable_end();
            // Durable messages are read from the disk, but the last append's stay: replication
            // reads them next.
            while st.pending.front().is_some_and(|p| p.0 < durable) {
                st.pending.pop_front();
            }
            let first = st.layout.end();
            st.layout.append(&entries, is_message)?;
            for (k, (term, index, p)) in messages.iter().enumerate() {
                st.pending
                    .push_back((first + k as u64, log_id(*term, *index), p.clone()));
            }
        }
        let queued = async {
            if !others.is_empty() {
                let this = self.clone();
                blocking(move || this.sidecar.lock().append(&others)).await?;
            }
            Ok::<_, StoreError>(if messages.is_empty() {
                None
            } else {
                Some(self.log.append_raft(&messages)?)
            })
        }
        .await;
        match queued {
            Ok(committing) => {
                let item = Flush::Append {
                    committing,
                    callback,
                };
                if let Err(mpsc::error::SendError(item)) = self.flusher.send(item) {
                    let Flush::Append { callback, .. } = item else {
                        unreachable!("sent an append")
                    };
                    callback.io_completed(Err(io::Error::other("the store's flusher stopped")));
                }
                Ok(())
            }
            Err(e) => {
                self.fail(&e);
                Err(e)
            }
        }
    }

    async fn truncate_after(self: &Arc<Self>, last: Option<LogId>) -> Result<(), StoreError> {
        self.check_failed()?;
        let end = {
            let mut st = self.state.lock();
            // Raft never cuts what it committed; a cut below what was applied (and so visible to
            // readers) is refused before anything changes.
            let keep = last.map_or(0, |l| l.index + 1);
            let applied = self.log.applied_end();
            if st.layout.offset_at(keep).min(st.layout.end()) < applied {
                return Err(StorageError::Refused {
                    dir: self.dir(),
                    reason: format!(
                        "cannot cut the log after {}: messages up to offset {applied} are applied",
                        last.map_or("nothing".to_owned(), |l| l.to_string())
                    ),
                }
                .into());
            }
            let end = st.layout.truncate_after(last);
            while st.pending.back().is_some_and(|p| p.0 >= end) {
                st.pending.pop_back();
            }
            end
        };
        let from = last.map_or(0, |l| l.index + 1);
        let result = async {
            // The sidecar first: a power cut between the two leaves frames past a gap, which the
            // next open removes.
            let this = self.clone();
            blocking(move || this.sidecar.lock().cut_from(from)).await?;
            Ok(self.log.truncate(end).await?)
        }
        .await;
        self.failing(result)
    }

    async fn purge(self: &Arc<Self>, upto: LogId) -> Result<(), StoreError> {
        self.check_failed()?;
        let Some((last, next_offset)) = self.state.lock().layout.purge(upto) else {
            return Ok(());
        };
        let result = async {
            // The purge point first: it says where the log continues once what it covers is gone.
            self.write_purged(last, next_offset).await?;
            let this = self.clone();
            blocking(move || {
                this.sidecar.lock().drop_before(last.index + 1)?;
                this.log.remove_segments_before(next_offset)?;
                Ok(())
            })
            .await
        }
        .await;
        self.failing(result)
    }

    async fn save_vote(self: &Arc<Self>, vote: Vote) -> Result<(), StoreError> {
        self.check_failed()?;
        // Every append made under the old vote is durable before the new vote is.
        self.barrier().await?;
        let this = self.clone();
        blocking(move || {
            super::files::write_json(&*this.vfs, &this.raft_dir.join(super::VOTE), &vote)
        })
        .await?;
        self.state.lock().vote = Some(vote);
        Ok(())
    }

    /// The entries of `[from, to)` the log holds, at most `max_entries` and (past the first)
    /// about `max_bytes` of messages.
    async fn read(
        self: &Arc<Self>,
        from: u64,
        to: u64,
        max_entries: u64,
        max_bytes: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        let (plan, memory) = {
            let st = self.state.lock();
            let plan = st
                .layout
                .plan(from, to.min(from.saturating_add(max_entries)));
            let memory = st.pending.clone();
            (plan, memory)
        };
        let from_memory = |offset: u64| {
            let first = memory.front()?.0;
            memory.get(offset.checked_sub(first)? as usize)
        };
        // The messages not in memory are consecutive and come first.
        let disk: Vec<u64> = plan
            .iter()
            .filter_map(|(_, s)| match s {
                Slot::Message(o) if from_memory(*o).is_none() => Some(*o),
                _ => None,
            })
            .collect();
        let mut frames = if let Some(&first) = disk.first() {
            let log = self.log.clone();
            let n = disk.len();
            blocking(move || Ok(log.read_raft_from(first, n, max_bytes)?))
                .await?
                .into_iter()
        } else {
            Vec::new().into_iter()
        };
        let kind = self.kind;
        let mut out = Vec::with_capacity(plan.len());
        for (index, slot) in plan {
            let offset = match slot {
                Slot::Other(e) => {
                    out.push(e);
                    continue;
                }
                Slot::Message(offset) => offset,
            };
            let (id, payload) = match from_memory(offset) {
                Some((_, id, p)) => (*id, p.clone()),
                None => match frames.next() {
                    Some(f) if f.offset == offset => {
                        let ((term, i), p) = f.entry.map_err(crate::storage::StorageError::from)?;
                        (log_id(term, i), p)
                    }
                    // A read cut short by its byte budget: what it has is a prefix.
                    None if max_bytes != usize::MAX && !out.is_empty() => break,
                    _ => {
                        return Err(StoreError::Inconsistent {
                            dir: self.dir(),
                            reason: format!("no frame at offset {offset} for index {index}"),
                        });
                    }
                },
            };
            if id.index != index {
                return Err(StoreError::Inconsistent {
                    dir: self.dir(),
                    reason: format!(
                        "the frame at offset {offset} holds index {}, not {index}",
                        id.index
                    ),
                });
            }
            out.push(Entry {
                log_id: id,
                payload: EntryPayload::Normal(Command::from_payload(kind, payload)),
            });
        }
        Ok(out)
    }
}

/// `[from, to)` of a range of indexes.
fn bounds(range: &impl RangeBounds<u64>) -> (u64, u64) {
    let from = match range.start_bound() {
        Bound::Included(&i) => i,
        Bound::Excluded(&i) => i.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let to = match range.end_bound() {
        Bound::Included(&i) => i.saturating_add(1),
        Bound::Excluded(&i) => i,
        Bound::Unbounded => u64::MAX,
    };
    (from, to)
}

impl RaftLogReader<Raft> for SegmentLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let (from, to) = bounds(&range);
        Ok(self.shared.read(from, to, u64::MAX, usize::MAX).await?)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.shared.state.lock().vote)
    }

    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, io::Error> {
        Ok(self
            .shared
            .read(start, end, READ_MAX_ENTRIES, READ_MAX_BYTES)
            .await?)
    }
}

impl RaftLogStorage<Raft> for SegmentLogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<Raft>, io::Error> {
        let st = self.shared.state.lock();
        Ok(LogState {
            last_purged_log_id: st.layout.purged().map(|p| p.0),
            last_log_id: st.layout.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        Ok(self.shared.save_vote(*vote).await?)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<Raft>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        Ok(self.shared.append(entries, callback).await?)
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        Ok(self.shared.truncate_after(last_log_id).await?)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        Ok(self.shared.purge(log_id).await?)
    }
}
