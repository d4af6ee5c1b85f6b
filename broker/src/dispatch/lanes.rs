//! Parallel lanes (docs/dispatchers.md, "Dispatchers", `maxInFlight`): up to N requests in flight per (topic,
//! partition), while messages with the same key are still delivered one at a time, in offset
//! order.
//!
//! A reader takes the partition's messages in offset order and puts each in one of N lanes by
//! its key ([`lane_of`]: a hash of its own, not the partitioner's; no key: by offset). Each lane delivers its queue one
//! request at a time with the worker's usual NACK retries, dead letters and backoff, so a NACK, a
//! retry or a backoff holds back only its lane. What is done is tracked as a low watermark (every
//! offset below it is done: the first 8 bytes of the checkpoint, as without lanes) plus the done
//! offsets above it, which the checkpoint also keeps: after a clean stop nothing ACKed is
//! delivered again, after a crash at most what was ACKed in the last checkpoint interval. The
//! reader stays within a window of the watermark, so a lane stuck in backoff bounds the memory
//! and the checkpoint instead of letting the others run away.

use std::collections::BTreeSet;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use super::checkpoint_saver::CheckpointSaver;
use super::target::Delivery;
use super::worker::{READ_BATCH, READ_BYTES, Worker};
use crate::config::DeliveryMode;
use crate::storage::Position;

/// How far (in offsets) the reader may run ahead of the low watermark, per lane.
const WINDOW_PER_LANE: u64 = 64;
/// The window over all lanes, at most.
const MAX_WINDOW: u64 = 8192;
/// Messages waiting in a lane, at-most-once.
const AT_MOST_ONCE_QUEUE: usize = 4;

/// What is done: everything below `next`, and `done` above it.
struct Tracker {
    next: u64,
    done: BTreeSet<u64>,
}

impl Tracker {
    fn new(start: &Position) -> Self {
        let mut t = Self {
            next: start.next,
            done: start.done.iter().flat_map(|&(s, e)| s..e).collect(),
        };
        t.settle();
        t
    }

    fn settle(&mut self) {
        while self.done.remove(&self.next) {
            self.next += 1;
        }
    }

    fn done(&mut self, offset: u64) {
        if offset >= self.next {
            self.done.insert(offset);
            self.settle();
        }
    }

    /// Retention deleted everything below `first`.
    fn skip_to(&mut self, first: u64) {
        if first > self.next {
            self.next = first;
            self.done = self.done.split_off(&first);
            self.settle();
        }
    }

    fn position(&self) -> Position {
        let mut done: Vec<(u64, u64)> = Vec::new();
        for &o in &self.done {
            match done.last_mut() {
                Some((_, e)) if *e == o => *e += 1,
                _ => done.push((o, o + 1)),
            }
        }
        Position {
            next: self.next,
            done,
        }
    }
}

/// The lane of a message among `n`: by a hash of its key ([`LaneHash::Xxh3`]), else by offset.
pub fn lane_of(key: Option<&str>, offset: u64, n: usize) -> usize {
    LaneHash::Xxh3.lane(key, offset, n)
}

/// How keys are spread over lanes. Lane numbers outlive a process — the handlers record
/// (docs/plugins.md, "Replay") says which version each lane ran — so the function is fixed for good and
/// named in each session of that record; the checkpoint keeps done offsets, not lanes, so a
/// change of function only moves keys between lanes at a restart, each key still in order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LaneHash {
    /// Kafka's partitioner over N, as lanes were first spread (a record that names no
    /// function). It is the partitioner's own hash, `murmur2(key) % P` (docs/topics-and-groups.md, "Topics"): the
    /// keys of one partition took only N / gcd(N, P) lanes, a single one when N = P.
    #[default]
    Murmur2,
    /// XXH3 (64-bit, seed 0) of the key's UTF-8 bytes, modulo N: independent of the
    /// partitioner, so the keys of every partition spread over all N lanes.
    Xxh3,
}

impl LaneHash {
    /// The lane of a message among `n` (at least 1); a message without a key by its offset.
    pub fn lane(self, key: Option<&str>, offset: u64, n: usize) -> usize {
        let n = n.max(1) as u64;
        let hash = match (self, key) {
            (_, None) => offset,
            (Self::Murmur2, Some(k)) => u64::from(mmmq_core::murmur2(k.as_bytes()) & 0x7fff_ffff),
            (Self::Xxh3, Some(k)) => xxhash_rust::xxh3::xxh3_64(k.as_bytes()),
        };
        (hash % n) as usize
    }
}

/// Shared by the reader and the lanes.
struct Progress<'a> {
    tracker: Mutex<Tracker>,
    watermark: watch::Sender<u64>,
    saver: &'a CheckpointSaver,
}

impl Progress<'_> {
    fn update(&self, worker: &Worker, f: impl FnOnce(&mut Tracker)) {
        let position = {
            let mut t = self.tracker.lock();
            f(&mut t);
            t.position()
        };
        worker
            .stats
            .next_offset
            .store(position.next, std::sync::atomic::Ordering::Relaxed);
        self.watermark.send_replace(position.next);
        self.saver.set_position(position);
    }
}

impl Worker {
    /// Delivers with `maxInFlight` lanes until cancelled.
    pub(super) async fn drain_lanes(&self, start: Position, saver: &CheckpointSaver) {
        let n = self.spec.max_in_flight;
        let progress = Progress {
            tracker: Mutex::new(Tracker::new(&start)),
            watermark: watch::Sender::new(start.next),
            saver,
        };
        // At-most-once: what waits in a lane is claimed and lost in a crash, so lanes hold little.
        let queue = match self.spec.delivery {
            DeliveryMode::AtLeastOnce => WINDOW_PER_LANE as usize,
            DeliveryMode::AtMostOnce => AT_MOST_ONCE_QUEUE,
        };
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..n)
            .map(|_| mpsc::channel::<(u64, Delivery)>(queue))
            .unzip();
        let lanes = futures_util::future::join_all(
            receivers.into_iter().map(|rx| self.lane(rx, &progress)),
        );
        let window = (WINDOW_PER_LANE * n as u64).min(MAX_WINDOW);
        let reader = self.read_into_lanes(&start, senders, &progress, window);
        futures_util::future::join(reader, lanes).await;
    }

    /// Reads the partition in offset order and hands each message to its lane.
    async fn read_into_lanes(
        &self,
        start: &Position,
        lanes: Vec<mpsc::Sender<(u64, Delivery)>>,
        progress: &Progress<'_>,
        window: u64,
    ) {
        let n = lanes.len();
        let mut read_at = progress.tracker.lock().next;
        let mut committed = self.partition.log.subscribe();
        let mut watermark = progress.watermark.subscribe();
        'outer: loop {
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => break,
                r = committed.wait_for(|&n| n > read_at) => if r.is_err() { break },
            }
            let first = self.partition.log.first_offset();
            if read_at < first {
                self.note_skipped(read_at, first);
                progress.update(self, |t| t.skip_to(first));
                read_at = first;
            }
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => break,
                r = watermark.wait_for(|&w| read_at < w + window) => if r.is_err() { break },
            }
            let room = (*watermark.borrow() + window - read_at) as usize;
            let log = self.partition.log.clone();
            let from = read_at;
            let entries = match tokio::task::spawn_blocking(move || {
                log.read_from(from, READ_BATCH.min(room), READ_BYTES)
            })
            .await
            .expect("read task panicked")
            {
                Ok(entries) => entries,
                Err(_) if self.partition.log.first_offset() > from => continue,
                Err(e) => {
                    self.record_error(from, format!("reading offset {from}: {e}"));
                    if self.sleep(super::backoff::START).await.is_err() {
                        break;
                    }
                    continue;
                }
            };
            let read_end = entries.last().map_or(from, |e| e.offset + 1);
            for entry in entries {
                if self.cancel.is_cancelled() {
                    break 'outer;
                }
                let offset = entry.offset;
                read_at = offset + 1;
                if start.is_done(offset) {
                    progress.update(self, |t| t.done(offset));
                    continue;
                }
                match self.to_delivery(entry) {
                    Ok((offset, mut d)) => {
                        let lane = lane_of(d.envelope.key.as_deref(), offset, n);
                        d.lane = lane as u32;
                        // At-most-once: claimed before it reaches a lane.
                        if self
                            .claim(progress.saver, offset + 1, read_end)
                            .await
                            .is_err()
                        {
                            break 'outer;
                        }
                        if lanes[lane].send((offset, d)).await.is_err() {
                            break 'outer;
                        }
                    }
                    Err(offset) => progress.update(self, |t| t.done(offset)),
                }
            }
        }
    }

    /// One lane: its messages one request at a time, in offset order.
    async fn lane(&self, mut rx: mpsc::Receiver<(u64, Delivery)>, progress: &Progress<'_>) {
        let run_len = self.run_len();
        while let Some(first) = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => None,
            m = rx.recv() => m,
        } {
            let mut run = vec![first];
            while run.len() < run_len {
                match rx.try_recv() {
                    Ok(m) => run.push(m),
                    Err(_) => break,
                }
            }
            let mut advance = |offset: u64| progress.update(self, |t| t.done(offset));
            if self.deliver_gathered(&mut run, &mut advance).await.is_err() {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watermark_moves_past_every_done_offset_and_keeps_the_rest_as_ranges() {
        let mut t = Tracker::new(&Position::at(10));
        for o in [12, 13, 15, 11] {
            t.done(o);
        }
        assert_eq!(
            t.position(),
            Position {
                next: 10,
                done: vec![(11, 14), (15, 16)]
            }
        );
        t.done(10);
        assert_eq!(
            t.position(),
            Position {
                next: 14,
                done: vec![(15, 16)]
            }
        );
        // A checkpoint read back gives the same tracker.
        let again = Tracker::new(&t.position());
        assert_eq!(again.position(), t.position());
        t.skip_to(20);
        assert_eq!(t.position(), Position::at(20));
    }

    #[test]
    fn a_key_always_has_the_same_lane() {
        for n in [2, 7, 64] {
            let lane = lane_of(Some("customer-42"), 0, n);
            assert!((0..1000).all(|o| lane_of(Some("customer-42"), o, n) == lane));
            assert!(lane < n);
        }
        // Fixed for good (the handlers record names lanes by number): XXH3 of the key modulo N.
        assert_eq!(xxhash_rust::xxh3::xxh3_64(b""), 0x2d06_8005_38d3_94c2);
        assert_eq!(
            [
                lane_of(Some("customer-42"), 0, 1024),
                lane_of(Some("k0"), 0, 1024),
                lane_of(Some(""), 0, 1024),
            ],
            [609, 179, 0x2d06_8005_38d3_94c2 % 1024]
        );
        assert_eq!(lane_of(None, 13, 8), 5);
        // The first function, which old records name by leaving it out: Kafka's partitioner.
        for n in [1, 8, 100] {
            assert_eq!(
                LaneHash::default().lane(Some("21"), 0, n),
                mmmq_core::partition_for_key("21", n as u32) as usize
            );
        }
    }

    /// Partitions take `murmur2(key) % P`: lanes by the same hash gave one partition's keys
    /// N / gcd(N, P) lanes. Every partition's keys now take every lane, about equally.
    #[test]
    fn the_keys_of_one_partition_spread_over_every_lane() {
        for (p, n) in [(8u32, 8usize), (4, 8), (8, 4), (6, 4), (1, 16)] {
            let mut counts = vec![vec![0u32; n]; p as usize];
            for i in 0..20_000 {
                let key = format!("k{i}");
                let partition = mmmq_core::partition_for_key(&key, p) as usize;
                counts[partition][lane_of(Some(&key), 0, n)] += 1;
            }
            for (partition, lanes) in counts.iter().enumerate() {
                let mean = lanes.iter().sum::<u32>() / n as u32;
                assert!(
                    lanes.iter().all(|&c| c > mean / 2 && c < mean * 3 / 2),
                    "P {p}, N {n}: partition {partition}'s keys per lane {lanes:?}"
                );
            }
            // What lanes by the partitioner's hash did.
            let used = (0..20_000)
                .map(|i| format!("k{i}"))
                .filter(|k| mmmq_core::partition_for_key(k, p) == 0)
                .map(|k| LaneHash::Murmur2.lane(Some(&k), 0, n))
                .collect::<BTreeSet<_>>();
            assert_eq!(used.len(), n / gcd(n, p as usize), "P {p}, N {n}");
        }
    }

    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 { a } else { gcd(b, a % b) }
    }
}
