//! The emits of one dispatcher from one source partition: recovery of what a run before a crash
//! stored, the bounds kept ahead of every append, and the appends themselves.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mmmq_core::{ConsumerId, Origin, StoredMessage, Topic, now_ms};
use parking_lot::Mutex;

use super::bounds::{self, Bounds, Dest};
use super::{EmitError, Emitter, Outputs};
use crate::produce::ProduceItem;
use crate::storage::StorageError;
use crate::topics::{Partition, Registry};

/// How often the bounds are moved forward behind the checkpoint (one durable replace each).
const REFRESH: Duration = Duration::from_secs(1);

/// Entries read at a time while scanning a destination at recovery.
const SCAN_CHUNK: usize = 4096;

pub(super) struct Source {
    emitter: Arc<Emitter>,
    /// The dispatcher: its emits' origin.
    consumer_id: ConsumerId,
    /// The checkpoint of the source partition that moves past its messages: the consumerId, or
    /// `__redrive` when the source is the dispatcher's dead-letter topic. The bounds are kept
    /// beside it (`checkpoints/{position}.emits`).
    position: ConsumerId,
    topic: Topic,
    partition: Arc<Partition>,
    /// The bounds as they are on disk. Commits hold it shared while they register their
    /// appends; a write of new bounds holds it alone, so no append slips past a write.
    on_disk: tokio::sync::RwLock<Bounds>,
    state: Mutex<State>,
    recovered: tokio::sync::OnceCell<()>,
}

#[derive(Default)]
struct State {
    /// Appends that may hold outputs of messages past the durable checkpoint: the highest
    /// source offset of each, and a lower bound of where it went in each destination.
    pending: Vec<Pending>,
    /// (source offset, emit index) of outputs already stored for messages past the checkpoint:
    /// a re-run's emits found here are not appended again.
    present: HashSet<(u64, u32)>,
    last_refresh: Option<Instant>,
}

struct Pending {
    max_source: u64,
    bounds: Vec<(Dest, u64)>,
}

/// One emit on its way to a destination partition.
struct Routed {
    origin: Origin,
    key: Option<String>,
    content: Box<serde_json::value::RawValue>,
}

impl Source {
    pub(super) fn new(
        emitter: Arc<Emitter>,
        consumer_id: ConsumerId,
        position: ConsumerId,
        topic: Topic,
        partition: Arc<Partition>,
    ) -> Self {
        Self {
            emitter,
            consumer_id,
            position,
            topic,
            partition,
            on_disk: tokio::sync::RwLock::new(Bounds::new()),
            state: Mutex::new(State::default()),
            recovered: tokio::sync::OnceCell::new(),
        }
    }

    /// The source topic and partition.
    pub(super) fn source(&self) -> (&Topic, &Arc<Partition>) {
        (&self.topic, &self.partition)
    }

    /// The dispatcher the emits are of.
    pub(super) fn consumer_id(&self) -> &ConsumerId {
        &self.consumer_id
    }

    /// How many partitions a destination the emits create gets (the broker's default, as for
    /// a producer's new topic).
    pub(super) fn default_partitions(&self) -> u32 {
        self.emitter.registry.default_partitions()
    }

    /// Whether this is the state of `partition` (and not of a deleted topic's).
    pub(super) fn is_of(&self, partition: &Arc<Partition>) -> bool {
        Arc::ptr_eq(&self.partition, partition)
    }

    /// Whether its source partition still exists (its topic was not deleted meanwhile).
    pub(super) fn exists(&self) -> bool {
        self.emitter
            .registry
            .get(&self.topic)
            .and_then(|t| t.partition(self.partition.number))
            .is_some_and(|p| self.is_of(&p))
    }

    /// Appends the outputs of ACKed calls, skipping those a run before a crash stored; resolves
    /// once they are durable. Returns how many were appended.
    pub(super) async fn commit(&self, outputs: Vec<Outputs>) -> Result<u64, EmitError> {
        if let Some(cluster) = self.emitter.registry.cluster_append() {
            return self.commit_clustered(&**cluster, outputs).await;
        }
        self.recover().await?;
        let max_source = outputs.iter().map(|(o, _)| *o).max().unwrap_or(0);
        let routed = self.route(outputs).await?;
        if routed.is_empty() {
            return Ok(0);
        }
        let bounds: Vec<(Dest, u64)> = routed
            .iter()
            .map(|(t, p, _)| ((t.clone(), p.number), p.log.next_offset()))
            .collect();
        self.register(max_source, bounds).await?;
        let appended = self.append(routed).await?;
        self.refresh_now_and_then().await;
        Ok(appended)
    }

    /// Routes each emit not stored before to its partition (by key, as a producer's), grouped by
    /// destination partition in order.
    async fn route(
        &self,
        outputs: Vec<Outputs>,
    ) -> Result<Vec<(Topic, Arc<Partition>, Vec<Routed>)>, EmitError> {
        let mut items: Vec<(Origin, ProduceItem)> = Vec::new();
        {
            let state = self.state.lock();
            for (offset, emits) in outputs {
                for (index, item) in emits.into_iter().enumerate() {
                    let index = index as u32;
                    if state.present.contains(&(offset, index)) {
                        continue;
                    }
                    let origin = Origin {
                        consumer_id: self.consumer_id.to_string(),
                        topic: self.topic.to_string(),
                        partition: self.partition.number,
                        offset,
                        index,
                        topic_id: Some(self.partition.topic_id),
                    };
                    items.push((origin, item));
                }
            }
        }
        let mut names: Vec<Topic> = Vec::new();
        for (_, item) in &items {
            if !names.contains(item.topic()) {
                names.push(item.topic().clone());
            }
        }
        let topics = self.emitter.registry.get_or_create_all(&names).await?;
        let mut groups: Vec<(Topic, Arc<Partition>, Vec<Routed>)> = Vec::new();
        for (origin, item) in items {
            let t = &topics[names.iter().position(|n| n == item.topic()).expect("named")];
            let p = t
                .route(None, item.key())
                .expect("a route without an explicit partition always exists");
            let (topic, key, content) = item.into_parts();
            let routed = Routed {
                origin,
                key,
                content,
            };
            match groups
                .iter_mut()
                .find(|(n, q, _)| *n == topic && Arc::ptr_eq(q, &p))
            {
                Some((_, _, v)) => v.push(routed),
                None => groups.push((topic, p, vec![routed])),
            }
        }
        Ok(groups)
    }

    /// Makes sure the bounds on disk cover appends at `bounds` before any of them happens.
    async fn register(&self, max_source: u64, bounds: Vec<(Dest, u64)>) -> Result<(), EmitError> {
        {
            let on_disk = self.on_disk.read().await;
            if bounds
                .iter()
                .all(|(d, next)| bounds::covers(&on_disk, d, *next))
            {
                self.state
                    .lock()
                    .pending
                    .push(Pending { max_source, bounds });
                return Ok(());
            }
        }
        let mut on_disk = self.on_disk.write().await;
        let mut wider = on_disk.clone();
        for (d, next) in &bounds {
            let from = wider.entry(d.clone()).or_insert(*next);
            *from = (*from).min(*next);
        }
        if wider != *on_disk {
            self.write_bounds(wider.clone()).await?;
            *on_disk = wider;
        }
        self.state
            .lock()
            .pending
            .push(Pending { max_source, bounds });
        Ok(())
    }

    /// Appends each destination's share in one commit, destinations in parallel. An append
    /// that fails leaves what the others stored marked as stored, so the retry skips it.
    async fn append(
        &self,
        groups: Vec<(Topic, Arc<Partition>, Vec<Routed>)>,
    ) -> Result<u64, EmitError> {
        let mut set = tokio::task::JoinSet::new();
        for (topic, partition, routed) in groups {
            let now = now_ms();
            let origins: Vec<(u64, u32)> = routed
                .iter()
                .map(|r| (r.origin.offset, r.origin.index))
                .collect();
            let payloads: Vec<Vec<u8>> = routed
                .into_iter()
                .map(|r| {
                    StoredMessage {
                        timestamp: now,
                        key: r.key,
                        content: r.content,
                        id: None,
                        origin: Some(r.origin),
                        binary: Default::default(),
                    }
                    .to_payload()
                })
                .collect();
            set.spawn(async move {
                let bytes: usize = payloads.iter().map(Vec::len).sum();
                let stored = partition.log.append_batch(&payloads).await;
                (topic, origins, bytes, stored)
            });
        }
        let mut appended = 0;
        let mut stored_origins = Vec::new();
        let mut failure = None;
        while let Some(joined) = set.join_next().await {
            let (topic, origins, bytes, stored) = joined.expect("append task panicked");
            match stored {
                Ok(_) => {
                    appended += origins.len() as u64;
                    self.emitter
                        .metrics
                        .count_in(&topic, origins.len() as u64, bytes);
                    stored_origins.extend(origins);
                }
                Err(e) => {
                    tracing::warn!(consumer_id = %self.consumer_id, topic = %topic, error = %e, "a plugin's emits were not stored; the run is retried");
                    failure = failure.or(Some(e));
                }
            }
        }
        match failure {
            None => Ok(appended),
            Some(e) => {
                self.state.lock().present.extend(stored_origins);
                Err(e.into())
            }
        }
    }

    /// Before the first commit: what a run before a crash stored for messages past the durable
    /// checkpoint, found by origin in the destinations the bounds name.
    async fn recover(&self) -> Result<(), EmitError> {
        self.recovered
            .get_or_try_init(|| async {
                let registry = self.emitter.registry.clone();
                let (partition, consumer_id) = (self.partition.clone(), self.consumer_id.clone());
                let (topic, position) = (self.topic.clone(), self.position.clone());
                let found = tokio::task::spawn_blocking(move || {
                    scan(&registry, &partition, &consumer_id, &position, &topic)
                })
                .await
                .expect("emit recovery task panicked")?;
                if !found.present.is_empty() {
                    tracing::info!(consumer_id = %self.consumer_id, topic = %self.topic, partition = self.partition.number, outputs = found.present.len(), "emits stored before a restart found; a re-run will not append them again");
                }
                {
                    let mut state = self.state.lock();
                    state.present = found.present;
                    if let Some(max_source) = found.max_source {
                        state.pending.push(Pending {
                            max_source,
                            bounds: found.bounds.clone().into_iter().collect(),
                        });
                    }
                }
                *self.on_disk.write().await = found.bounds;
                Ok::<(), EmitError>(())
            })
            .await
            .map(|_| ())
    }

    /// About once a [`REFRESH`]: moves the bounds forward to what appends past the durable
    /// checkpoint need, so a restart scans little. Skipped while another write is under way.
    async fn refresh_now_and_then(&self) {
        {
            let state = self.state.lock();
            if state.last_refresh.is_some_and(|t| t.elapsed() < REFRESH) {
                return;
            }
        }
        let Ok(mut on_disk) = self.on_disk.try_write() else {
            return;
        };
        self.state.lock().last_refresh = Some(Instant::now());
        let (partition, id) = (self.partition.clone(), self.position.clone());
        let checkpoint =
            match tokio::task::spawn_blocking(move || partition.checkpoints.read(&id)).await {
                Ok(Ok(c)) => c.unwrap_or(0),
                _ => return,
            };
        let narrower = {
            let mut state = self.state.lock();
            state.pending.retain(|p| p.max_source >= checkpoint);
            state.present.retain(|&(o, _)| o >= checkpoint);
            let mut b = Bounds::new();
            for (d, next) in state.pending.iter().flat_map(|p| &p.bounds) {
                let from = b.entry(d.clone()).or_insert(*next);
                *from = (*from).min(*next);
            }
            b
        };
        if narrower != *on_disk && self.write_bounds(narrower.clone()).await.is_ok() {
            *on_disk = narrower;
        }
    }

    async fn write_bounds(&self, bounds: Bounds) -> Result<(), StorageError> {
        let (partition, id) = (self.partition.clone(), self.position.clone());
        tokio::task::spawn_blocking(move || bounds::write(&partition.checkpoints, &id, &bounds))
            .await
            .expect("bounds write task panicked")
    }
}

/// Whether `origin` is the origin of an output of `consumer_id` from a message at or past
/// `checkpoint` in `partition` of `topic` — of this incarnation of the topic: the emits of one
/// deleted and created again (its offsets start anew) are not this one's, whatever their
/// offsets. An origin stored before topic ids is of the incarnation with the legacy id.
fn is_output_of(
    origin: &Origin,
    consumer_id: &ConsumerId,
    topic: &Topic,
    partition: &Partition,
    checkpoint: u64,
) -> bool {
    // The cheap fields first: the legacy id is a hash, worth computing only for a candidate.
    origin.consumer_id == consumer_id.as_str()
        && origin.topic == topic.as_str()
        && origin.partition == partition.number
        && origin.offset >= checkpoint
        && origin
            .topic_id
            .unwrap_or_else(|| crate::topics::incarnation::legacy_id(&origin.topic))
            == partition.topic_id
}

/// What recovery found.
struct Found {
    bounds: Bounds,
    present: HashSet<(u64, u32)>,
    max_source: Option<u64>,
}

/// Reads the bounds and scans what they name for outputs of `consumer_id` from source messages
/// at or past the durable checkpoint `position` in `partition` of `topic`. Blocking.
fn scan(
    registry: &Registry,
    partition: &Partition,
    consumer_id: &ConsumerId,
    position: &ConsumerId,
    topic: &Topic,
) -> Result<Found, StorageError> {
    let bounds = bounds::read(&partition.checkpoints, position)?;
    let checkpoint = partition.checkpoints.read(position)?.unwrap_or(0);
    let mut present = HashSet::new();
    let mut max_source = None;
    let mut scanned = 0u64;
    for ((dest, p), from) in &bounds {
        let Some(log) = registry.get(dest).and_then(|t| t.partition(*p)) else {
            continue;
        };
        let log = &log.log;
        let mut at = (*from).max(log.first_offset());
        let end = log.next_offset();
        while at < end {
            let entries = log.read_from(at, SCAN_CHUNK, 64 << 20)?;
            let Some(last) = entries.last() else { break };
            at = last.offset + 1;
            for entry in entries {
                let Ok(payload) = entry.payload else { continue };
                let Ok(message) = StoredMessage::from_payload(&payload) else {
                    continue;
                };
                let Some(origin) = message.origin else {
                    continue;
                };
                if is_output_of(&origin, consumer_id, topic, partition, checkpoint) {
                    present.insert((origin.offset, origin.index));
                    max_source = max_source.max(Some(origin.offset));
                }
            }
        }
        scanned += end.saturating_sub(*from);
    }
    tracing::debug!(consumer_id = %consumer_id, topic = %topic, partition = partition.number, destinations = bounds.len(), scanned, "scanned for emits stored before a restart");
    Ok(Found {
        bounds,
        present,
        max_source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{LogConfig, OsFs};
    use crate::topics::incarnation::legacy_id;
    use mmmq_core::TopicId;

    #[tokio::test]
    async fn outputs_are_matched_to_one_incarnation_of_their_source() {
        let tmp = tempfile::tempdir().unwrap();
        let vfs: Arc<dyn crate::storage::Vfs> = Arc::new(OsFs);
        let open = |id| {
            crate::topics::partition::open_partition(tmp.path(), id, 0, &vfs, &LogConfig::default())
                .unwrap()
        };
        let (c, t) = (ConsumerId::new("c").unwrap(), Topic::new("src").unwrap());
        let origin = |topic_id| Origin {
            consumer_id: "c".into(),
            topic: "src".into(),
            partition: 0,
            offset: 5,
            index: 0,
            topic_id,
        };
        let (a, b) = (TopicId::from_bytes([1; 16]), TopicId::from_bytes([2; 16]));
        let pa = open(a);
        assert!(is_output_of(&origin(Some(a)), &c, &t, &pa, 5));
        assert!(
            !is_output_of(&origin(Some(a)), &c, &t, &pa, 6),
            "before the checkpoint"
        );
        assert!(
            !is_output_of(&origin(Some(b)), &c, &t, &pa, 0),
            "another incarnation"
        );
        assert!(
            !is_output_of(&origin(None), &c, &t, &pa, 0),
            "older than topic ids"
        );
        drop(pa);
        let legacy = open(legacy_id("src"));
        assert!(is_output_of(&origin(None), &c, &t, &legacy, 0));
    }
}
