//! Plugin log lines into `__logs.<consumerId>` (docs/plugins.md, "WebAssembly handlers"): what a plugin
//! logs (past the rate limit) is appended to that internal topic, a batch per consumer at a time,
//! so it can be pulled, tailed and kept by retention like any topic.

use std::collections::BTreeMap;
use std::sync::Arc;

use mmmq_core::{StoredMessage, Topic, now_ms};
use serde_json::value::RawValue;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::plugin::LogRecord;
use crate::topics::Registry;
use crate::topics::delivery::Appended;

/// Most lines appended in one batch.
const BATCH: usize = 1024;

/// Appends the records of `rx` until `stop`. A line that cannot be stored (a failing disk) is
/// dropped: the broker's own log has it.
pub(super) fn spawn(
    registry: Arc<Registry>,
    mut rx: mpsc::Receiver<LogRecord>,
    stop: CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            let first = tokio::select! {
                _ = stop.cancelled() => return,
                r = rx.recv() => match r {
                    Some(r) => r,
                    None => return,
                },
            };
            let mut by_consumer: BTreeMap<Arc<str>, Vec<Vec<u8>>> = BTreeMap::new();
            let mut push = |r: LogRecord| {
                let Ok(content) = RawValue::from_string(r.json) else {
                    return;
                };
                let payload = StoredMessage {
                    timestamp: now_ms(),
                    key: None,
                    content,
                    id: None,
                    origin: None,
                    binary: Default::default(),
                }
                .to_payload();
                by_consumer.entry(r.consumer_id).or_default().push(payload);
            };
            push(first);
            for _ in 1..BATCH {
                match rx.try_recv() {
                    Ok(r) => push(r),
                    Err(_) => break,
                }
            }
            for (consumer_id, payloads) in by_consumer {
                let Ok(topic) = Topic::new(format!("__logs.{consumer_id}")) else {
                    continue;
                };
                let stored = match registry.cluster_append() {
                    // A cluster's: through the metadata and the partition's leader
                    // (docs/cluster.md, "Delivery in a cluster").
                    Some(cluster) => {
                        let items = payloads
                            .into_iter()
                            .map(|payload| Appended {
                                route: None,
                                payload,
                            })
                            .collect::<Vec<_>>();
                        let lines = items.len();
                        cluster
                            .append(&topic, 1, items)
                            .await
                            .map(|_| ())
                            .map_err(|e| (e, lines))
                    }
                    None => {
                        let lines = payloads.len();
                        match registry.get_or_create(&topic).await {
                            Ok(t) => t.first().log.append_batch(&payloads).await.map(|_| ()),
                            Err(e) => Err(e),
                        }
                        .map_err(|e| (e.to_string(), lines))
                    }
                };
                if let Err((e, lines)) = stored {
                    tracing::debug!(topic = %topic, error = %e, lines, "plugin log lines not stored");
                }
            }
        }
    });
}
