//! In-process handlers: Rust closures registered by an application that embeds the broker (an
//! in-application queue with the broker's retry tolerance), delivered by the same drain workers as
//! remote and plugin targets, with the same order, retries, dead letters and checkpoints, and no
//! HTTP.

use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;

use tokio_util::sync::CancellationToken;

use crate::dispatch::target::{
    BoxFuture, Delivery, Outcome, RUN_TIME_BUDGET, RunAnswer, Target, TargetError, TargetStatus,
};

/// A handler: `Ok` is an ACK, `Err(reason)` a NACK.
pub type Handler = mmmq_core::ErasedHandler;

/// The target of an in-process handler.
pub struct InProcessTarget {
    handler: Handler,
}

impl InProcessTarget {
    /// Wraps a handler.
    pub fn new(handler: Handler) -> Self {
        Self { handler }
    }

    async fn call(&self, d: &Delivery) -> Outcome {
        // A panicking handler is a NACK, not a dead drain worker.
        match AssertUnwindSafe((self.handler)(d.envelope.clone()))
            .catch_unwind()
            .await
        {
            Ok(Ok(())) => Outcome::Ack,
            Ok(Err(reason)) => Outcome::Nack(reason),
            Err(_) => Outcome::Nack("handler panicked".into()),
        }
    }
}

impl Target for InProcessTarget {
    fn status(&self) -> TargetStatus {
        TargetStatus::InProcess
    }

    fn answers_per_message(&self) -> bool {
        true
    }

    fn deliver_run<'a>(
        &'a self,
        batch: &'a [Delivery],
        stop: &'a CancellationToken,
    ) -> BoxFuture<'a, RunAnswer> {
        Box::pin(async move {
            let started = std::time::Instant::now();
            for (i, d) in batch.iter().enumerate() {
                if stop.is_cancelled() {
                    return RunAnswer::stopped(i, Outcome::Failed(TargetError::Stopping));
                }
                if i > 0 && started.elapsed() >= RUN_TIME_BUDGET {
                    return RunAnswer {
                        acked: i,
                        stopped: None,
                    };
                }
                match self.call(d).await {
                    Outcome::Ack => {}
                    other => return RunAnswer::stopped(i, other),
                }
            }
            RunAnswer::all(batch.len())
        })
    }
}
