//! Where a dispatcher delivers: one trait, with one implementation per kind of target in
//! [`super::targets`]. The drain worker owns ordering, retries, dead letters and checkpoints; a
//! target only answers "what did the consumer say to these messages".

use std::future::Future;
use std::pin::Pin;

pub use mmmq_core::TargetStatus;
use mmmq_core::{Envelope, Topic};
use tokio_util::sync::CancellationToken;

/// A boxed future, so that targets can be trait objects.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One message on its way out. Targets encode it as they need (only the HTTP target needs JSON,
/// so plugins and in-process handlers never pay for an encoding).
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The message.
    pub envelope: Envelope,
    /// The lane it is delivered in (0 unless the dispatcher has `maxInFlight` > 1): a target that
    /// keeps state per caller (a plugin instance) keeps it per lane.
    pub lane: u32,
    /// A redriven dead letter: its earlier failures (`{"reason","attempts","deadLetteredAt",
    /// "dlqOffset"}`, oldest first), kept if it is dead-lettered again.
    pub history: Option<std::sync::Arc<Vec<serde_json::Value>>>,
    /// A redriven dead letter: where it is in the dead-letter topic. Its plugin emits take this
    /// as their origin, and the redrive's position guards them, so a redrive re-run after a
    /// crash appends none twice and its checkpoint waits for them.
    pub dead_letter: Option<DeadLetterAt>,
    /// Which delivery of the message this is: 1 the first time, one more per resend after a
    /// NACK or a `retry-after`.
    pub attempt: u32,
}

impl Delivery {
    /// Its offset in the log its worker reads: the dead-letter topic's for a redriven dead letter
    /// (whose envelope keeps the original offset), else the envelope's.
    pub fn read_offset(&self) -> u64 {
        self.dead_letter
            .as_ref()
            .map_or(self.envelope.offset, |at| at.offset)
    }

    /// Wraps an envelope.
    pub fn new(envelope: Envelope) -> Self {
        Self {
            envelope,
            lane: 0,
            history: None,
            dead_letter: None,
            attempt: 1,
        }
    }
}

/// A dead letter's place in its dead-letter topic.
#[derive(Debug, Clone)]
pub struct DeadLetterAt {
    /// `__dlq.<consumerId>`.
    pub topic: Topic,
    /// Its partition.
    pub partition: u32,
    /// Its offset there.
    pub offset: u64,
}

/// Why a delivery got no usable answer. Never the message's fault: the worker retries it with
/// backoff, forever, until the consumer is back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// The consumer could not be reached, or did not answer within its timeout.
    #[error("{0}")]
    Unreachable(String),
    /// It answered, but not as the protocol says (another status, an unreadable body).
    #[error("{0}")]
    BadAnswer(String),
    /// A plugin with no version that loads (missing or broken file): its messages wait.
    #[error("plugin not loaded: {0}")]
    NotLoaded(String),
    /// What a plugin run needs stored could not be (the disk refused its emits, or the record
    /// of the version that handles it): the run is tried again, and what was stored is not
    /// stored twice.
    #[error("{0}")]
    Storage(String),
    /// The dispatcher is stopping: the message was not tried (it is delivered after the restart).
    #[error("not delivered: the dispatcher is stopping")]
    Stopping,
}

/// What came back from one delivery attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The consumer is done with the message(s).
    Ack,
    /// The consumer refused; the reason is recorded with the dead letter.
    Nack(String),
    /// Resend after this long (a plugin's `retry-after`): not a NACK, one more attempt.
    RetryAfter(std::time::Duration),
    /// Dead-letter it now with this reason (a plugin's `dead-letter`).
    DeadLetter(String),
    /// No usable answer: retried with backoff, forever.
    Failed(TargetError),
}

/// How long a target that answers per message keeps a run before it hands the rest back: the
/// messages it ACKed are then done (their position can move, a reload can take effect) and the
/// rest come in the next run.
pub const RUN_TIME_BUDGET: std::time::Duration = std::time::Duration::from_millis(5);

/// The answer to a run of messages: how many were ACKed, in order from the first, and what
/// came back for the next one when not all were.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAnswer {
    /// Messages ACKed from the start of the run.
    pub acked: usize,
    /// The outcome for message `acked`, when the run stopped there. `None` with fewer than the
    /// whole run ACKed: the rest was handed back untried ([`RUN_TIME_BUDGET`]) and goes in the
    /// next run.
    pub stopped: Option<Outcome>,
}

impl RunAnswer {
    /// Every message of a run of `n` ACKed.
    pub fn all(n: usize) -> Self {
        Self {
            acked: n,
            stopped: None,
        }
    }

    /// `acked` messages ACKed, then `outcome` for the next.
    pub fn stopped(acked: usize, outcome: Outcome) -> Self {
        Self {
            acked,
            stopped: Some(outcome),
        }
    }
}

/// A way to deliver.
pub trait Target: Send + Sync {
    /// Delivers `batch` in order and reports how many messages were ACKed and, if not all were,
    /// the outcome of the next one. A target that takes the batch as one request (HTTP) answers all
    /// or nothing; one that answers per message stops at the first message not ACKed, and before
    /// the next message once `stop` is cancelled ([`TargetError::Stopping`]), so that stopping a
    /// dispatcher waits for one message, not a whole run.
    fn deliver_run<'a>(
        &'a self,
        batch: &'a [Delivery],
        stop: &'a CancellationToken,
    ) -> BoxFuture<'a, RunAnswer>;
    /// For status.
    fn status(&self) -> TargetStatus;
    /// Whether a NACK from [`Target::deliver_run`] is the answer of that one message (true), or
    /// of the whole batch (false: the worker then delivers the batch one message at a time).
    /// Targets that answer per message also get long runs, whatever `batchMaxMessages` says.
    fn answers_per_message(&self) -> bool {
        false
    }
    /// Delivers `batch` and reports the first answer that is not an ACK (or ACK).
    fn deliver<'a>(
        &'a self,
        batch: &'a [Delivery],
        stop: &'a CancellationToken,
    ) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            self.deliver_run(batch, stop)
                .await
                .stopped
                .unwrap_or(Outcome::Ack)
        })
    }
    /// Re-reads what the target is made of (a plugin's file); `Ok(true)` when that changed it.
    fn reload(&self) -> BoxFuture<'_, Result<bool, String>> {
        Box::pin(async { Ok(false) })
    }
    /// Resolves once what the target did for the messages it ACKed so far in `partition` of
    /// `topic` is durable (a plugin's emits, stored behind its calls): the checkpoint may then
    /// move past them. `false` when it will not be (the dispatcher is stopping and the disk
    /// refused): the checkpoint must stay where it is. Ready at once for targets that store
    /// nothing.
    fn settled<'a>(&'a self, topic: &'a Topic, partition: u32) -> BoxFuture<'a, bool> {
        let _ = (topic, partition);
        Box::pin(async { true })
    }
    /// The dispatcher is stopping (its workers are told at the same moment): work the target
    /// does in the background stops retrying what the disk refuses, so the stop is bounded.
    fn stopping(&self) {}
    /// Resolves once the target's background work has ended or is idle (after its workers
    /// ended), so that a new target of the same dispatcher never races it.
    fn closed(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
    /// `topic` was deleted: the target drops what it keeps of it.
    fn forget_topic(&self, topic: &Topic) {
        let _ = topic;
    }
}
