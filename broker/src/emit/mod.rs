//! Emit exactly once (README, "Plugins, version 2"; docs/guarantees.md, "Emit exactly once").
//!
//! What an `ack`ed call of a 0.2.0 plugin emitted is appended by the plugin target before it
//! answers, so before the dispatcher's position moves past the message. A crash between that
//! append and the checkpoint re-runs the message after the restart, and its emits must not be
//! appended a second time, however long the broker was down. So:
//!
//! - Every emitted message is stored with its [`Origin`]: (consumerId, source topic, partition,
//!   offset, index of the emit in its call).
//! - Before the first commit from a source partition, the broker scans the destination partitions
//!   for messages of that origin at or past the dispatcher's durable checkpoint ([`source`]), and
//!   a re-run's emits found there are skipped.
//! - What to scan is bounded by a small durable record per (dispatcher, source partition),
//!   `checkpoints/{consumerId}.emits` ([`bounds`]): for each destination partition, an offset
//!   below which no output of a source message past the checkpoint lies. It is written and synced
//!   before the first append to a destination it does not cover, and moved forward about once a
//!   second as the checkpoint moves, so a commit in the steady state costs no extra sync and a
//!   restart scans about one checkpoint interval's outputs.
//!
//! No time window decides: a message's outputs are found by their origin, not by when they were
//! stored.

mod bounds;
mod source;

use std::collections::HashMap;
use std::sync::Arc;

use mmmq_core::{ConsumerId, Topic};
use parking_lot::Mutex;

use crate::metrics::Metrics;
use crate::produce::ProduceItem;
use crate::storage::StorageError;
use crate::topics::Registry;

pub use mmmq_core::Origin;
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
        }
    }
}

/// The emits of one dispatcher, by source partition.
pub struct ConsumerEmits {
    emitter: Arc<Emitter>,
    consumer_id: ConsumerId,
    sources: Mutex<HashMap<(Topic, u32), Arc<Source>>>,
}

/// What one message's call emitted: the message's offset and its emits, in order.
pub type Outputs = (u64, Vec<ProduceItem>);

impl ConsumerEmits {
    /// The largest message its plugin may emit.
    pub fn max_message_bytes(&self) -> usize {
        self.emitter.max_message_bytes
    }

    /// Appends the emits of `ack`ed calls on messages of `partition` of `topic`, each message's
    /// in order, skipping those a run before a crash already stored. Resolves once they are
    /// durable: the caller may then move past those messages. Returns how many were appended.
    pub async fn commit(
        &self,
        topic: &Topic,
        partition: u32,
        outputs: Vec<Outputs>,
    ) -> Result<u64, EmitError> {
        if outputs.iter().all(|(_, o)| o.is_empty()) {
            return Ok(0);
        }
        let source = self.source(topic, partition)?;
        let appended = source.commit(outputs).await?;
        if appended > 0 {
            self.emitter
                .metrics
                .emitted
                .get_or_create(&crate::metrics::ConsumerLabel {
                    consumer: self.consumer_id.to_string(),
                })
                .inc_by(appended);
        }
        Ok(appended)
    }

    /// The state of one source partition. A topic deleted and created again is a new log with
    /// new (empty) checkpoints: its partition is another object, and gets fresh state.
    fn source(&self, topic: &Topic, partition: u32) -> Result<Arc<Source>, EmitError> {
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
            && s.is_of(&p)
        {
            return Ok(s.clone());
        }
        let s = Arc::new(Source::new(
            self.emitter.clone(),
            self.consumer_id.clone(),
            topic.clone(),
            p,
        ));
        sources.insert(key, s.clone());
        Ok(s)
    }
}
