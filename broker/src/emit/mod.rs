//! Emit exactly once (docs/plugins.md, "WebAssembly handlers"; docs/guarantees.md, "Isolation").
//!
//! What the `ack`ed calls of a 0.2.0 plugin's run emitted is handed, when the run answers, to the
//! commit task of its source partition ([`pipeline`]), which appends it while the plugin handles
//! the next run; the dispatcher's checkpoint is written only once it is durable. A crash between
//! that append and the checkpoint re-runs the message after the restart, and its emits must not
//! be appended a second time, however long the broker was down. So:
//!
//! - Every emitted message is stored with its [`Origin`]: (consumerId, source topic, partition,
//!   offset, index of the emit in its call).
//! - Before the first commit from a source partition, the broker scans the destination partitions
//!   for messages of that origin at or past the dispatcher's durable checkpoint (`source`), and
//!   a re-run's emits found there are skipped.
//! - What to scan is bounded by a small durable record per (dispatcher, source partition),
//!   `checkpoints/{consumerId}.emits` (`bounds`): for each destination partition, an offset
//!   below which no output of a source message past the checkpoint lies. It is written and synced
//!   before the first append to a destination it does not cover, and moved forward about once a
//!   second as the checkpoint moves, so a commit in the steady state costs no extra sync and a
//!   restart scans about one checkpoint interval's outputs.
//!
//! - A redriven dead letter's source is the dead-letter partition: its emits' origin is the dead
//!   letter, and the redrive's position (`__redrive`) plays the checkpoint's part, bounds and all
//!   (docs/delivery.md, "Dead-letter redrive").
//!
//! No time window decides: a message's outputs are found by their origin, not by when they were
//! stored.

mod bounds;
mod clustered;
pub mod pipeline;
mod source;

use std::collections::HashMap;
use std::sync::Arc;

use mmmq_core::{ConsumerId, Topic};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::produce::ProduceItem;
use crate::storage::StorageError;
use crate::topics::Registry;

pub use mmmq_core::Origin;
use pipeline::Pipeline;
use source::Source;

/// Why a run's emits are not stored. Never the message's fault: the dispatcher retries the run
/// with backoff, and what was stored is not stored again.
#[derive(Debug, thiserror::Error)]
pub enum EmitError {
    /// The disk refused (a failing write, a full disk, the topic cap).
    #[error("cannot store the plugin's emitted messages: {0}")]
    Storage(#[from] StorageError),
    /// The source partition is gone (its topic was deleted while the run was in a call).
    #[error("topic {topic} partition {partition} no longer exists")]
    SourceGone {
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
    },
    /// The dispatcher is stopping and its emits are no longer taken: the run is tried again
    /// after the restart.
    #[error("the dispatcher is stopping; the run's emits were not taken")]
    Stopping,
    /// A cluster member could not write them through the cluster (no leader now, the
    /// destination could not be created): the run is retried.
    #[error("cannot store the plugin's emitted messages in {topic}: {why}")]
    Cluster {
        /// The destination topic.
        topic: String,
        /// Why.
        why: String,
    },
}

/// The broker's side of emits: where they go, shared by every plugin dispatcher.
pub struct Emitter {
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    max_message_bytes: usize,
}

impl Emitter {
    /// Emits into the topics of `registry`, each message at most `max_message_bytes`
    /// (`--max-body-bytes`).
    pub fn new(registry: Arc<Registry>, metrics: Arc<Metrics>, max_message_bytes: usize) -> Self {
        Self {
            registry,
            metrics,
            max_message_bytes,
        }
    }

    /// The largest message a plugin may emit.
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    /// The topics emits go to (and plugin dispatchers read).
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The emits of one dispatcher.
    pub fn for_consumer(self: &Arc<Self>, consumer_id: &ConsumerId) -> ConsumerEmits {
        ConsumerEmits {
            emitter: self.clone(),
            consumer_id: consumer_id.clone(),
            sources: Mutex::new(HashMap::new()),
            failing: Arc::default(),
            stop: CancellationToken::new(),
        }
    }
}

/// The emits of one dispatcher, by source partition.
pub struct ConsumerEmits {
    emitter: Arc<Emitter>,
    consumer_id: ConsumerId,
    sources: Mutex<HashMap<(Topic, u32), Arc<Piped>>>,
    /// Why the last commit was refused, until one succeeds (for status).
    failing: Arc<Mutex<Option<String>>>,
    /// The dispatcher is stopping ([`ConsumerEmits::stop`]).
    stop: CancellationToken,
}

/// One source partition's state and its commit task.
struct Piped {
    source: Arc<Source>,
    pipeline: Pipeline,
}

/// What one message's call emitted: the message's offset and its emits, in order.
pub type Outputs = (u64, Vec<ProduceItem>);

impl ConsumerEmits {
    /// The dispatcher whose emits these are.
    pub fn consumer_id(&self) -> &ConsumerId {
        &self.consumer_id
    }

    /// The largest message its plugin may emit.
    pub fn max_message_bytes(&self) -> usize {
        self.emitter.max_message_bytes
    }

    /// Hands over the emits of `ack`ed calls on messages of `partition` of `topic`, each
    /// message's in order, to be appended behind the calls ([`pipeline`]): skipping those a run
    /// before a crash already stored, tried again until the disk takes them. Waits only while
    /// [`pipeline::DEPTH`] runs' outputs are not stored yet. `position` names the checkpoint
    /// that moves past these messages (the consumerId; a redrive's own for dead letters), which
    /// must not be written past them before [`ConsumerEmits::settled`].
    pub async fn submit(
        &self,
        topic: &Topic,
        partition: u32,
        position: &ConsumerId,
        outputs: Vec<Outputs>,
    ) -> Result<(), EmitError> {
        if outputs.iter().all(|(_, o)| o.is_empty()) {
            return Ok(());
        }
        let piped = self.source(topic, partition, position)?;
        piped
            .pipeline
            .submit(outputs)
            .await
            .map_err(|_| EmitError::Stopping)
    }

    /// Why the emits are not being stored right now, if they are not.
    pub fn failing(&self) -> Option<String> {
        self.failing.lock().clone()
    }

    /// Resolves once everything handed over for `partition` of `topic` so far is durable
    /// (`true`), or will not be because the dispatcher is stopping (`false`: the checkpoint must
    /// not move past those messages).
    pub async fn settled(&self, topic: &Topic, partition: u32) -> bool {
        let piped = self
            .sources
            .lock()
            .get(&(topic.clone(), partition))
            .cloned();
        match piped {
            Some(piped) => piped.pipeline.settled().await,
            None => true,
        }
    }

    /// The dispatcher is stopping: emits the disk takes are still stored, but a refusal is no
    /// longer retried (a stop must not wait on a full disk; the messages run again after the
    /// restart, their emits stored once then). See [`pipeline`].
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Resolves once every pipeline has ended or stored everything handed to it, so that a
    /// new target of the same dispatcher never appends alongside them.
    pub async fn closed(&self) {
        let all: Vec<Arc<Piped>> = self.sources.lock().values().cloned().collect();
        for piped in all {
            piped.pipeline.idle().await;
        }
    }

    /// Drops the state of `topic`'s partitions (the topic was deleted): their commit tasks end
    /// and the deleted logs they held are freed. A `**` router over short-lived topics would
    /// otherwise hold every topic it ever read.
    pub fn forget(&self, topic: &Topic) {
        self.sources.lock().retain(|(t, _), _| t != topic);
    }

    /// The state of one source partition. A topic deleted and created again is a new log with
    /// new (empty) checkpoints: its partition is another object, and gets fresh state.
    fn source(
        &self,
        topic: &Topic,
        partition: u32,
        position: &ConsumerId,
    ) -> Result<Arc<Piped>, EmitError> {
        let p = self
            .emitter
            .registry
            .get(topic)
            .and_then(|t| t.partition(partition))
            .ok_or_else(|| EmitError::SourceGone {
                topic: topic.to_string(),
                partition,
            })?;
        let mut sources = self.sources.lock();
        let key = (topic.clone(), partition);
        if let Some(s) = sources.get(&key)
            && s.source.is_of(&p)
        {
            return Ok(s.clone());
        }
        let source = Arc::new(Source::new(
            self.emitter.clone(),
            self.consumer_id.clone(),
            position.clone(),
            topic.clone(),
            p,
        ));
        let piped = Arc::new(Piped {
            pipeline: Pipeline::start(self, source.clone(), self.stop.clone()),
            source,
        });
        sources.insert(key, piped.clone());
        Ok(piped)
    }
}

/// Counts what a commit appended in `mmmq_messages_emitted_total`.
fn count_emitted(emitter: &Emitter, consumer_id: &ConsumerId, appended: u64) {
    if appended > 0 {
        emitter
            .metrics
            .emitted
            .get_or_create(&crate::metrics::ConsumerLabel {
                consumer: consumer_id.to_string(),
            })
            .inc_by(appended);
    }
}
