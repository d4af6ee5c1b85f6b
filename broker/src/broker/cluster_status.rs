//! `GET /mmmq/dispatchers` on a cluster member (docs/cluster.md, "Delivery in a cluster"): each
//! partition is delivered by one broker, whose counters, lag and errors are the partition's;
//! any broker answers for the whole cluster by asking the others for their own status.

use std::collections::BTreeSet;

use mmmq_core::{DispatcherStatus, TopicStatus};

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
    let others: BTreeSet<u64> = mine
        .iter()
        .flat_map(|d| d.topics.iter().filter_map(|t| t.delivered_by))
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
    }
    mine
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
