//! Idempotent producers' states read back from a partition's log (docs/kafka.md, "Idempotent
//! producers"): after a restart for ids handed out before it, and in a cluster by a leader new
//! in its term.
//!
//! One scan of the partition's newest records yields every producer's state in it, kept until
//! each producer takes its own: a partition is read once per boot (per term in a cluster)
//! however many producers come back to it, and after a minute without use, once more for ids
//! the scan did not hold; a client that makes ids up costs no more. A producer id the scan
//! did not find has no batches here.

use std::collections::HashMap;
use std::sync::Arc;

use kafka_protocol::ResponseError;
use mmmq_core::TopicId;
use parking_lot::Mutex;

use super::producers::State;
use crate::topics::Partition;

/// Records read back, newest first, to find producers' last batches.
const SCAN_BACK: u64 = 100_000;

/// One scan's result: what it was read for and every producer's state not yet taken.
struct Scan {
    generation: u64,
    states: HashMap<i64, State>,
}

type Cached = Arc<tokio::sync::Mutex<Option<Scan>>>;

/// The scans of every partition, per (topic incarnation, partition).
#[derive(Default)]
pub(crate) struct Scans {
    partitions: Mutex<HashMap<(TopicId, u32), Cached>>,
}

impl Scans {
    /// Producer `id`'s state in `p` as the log shows it in `generation` (0 alone; in a
    /// cluster the leader's term): from the partition's scan for that generation, made now if
    /// there is none. The state is handed over once: afterwards the caller's is the one kept.
    pub async fn take(
        &self,
        p: &Arc<Partition>,
        id: i64,
        generation: u64,
    ) -> Result<State, (ResponseError, Option<String>)> {
        let cached = self
            .partitions
            .lock()
            .entry((p.topic_id, p.number))
            .or_default()
            .clone();
        let mut scan = cached.lock().await;
        if scan.as_ref().is_none_or(|s| s.generation != generation) {
            let states = read_states(p).await?;
            *scan = Some(Scan { generation, states });
        }
        let mut state = scan
            .as_mut()
            .expect("filled")
            .states
            .remove(&id)
            .unwrap_or_default();
        state.generation = generation;
        Ok(state)
    }

    /// Forgets the scan of `p`: a write whose outcome is unknown may have stored a batch
    /// that only a new scan sees.
    pub fn forget(&self, p: &Partition) {
        self.partitions.lock().remove(&(p.topic_id, p.number));
    }

    /// Forgets scans no request is using: what producers did not come back for.
    pub fn forget_unused(&self) {
        self.partitions
            .lock()
            .retain(|_, cached| Arc::strong_count(cached) > 1);
    }
}

/// Every producer's last batches in `p`, from its newest records (up to [`SCAN_BACK`]).
async fn read_states(
    p: &Arc<Partition>,
) -> Result<HashMap<i64, State>, (ResponseError, Option<String>)> {
    let log = p.log.clone();
    tokio::task::spawn_blocking(move || {
        let end = log.next_offset();
        let start = end.saturating_sub(SCAN_BACK).max(log.first_offset());
        // Per producer: its state and the run being read (epoch, first seq, last seq, first
        // offset): the same epoch, the next sequence at the next offset.
        type Run = (i16, i32, i32, u64);
        let mut found: HashMap<i64, (State, Option<Run>)> = HashMap::new();
        let mut from = start;
        while from < end {
            let entries = log
                .read_from(from, 1000, 8 << 20)
                .map_err(|e| (ResponseError::KafkaStorageError, Some(e.to_string())))?;
            let Some(last) = entries.last() else { break };
            from = last.offset + 1;
            for e in entries {
                let Ok(payload) = e.payload else { continue };
                let Ok(r) = mmmq_core::record::read_record_payload(&payload) else {
                    continue;
                };
                let Some((id, epoch, seq)) = r.producer else {
                    continue;
                };
                let (state, run) = found.entry(id).or_default();
                *run = match *run {
                    Some((ep, f, l, o))
                        if ep == epoch
                            && seq == l.wrapping_add(1)
                            && e.offset == o + (seq.wrapping_sub(f)) as u64 =>
                    {
                        Some((ep, f, seq, o))
                    }
                    Some((ep, f, l, o)) => {
                        state.stored(ep, f, l, o);
                        Some((epoch, seq, seq, e.offset))
                    }
                    None => Some((epoch, seq, seq, e.offset)),
                };
            }
        }
        Ok(found
            .into_iter()
            .map(|(id, (mut state, run))| {
                if let Some((ep, f, l, o)) = run {
                    state.stored(ep, f, l, o);
                }
                (id, state)
            })
            .collect())
    })
    .await
    .expect("read task panicked")
}
