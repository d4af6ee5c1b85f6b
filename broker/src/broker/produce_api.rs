//! Producing (docs/http-api.md, "HTTP API", "Topics", "Idempotent produce"): routing to partitions,
//! produce ids, and batches appended a partition's share per commit.

use std::sync::Arc;

use mmmq_core::{Topic, now_ms, write_produced_payload};

use super::{Broker, BrokerError, Produced};
use crate::metrics::Metrics;
use crate::produce::ProduceItem;
use crate::storage::{Settle, StorageError};
use crate::topics::dedup::Claim;
use crate::topics::{Partition, TopicLog};

impl Broker {
    /// Appends one message to the partition it routes to (docs/topics-and-groups.md, "Topics"); resolves with
    /// where it went once it is durable.
    ///
    /// A message with an id is claimed, and its claim resolved by the append itself (its
    /// [`Settle`] hook), whatever happens to this future: a request dropped after the claim (its
    /// deadline, a client that went away) would otherwise leave the id pending, and a retry would
    /// wait out the whole dedupe window and then store a second copy — the very case ids exist
    /// for. No await comes between the claim and the append taking charge of it.
    pub async fn produce(&self, item: ProduceItem) -> Result<Produced, BrokerError> {
        if let Some(cluster) = self.cluster() {
            let mut one = self
                .produce_clustered(cluster, std::slice::from_ref(&item))
                .await?;
            return Ok(one.pop().expect("one item, one answer"));
        }
        let topic = self.registry.get_or_create(item.topic()).await?;
        if item.id().is_none() {
            return append_one(&topic, &self.metrics, &item).await;
        }
        let window = self.registry.config_of(&topic).dedup_window_ms;
        produce_with_id(&topic, &self.metrics, &item, window).await
    }

    /// Appends messages, each partition's share at consecutive offsets in one commit,
    /// partitions in parallel. Resolves with where each message went, in request order.
    ///
    /// Every message is routed before anything is appended (a partition that does not exist
    /// refuses the whole batch). Each partition's share is atomic; the batch as a whole is not
    /// (partitions are independent logs). When a commit fails the answer is exact:
    /// [`BrokerError::PartialBatch`] says where every element that was stored went, so a retry
    /// of the others duplicates nothing.
    pub async fn produce_batch(
        &self,
        items: Vec<ProduceItem>,
    ) -> Result<Vec<Produced>, BrokerError> {
        if let Some(cluster) = self.cluster() {
            return self.produce_clustered(cluster, &items).await;
        }
        let mut names: Vec<Topic> = Vec::new();
        for item in &items {
            if !names.contains(item.topic()) {
                names.push(item.topic().clone());
            }
        }
        // Every topic exists (or the batch is refused, e.g. past the topic cap) and every
        // message has its partition before anything is appended.
        let topics = self.registry.get_or_create_all(&names).await?;
        let mut routes = Vec::with_capacity(items.len());
        for item in &items {
            let t = &topics[names.iter().position(|n| n == item.topic()).expect("named")];
            routes.push(t.route(item.partition(), item.key())?);
        }
        let windows: Vec<u64> = topics
            .iter()
            .map(|t| self.registry.config_of(t).dedup_window_ms)
            .collect();
        // From the first claim on, the batch runs to its end in a task of its own, whatever
        // happens to this future (see [`Broker::produce`]).
        let metrics = self.metrics.clone();
        tokio::spawn(commit_batch(metrics, items, names, topics, routes, windows))
            .await
            .expect("produce task panicked")
    }
}

/// Claims the id of `item` and appends it if it is new, else answers where its first message
/// went. A new claim is resolved by the append (see [`Broker::produce`]).
async fn produce_with_id(
    topic: &Arc<TopicLog>,
    metrics: &Arc<Metrics>,
    item: &ProduceItem,
    window: u64,
) -> Result<Produced, BrokerError> {
    let id = item.id().expect("called for items with an id");
    loop {
        let seen = match topic.dedup.claim(id, now_ms(), window) {
            Claim::Stored(partition, offset) => Some((partition, offset)),
            // `None`: the first one failed: this one may store it.
            Claim::Pending(ticket) => topic.dedup.wait(&ticket).await,
            Claim::New(ticket) => {
                let partition = match topic.route(item.partition(), item.key()) {
                    Ok(partition) => partition,
                    Err(e) => {
                        topic.dedup.withdraw(&ticket);
                        return Err(e.into());
                    }
                };
                let (t, number) = (topic.clone(), partition.number);
                let (metrics, name) = (metrics.clone(), item.topic().clone());
                // Counted here: the message is stored even if the request went away.
                let settle: Settle = Box::new(move |outcome| match outcome {
                    Ok((offset, bytes)) => {
                        t.dedup.stored(&ticket, number, offset);
                        metrics.count_in(&name, 1, bytes);
                    }
                    Err(_) => t.dedup.withdraw(&ticket),
                });
                return append_to(&partition, None, item, Some(settle)).await;
            }
        };
        if let Some((partition, offset)) = seen {
            return Ok(Produced {
                partition,
                offset,
                duplicate: true,
            });
        }
    }
}

async fn append_one(
    topic: &TopicLog,
    metrics: &Metrics,
    item: &ProduceItem,
) -> Result<Produced, BrokerError> {
    let partition = topic.route(item.partition(), item.key())?;
    append_to(&partition, Some(metrics), item, None).await
}

/// Appends `item` to `partition`, its payload written straight into the frame; counts it in
/// `metrics` if given (else `settle` does).
async fn append_to(
    partition: &Partition,
    metrics: Option<&Metrics>,
    item: &ProduceItem,
    settle: Option<Settle>,
) -> Result<Produced, BrokerError> {
    let mut len = 0;
    let capacity = item.content().get().len()
        + item.key().map_or(0, str::len)
        + item.id().map_or(0, str::len)
        + 64;
    let offset = partition
        .log
        .append_with(
            capacity,
            |out| {
                let start = out.len();
                write_produced_payload(out, now_ms(), item.key(), item.content(), item.id());
                len = out.len() - start;
            },
            settle,
        )
        .await?;
    if let Some(metrics) = metrics {
        metrics.count_in(item.topic(), 1, len);
    }
    Ok(Produced {
        partition: partition.number,
        offset,
        duplicate: false,
    })
}

/// The part of a batch from its claims on: appends each partition's share, resolves every
/// claim, answers where each element went.
async fn commit_batch(
    metrics: Arc<Metrics>,
    items: Vec<ProduceItem>,
    names: Vec<Topic>,
    topics: Vec<Arc<TopicLog>>,
    routes: Vec<Arc<Partition>>,
    windows: Vec<u64>,
) -> Result<Vec<Produced>, BrokerError> {
    let topic_of = |item: &ProduceItem| {
        topics[names.iter().position(|n| n == item.topic()).expect("named")].clone()
    };
    let now = now_ms();
    // Ids: a new one is appended and then published; one seen (before, or earlier in this
    // batch) waits for where its first message went.
    let mut claims: Vec<Option<Claim>> = Vec::with_capacity(items.len());
    for item in &items {
        claims.push(item.id().map(|id| {
            let i = names.iter().position(|n| n == item.topic()).expect("named");
            topics[i].dedup.claim(id, now, windows[i])
        }));
    }
    let mut groups: Vec<(Topic, Arc<Partition>, Vec<usize>)> = Vec::new();
    for (i, (item, partition)) in items.iter().zip(routes).enumerate() {
        if matches!(claims[i], Some(Claim::Pending(_) | Claim::Stored(..))) {
            continue;
        }
        match groups
            .iter_mut()
            .find(|(n, p, _)| n == item.topic() && Arc::ptr_eq(p, &partition))
        {
            Some((_, _, v)) => v.push(i),
            None => groups.push((item.topic().clone(), partition, vec![i])),
        }
    }
    let mut set = tokio::task::JoinSet::new();
    for (topic, partition, indexes) in groups {
        let payloads: Vec<Vec<u8>> = indexes.iter().map(|&i| stored_payload(&items[i])).collect();
        set.spawn(async move {
            let bytes: usize = payloads.iter().map(Vec::len).sum();
            let first = partition.log.append_batch(&payloads).await;
            (topic, partition.number, indexes, bytes, first)
        });
    }
    let mut stored = vec![None; items.len()];
    let mut failure = None;
    while let Some(joined) = set.join_next().await {
        let (topic, partition, indexes, bytes, first) = joined.expect("append task panicked");
        match first {
            Ok(first) => {
                metrics.count_in(&topic, indexes.len() as u64, bytes);
                for (k, &i) in indexes.iter().enumerate() {
                    let offset = first + k as u64;
                    if let Some(Claim::New(ticket)) = &claims[i] {
                        topic_of(&items[i]).dedup.stored(ticket, partition, offset);
                    }
                    stored[i] = Some(Produced {
                        partition,
                        offset,
                        duplicate: false,
                    });
                }
            }
            Err(e) => {
                for &i in &indexes {
                    if let Some(Claim::New(ticket)) = &claims[i] {
                        topic_of(&items[i]).dedup.withdraw(ticket);
                    }
                }
                failure = failure.or(Some(e));
            }
        }
    }
    for (i, claim) in claims.iter().enumerate() {
        let seen = match claim {
            Some(Claim::Stored(p, o)) => Some((*p, *o)),
            // `None`: the first one's append failed; this element was not stored either.
            Some(Claim::Pending(ticket)) => topic_of(&items[i]).dedup.wait(ticket).await,
            _ => continue,
        };
        stored[i] = seen.map(|(partition, offset)| Produced {
            partition,
            offset,
            duplicate: true,
        });
    }
    if failure.is_none() && stored.iter().any(Option::is_none) {
        failure = Some(StorageError::Closed);
    }
    match failure {
        None => Ok(stored
            .into_iter()
            .map(|o| o.expect("every partition stored"))
            .collect()),
        Some(error) => Err(BrokerError::PartialBatch { error, stored }),
    }
}

pub(super) fn stored_payload(item: &ProduceItem) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        item.content().get().len()
            + item.key().map_or(0, str::len)
            + item.id().map_or(0, str::len)
            + 64,
    );
    write_produced_payload(&mut out, now_ms(), item.key(), item.content(), item.id());
    out
}
