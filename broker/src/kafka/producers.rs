//! Idempotent producers (docs/kafka.md, "Idempotent producers"): InitProducerId hands out ids,
//! and each (producer, partition) keeps the last five batches it stored, as Kafka does, so that a
//! retried batch is answered with its first copy's offset and a gap in sequence numbers is
//! refused (`OUT_OF_ORDER_SEQUENCE_NUMBER`).
//!
//! Nothing is written for it but the records themselves: each record payload carries its
//! producer's id, epoch and sequence (`mmmq_core::record`). Ids are made from the clock
//! (milliseconds × 1000, then counted up) and the broker's node id (the last three digits, so
//! that the brokers of a cluster hand out different ids), so an id says when it was given
//! out: a producer whose
//! id predates this broker's start and that it has no state for may have written before a
//! restart, and its state is read back from the partition's newest records before its batch is
//! judged ([`super::produce`]).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use kafka_protocol::ResponseError;
use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};
use mmmq_core::{TopicId, now_ms};
use parking_lot::Mutex;

/// Batches remembered per producer and partition (Kafka's
/// `max.in.flight.requests.per.connection` limit for idempotence).
const KEPT_BATCHES: usize = 5;

/// One producer's state in one partition.
#[derive(Debug, Clone, Default)]
pub(crate) struct State {
    /// What the state was read in: 0 alone; in a cluster, the term of this broker's leadership
    /// of the partition (a leader in another term reads the state from its log again).
    pub generation: u64,
    pub epoch: i16,
    /// `(first sequence, last sequence, first offset)`, oldest first; the records of each at
    /// consecutive offsets.
    pub batches: VecDeque<(i32, i32, u64)>,
}

/// What to do with a batch.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// New and in order: store it.
    Append,
    /// Stored before, at this offset: answer with it, store nothing.
    Duplicate(u64),
    /// Its first `stored` records are stored already, the first at offset `base`: a prefix a
    /// cluster committed before its leader failed (a batch is one Raft entry per record, and
    /// a majority may hold part of it: docs/kafka.md, "In a cluster"). Store the rest.
    Rest {
        /// Records of the batch stored already.
        stored: usize,
        /// The offset of its first record.
        base: u64,
    },
    /// Refused with this error.
    Refuse(ResponseError),
}

impl State {
    /// Judges a batch of sequences `first..=last` from `epoch`.
    pub fn judge(&self, epoch: i16, first: i32, last: i32) -> Verdict {
        if self.batches.is_empty() {
            return Verdict::Append;
        }
        if epoch < self.epoch {
            return Verdict::Refuse(ResponseError::InvalidProducerEpoch);
        }
        if epoch > self.epoch {
            // A bumped epoch starts again at 0.
            return if first == 0 {
                Verdict::Append
            } else {
                Verdict::Refuse(ResponseError::OutOfOrderSequenceNumber)
            };
        }
        // A batch read back from the log may be several of the producer's batches stored at
        // consecutive offsets, one run; and a batch a failed leader stored in part is two
        // entries, the prefix and the rest. A retry starts inside one entry and ends inside it
        // or in the entries that continue its sequences.
        let newest = self.batches.back().expect("not empty").1;
        if first <= last
            && let Some(i) = self
                .batches
                .iter()
                .position(|(f, l, _)| *f <= first && first <= *l)
        {
            let (f, mut end, offset) = self.batches[i];
            let base = offset + (first - f) as u64;
            for &(next_first, next_last, _) in self.batches.iter().skip(i + 1) {
                if end >= last || next_first != end.wrapping_add(1) {
                    break;
                }
                end = next_last;
            }
            if last <= end {
                return Verdict::Duplicate(base);
            }
            if end == newest {
                return Verdict::Rest {
                    stored: (end - first + 1) as usize,
                    base,
                };
            }
        }
        if first == newest.wrapping_add(1) || (newest == i32::MAX && first == 0) {
            Verdict::Append
        } else {
            Verdict::Refuse(ResponseError::OutOfOrderSequenceNumber)
        }
    }

    /// Remembers a stored batch.
    pub fn stored(&mut self, epoch: i16, first: i32, last: i32, offset: u64) {
        if epoch != self.epoch {
            self.batches.clear();
            self.epoch = epoch;
        }
        self.batches.push_back((first, last, offset));
        while self.batches.len() > KEPT_BATCHES {
            self.batches.pop_front();
        }
    }
}

type Slot = Arc<tokio::sync::Mutex<Option<State>>>;

/// A producer id, and the partition (topic incarnation, number).
type SlotKey = (i64, TopicId, u32);

/// How long a producer's state is kept after its last batch (Kafka's `producer.id.expiration.ms`):
/// a retry comes within seconds; a producer back after longer starts its epoch again.
const IDLE_STATE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Every producer's state, per partition.
pub(crate) struct Producers {
    /// Milliseconds since the epoch when this broker started: an id from before may have state
    /// in the log.
    boot_ms: u64,
    /// The last id's clock part (milliseconds × 1000, counted up).
    last_id: AtomicI64,
    /// This broker's cluster node id (0 alone), modulo 1000: the id's last three digits, so
    /// that brokers of a cluster never hand out the same id.
    node: i64,
    /// Each producer's state per partition, and when it was last used.
    slots: Mutex<HashMap<SlotKey, (Slot, std::time::Instant)>>,
}

impl Producers {
    pub fn new(node: u64) -> Self {
        Producers {
            boot_ms: now_ms(),
            last_id: AtomicI64::new(0),
            node: (node % 1000) as i64,
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// InitProducerId: a new id at epoch 0, or the same id at the next epoch for a producer that
    /// names its own (KIP-360). Transactions are refused: mmmq keeps none.
    pub fn init(&self, request: InitProducerIdRequest) -> InitProducerIdResponse {
        if request.transactional_id.is_some() {
            return InitProducerIdResponse::default()
                .with_error_code(ResponseError::CoordinatorNotAvailable.code())
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1);
        }
        let (id, epoch) = match (request.producer_id.0, request.producer_epoch) {
            (id, epoch) if id >= 0 && (0..i16::MAX).contains(&epoch) => (id, epoch + 1),
            _ => (self.new_id(), 0),
        };
        InitProducerIdResponse::default()
            .with_producer_id(ProducerId(id))
            .with_producer_epoch(epoch)
    }

    fn new_id(&self) -> i64 {
        let clock = (now_ms() as i64).saturating_mul(1000);
        let mut last = self.last_id.load(Ordering::Relaxed);
        loop {
            let next = clock.max(last + 1);
            match self
                .last_id
                .compare_exchange(last, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return next * 1000 + self.node,
                Err(now) => last = now,
            }
        }
    }

    /// Whether `id` was given out before this broker started (then its state may be in the log).
    /// Ids of an older mmmq (milliseconds × 1000) read as from long ago: looked up.
    pub fn predates_boot(&self, id: i64) -> bool {
        (id / 1_000_000) as u64 <= self.boot_ms
    }

    /// The state of producer `id` in a partition; locked while its batch is judged and stored.
    pub fn slot(&self, id: i64, topic: TopicId, partition: u32) -> Slot {
        let mut slots = self.slots.lock();
        let entry = slots
            .entry((id, topic, partition))
            .or_insert_with(|| (Slot::default(), std::time::Instant::now()));
        entry.1 = std::time::Instant::now();
        entry.0.clone()
    }

    /// Forgets states unused for [`IDLE_STATE`] and not in use: those of producers gone for
    /// good, and of partitions deleted since (their topic id is another's now).
    pub fn forget_idle(&self) {
        let now = std::time::Instant::now();
        self.slots
            .lock()
            .retain(|_, (slot, used)| now < *used + IDLE_STATE || Arc::strong_count(slot) > 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(batches: &[(i32, i32, u64)]) -> State {
        State {
            generation: 0,
            epoch: 0,
            batches: batches.iter().copied().collect(),
        }
    }

    #[test]
    fn a_retried_batch_is_its_first_copy_and_a_gap_is_refused() {
        let s = state(&[(0, 9, 100), (10, 19, 110)]);
        assert_eq!(s.judge(0, 10, 19), Verdict::Duplicate(110));
        assert_eq!(s.judge(0, 0, 9), Verdict::Duplicate(100));
        assert_eq!(s.judge(0, 20, 29), Verdict::Append);
        assert_eq!(
            s.judge(0, 21, 29),
            Verdict::Refuse(ResponseError::OutOfOrderSequenceNumber)
        );
        // Inside a run read back from the log: its records' offsets.
        assert_eq!(
            state(&[(0, 19, 100)]).judge(0, 10, 19),
            Verdict::Duplicate(110)
        );
        // A new epoch starts at 0; an old one is fenced.
        assert_eq!(s.judge(1, 0, 4), Verdict::Append);
        assert_eq!(
            s.judge(1, 5, 9),
            Verdict::Refuse(ResponseError::OutOfOrderSequenceNumber)
        );
        let mut s1 = s.clone();
        s1.stored(1, 0, 4, 120);
        assert_eq!(
            s1.judge(0, 20, 29),
            Verdict::Refuse(ResponseError::InvalidProducerEpoch)
        );
    }

    #[test]
    fn a_retry_of_a_batch_stored_in_part_stores_the_rest() {
        // A cluster's new leader holds records 0..=6 of a batch 0..=9 (its old leader failed
        // with part of it committed): the retry stores 7..=9, answered from the first.
        let s = state(&[(0, 6, 100)]);
        assert_eq!(
            s.judge(0, 0, 9),
            Verdict::Rest {
                stored: 7,
                base: 100
            }
        );
        // The rest stored (after other producers' records): a second retry of the whole
        // batch is a duplicate, answered from its first record.
        let s = state(&[(0, 6, 100), (7, 9, 150)]);
        assert_eq!(s.judge(0, 0, 9), Verdict::Duplicate(100));
        assert_eq!(s.judge(0, 5, 8), Verdict::Duplicate(105));
        assert_eq!(
            s.judge(0, 8, 12),
            Verdict::Rest {
                stored: 2,
                base: 151
            }
        );
        // Only at the newest batch's end; an older one's overlap is refused.
        let s = state(&[(0, 6, 100), (7, 9, 107), (20, 29, 200)]);
        assert_eq!(
            s.judge(0, 5, 12),
            Verdict::Refuse(ResponseError::OutOfOrderSequenceNumber)
        );
    }

    #[test]
    fn only_the_last_five_batches_are_kept() {
        let mut s = State::default();
        for b in 0..7 {
            s.stored(0, b * 10, b * 10 + 9, b as u64 * 10);
        }
        assert_eq!(s.batches.len(), KEPT_BATCHES);
        assert_eq!(s.judge(0, 20, 29), Verdict::Duplicate(20));
        assert_eq!(
            s.judge(0, 10, 19),
            Verdict::Refuse(ResponseError::OutOfOrderSequenceNumber)
        );
    }

    #[test]
    fn ids_grow_and_say_when_they_were_given() {
        let p = Producers::new(7);
        let a = p.new_id();
        let b = p.new_id();
        assert!(b > a);
        assert_eq!((a % 1000, b % 1000), (7, 7), "the node's digits");
        assert_ne!(a, Producers::new(8).new_id());
        assert!(p.predates_boot(1000));
        // An older mmmq's id (milliseconds × 1000) reads as from before the boot.
        assert!(p.predates_boot(now_ms() as i64 * 1000 + 5));
        assert!(!p.predates_boot((now_ms() as i64 + 10_000) * 1_000_000));
    }
}
