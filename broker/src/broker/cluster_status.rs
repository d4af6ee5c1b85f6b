//! `GET /mmmq/dispatchers` on a cluster member (docs/cluster.md, "Delivery in a cluster"): each
//! partition is delivered by one broker, whose counters, lag and errors are the partition's;
//! any broker answers for the whole cluster by asking the others for their own status.

use std::collections::BTreeSet;

use mmmq_core::{DispatcherStatus, RedriveStatus, TopicStatus};

use super::Broker;
use crate::cluster::node::Cluster;

impl Broker {
    /// Status of every dispatcher: this broker's, each partition another broker delivers
    /// taken from that broker's own status.
    pub async fn dispatchers(&self) -> Vec<DispatcherStatus> {
        let mine = self.local_dispatchers().await;
        match self.cluster() {
            Some(cluster) => merged(cluster, mine).await,
            None => mine,
        }
    }

    /// Status of every dispatcher as this broker runs it (`?local=true`).
    pub async fn local_dispatchers(&self) -> Vec<DispatcherStatus> {
        self.dispatch.status_with_redrive_next().await
    }
}

async fn merged(cluster: &Cluster, mut mine: Vec<DispatcherStatus>) -> Vec<DispatcherStatus> {
    let me = cluster.id();
    let metadata = cluster.metadata();
    // A redrive's counters are the brokers' that deliver its dead-letter partitions.
    let redrivers = |d: &DispatcherStatus| -> BTreeSet<u64> {
        let dlq = mmmq_core::ConsumerId::new(&d.consumer_id)
            .map(|id| mmmq_core::Topic::dead_letter(&id).to_string())
            .unwrap_or_default();
        match (&d.redrive, metadata.deliveries.get(&dlq)) {
            (Some(_), Some(parts)) => parts.values().map(|p| p.broker).collect(),
            _ => BTreeSet::new(),
        }
    };
    let others: BTreeSet<u64> = mine
        .iter()
        .flat_map(|d| {
            d.topics
                .iter()
                .filter_map(|t| t.delivered_by)
                .chain(redrivers(d))
        })
        .filter(|b| *b != me)
        .collect();
    let asks = others
        .iter()
        .map(|b| cluster.ask_local::<Vec<DispatcherStatus>>(*b, "/mmmq/dispatchers?local=true"));
    let answers = futures_util::future::join_all(asks).await;
    let theirs: Vec<(u64, Vec<DispatcherStatus>)> = others
        .into_iter()
        .zip(answers)
        .filter_map(|(b, a)| Some((b, a?)))
        .collect();
    for d in &mut mine {
        for t in &mut d.topics {
            let Some(by) = t.delivered_by.filter(|b| *b != me) else {
                continue;
            };
            let found = theirs
                .iter()
                .filter(|(b, _)| *b == by)
                .flat_map(|(_, all)| all.iter())
                .filter(|o| o.consumer_id == d.consumer_id)
                .flat_map(|o| o.topics.iter())
                .find(|o| o.topic == t.topic && o.partition == t.partition);
            if let Some(found) = found {
                *t = found.clone();
            }
        }
        summed(d);
        let by = redrivers(d);
        if let Some(r) = &mut d.redrive {
            let started_at = r.started_at;
            let same = theirs
                .iter()
                .filter(|(b, _)| by.contains(b))
                .flat_map(|(_, all)| all.iter())
                .filter(|o| o.consumer_id == d.consumer_id)
                .filter_map(|o| o.redrive.as_ref())
                .filter(|o| o.started_at == started_at);
            redrive_merged(r, same);
        }
    }
    mine
}

/// A redrive's status with the figures of the other brokers that ran it (the same run: the same
/// start): counters summed, each partition as far as the furthest saw it.
fn redrive_merged<'a>(r: &mut RedriveStatus, others: impl Iterator<Item = &'a RedriveStatus>) {
    for o in others {
        r.delivered += o.delivered;
        r.nacked += o.nacked;
        r.dead_lettered += o.dead_lettered;
        r.dropped += o.dropped;
        for p in &mut r.partitions {
            if let Some(q) = o.partitions.iter().find(|q| q.partition == p.partition) {
                p.next = p.next.max(q.next);
            }
        }
        let newer = o.last_error.is_some()
            && (r.last_error.is_none()
                || (o.last_error_resolved_at.is_none(), o.last_error_at)
                    > (r.last_error_resolved_at.is_none(), r.last_error_at));
        if newer {
            r.last_error.clone_from(&o.last_error);
            r.last_error_at = o.last_error_at;
            r.last_error_resolved_at = o.last_error_resolved_at;
        }
    }
    r.redriven = r.delivered + r.dead_lettered + r.dropped;
    r.remaining = r
        .partitions
        .iter()
        .map(|p| p.to.saturating_sub(p.next))
        .sum();
    // `running` stays this broker's: until the metadata holds the redrive's end (what decides
    // whether another may start), wherever the deliverer got to.
}

/// The dispatcher's sums and last error again, from its partitions'.
fn summed(d: &mut DispatcherStatus) {
    let sum = |f: fn(&TopicStatus) -> u64| d.topics.iter().map(f).sum();
    d.delivered = sum(|t| t.delivered);
    d.nacked = sum(|t| t.nacked);
    d.dead_lettered = sum(|t| t.dead_lettered);
    d.dropped = sum(|t| t.dropped);
    d.lag = sum(|t| t.lag);
    // The most recent problem not resolved, else the most recent one.
    let latest = |resolved: bool| {
        d.topics
            .iter()
            .filter(|t| t.last_error.is_some() && (resolved || t.last_error_resolved_at.is_none()))
            .max_by_key(|t| t.last_error_at)
    };
    if let Some(t) = latest(false).or_else(|| latest(true)) {
        d.last_error = t.last_error.clone();
        d.last_error_at = t.last_error_at;
        d.last_error_resolved_at = d
            .topics
            .iter()
            .all(|t| t.last_error.is_none() || t.last_error_resolved_at.is_some())
            .then(|| {
                d.topics
                    .iter()
                    .filter_map(|t| t.last_error_resolved_at)
                    .max()
            })
            .flatten();
    }
}
