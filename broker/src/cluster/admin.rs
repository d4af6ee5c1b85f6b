//! The operator's membership commands (contract §13; docs/cluster.md, "Membership"), run by
//! whichever broker takes them: each step is a metadata change proposed through the metadata
//! group's leader, or a member change made by a group's leader ([`Cluster::change_members`]).
//! Every step can be run again, so a command cut short (a broker dying, a timeout) is finished
//! by running it again.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use super::membership::MembersChange;
use super::meta_state::{MetaCommand, MetaOutcome, MetaState};
use super::network::{GroupId, SendError};
use super::node::{Cluster, ClusterError};
use super::types::BrokerId;

/// How long a removal waits for the removed broker to let go of its replicas.
const RELEASE_WAIT: Duration = Duration::from_secs(10);

/// How long an added broker is given to say which cluster it belongs to.
const PROBE_WAIT: Duration = Duration::from_secs(2);

fn done(outcome: MetaOutcome) -> Result<(), ClusterError> {
    match outcome {
        MetaOutcome::Done => Ok(()),
        MetaOutcome::Refused(why) => Err(ClusterError::Refused(why)),
        MetaOutcome::TopicExists => Err(ClusterError::Refused("the topic exists".into())),
        MetaOutcome::Each(_) => Err(ClusterError::Failed("an answer per part".into())),
    }
}

impl Cluster {
    /// Runs an operator's command in a task of its own: a request dropped part way (its
    /// deadline, a client gone) does not stop a move between two steps.
    async fn detached<F, T>(&self, f: impl FnOnce(Cluster) -> F) -> Result<T, ClusterError>
    where
        F: Future<Output = Result<T, ClusterError>> + Send + 'static,
        T: Send + 'static,
    {
        tokio::spawn(f(self.clone()))
            .await
            .map_err(|e| ClusterError::Failed(format!("a membership task failed: {e}")))?
    }

    /// `mmmq cluster reassign`: moves partition `p` of `topic` to `replicas` (preferred leader
    /// first) while it takes produces. The target is recorded in the metadata (its new brokers
    /// start the group, empty); the partition's leader adds each new one as a learner and, once
    /// it caught up, makes `replicas` the voters in one joint-consensus change; then the
    /// metadata's placement follows, and the brokers left out stop the group and delete its files.
    pub async fn reassign(
        &self,
        topic: &str,
        p: u32,
        replicas: Vec<BrokerId>,
    ) -> Result<(), ClusterError> {
        let topic = topic.to_owned();
        self.detached(move |c| async move { c.reassign_now(&topic, p, replicas).await })
            .await
    }

    async fn reassign_now(
        &self,
        topic: &str,
        p: u32,
        replicas: Vec<BrokerId>,
    ) -> Result<(), ClusterError> {
        let meta = self.metadata();
        let t = meta
            .topics
            .get(topic)
            .ok_or_else(|| ClusterError::NotFound(format!("no topic {topic:?}")))?;
        if p as usize >= t.placement.len() {
            return Err(ClusterError::NotFound(format!(
                "topic {topic:?} has no partition {p}"
            )));
        }
        meta.check_replicas(topic, p, &replicas)
            .map_err(ClusterError::Refused)?;
        let addrs: BTreeMap<BrokerId, String> = replicas
            .iter()
            .map(|b| (*b, meta.brokers[b].addr.clone()))
            .collect();
        done(
            self.propose(MetaCommand::Reassign {
                topic: topic.to_owned(),
                partition: p,
                replicas: replicas.clone(),
            })
            .await?,
        )?;
        let group = GroupId::Partition(topic.to_owned(), p);
        self.change_members(group, MembersChange::Replicas(addrs))
            .await?;
        done(
            self.propose(MetaCommand::FinishReassign {
                topic: topic.to_owned(),
                partition: p,
                replicas,
            })
            .await?,
        )?;
        tracing::info!(topic, partition = p, "partition reassigned");
        Ok(())
    }

    /// `mmmq cluster add-broker`: broker `id`, started at `addr` with `--peers` naming the
    /// cluster's brokers and itself, joins the metadata group (a learner caught up, then a
    /// voter if the group has fewer than it should: see
    /// [`super::membership::meta_voters`]) and the metadata names it, so new topics place
    /// replicas on it.
    pub async fn add_broker(&self, id: BrokerId, addr: String) -> Result<(), ClusterError> {
        self.detached(move |c| async move { c.add_broker_now(id, addr).await })
            .await
    }

    async fn add_broker_now(&self, id: BrokerId, addr: String) -> Result<(), ClusterError> {
        let meta = self.metadata();
        if meta.retired.contains(&id) {
            return Err(ClusterError::Refused(format!(
                "broker id {id} was removed and is never reused"
            )));
        }
        if let Some(b) = meta.brokers.get(&id)
            && b.addr != addr
        {
            return Err(ClusterError::Refused(format!(
                "broker {id} is in the cluster already, at {}",
                b.addr
            )));
        }
        // The lowest id of a broker's --peers initializes a new cluster when its metadata is
        // empty: a new broker with the lowest id would start a cluster of its own.
        let lowest = meta
            .brokers
            .keys()
            .chain(self.voters().iter())
            .min()
            .copied();
        if let Some(lowest) = lowest
            && id < lowest
        {
            return Err(ClusterError::Refused(format!(
                "a new broker's id must be higher than {lowest}: the lowest id of --peers \
                 initializes a new cluster"
            )));
        }
        self.inner.router.set_peer(id, &addr);
        // A broker of another cluster at that address would refuse the learner's appends until
        // the catch-up wait ran out: asked first, it says so at once (docs/cluster.md, "The
        // cluster's id"). One that does not answer is waited for as before.
        if let Err(SendError::OtherCluster(_, why)) =
            self.inner.router.ping(id, self.id(), PROBE_WAIT).await
        {
            return Err(ClusterError::Refused(format!(
                "broker {id} at {addr} belongs to another cluster: {why}"
            )));
        }
        self.change_members(GroupId::Meta, MembersChange::Join(id, addr.clone()))
            .await?;
        done(self.propose(MetaCommand::AddBroker { id, addr }).await?)?;
        tracing::info!(broker = id, "broker added");
        Ok(())
    }

    /// `mmmq cluster remove-broker`: every partition with a replica on broker `id` moves it to
    /// the broker holding the fewest replicas (a [`Cluster::reassign`] each), then the metadata
    /// retires the id and the broker leaves the metadata group. Refused when fewer brokers than
    /// some topic's replication factor would remain.
    pub async fn remove_broker(&self, id: BrokerId) -> Result<(), ClusterError> {
        self.detached(move |c| async move { c.remove_broker_now(id).await })
            .await
    }

    async fn remove_broker_now(&self, id: BrokerId) -> Result<(), ClusterError> {
        let meta = self.metadata();
        if !meta.retired.contains(&id) {
            if !meta.brokers.contains_key(&id) {
                return Err(ClusterError::NotFound(format!("no broker {id}")));
            }
            check_removal(&meta, id)?;
            let moves = meta.replicas_on(id).into_iter().map(|(topic, p)| {
                let c = self.clone();
                async move {
                    let meta = c.metadata();
                    let replicas = replacement(&meta, &topic, p, id);
                    c.reassign_now(&topic, p, replicas).await
                }
            });
            for result in futures_util::future::join_all(moves).await {
                result?;
            }
            done(self.propose(MetaCommand::RemoveBroker { id }).await?)?;
        }
        // The broker lets go of its replicas once it applied their moves; out of the metadata
        // group it would hear of no more commits and could keep them. Waited for a while only:
        // a broker that is down lets go at its next boot.
        let deadline = Instant::now() + RELEASE_WAIT;
        while Instant::now() < deadline {
            match self.ask_view(id).await {
                Some(v) if v.partitions.iter().any(|p| p.term.is_some()) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                _ => break,
            }
        }
        // A retired id may still be a member (a removal cut short): this finishes it.
        self.change_members(GroupId::Meta, MembersChange::Leave(id))
            .await?;
        tracing::info!(broker = id, "broker removed");
        Ok(())
    }
}

/// Refuses removing broker `id` when it is the last one, or when fewer brokers than a topic's
/// replication factor would remain (its partitions would have nowhere to go).
fn check_removal(meta: &MetaState, id: BrokerId) -> Result<(), ClusterError> {
    let remaining = meta.brokers.len().saturating_sub(1);
    if remaining == 0 {
        return Err(ClusterError::Refused(format!(
            "broker {id} is the last broker of the cluster"
        )));
    }
    for (name, t) in &meta.topics {
        if t.replication_factor as usize > remaining {
            return Err(ClusterError::Refused(format!(
                "topic {name:?} has replicationFactor {}: without broker {id} the cluster would \
                 have {remaining} brokers",
                t.replication_factor
            )));
        }
    }
    Ok(())
}

/// Partition `p` of `topic`'s replicas with `id` replaced (at its place, so the preferred
/// leader stays first) by the broker holding the fewest replicas that is not one already.
fn replacement(meta: &MetaState, topic: &str, p: u32, id: BrokerId) -> Vec<BrokerId> {
    // A move already under way that drops `id` (a removal run again) is finished as it was.
    if let Some(target) = meta.topics[topic].moving.get(&p)
        && !target.contains(&id)
    {
        return target.clone();
    }
    let current = meta.topics[topic].placement[p as usize].clone();
    if !current.contains(&id) {
        // Only a move in flight adds `id`: finishing it at the placement drops it.
        return current;
    }
    let mut load: BTreeMap<BrokerId, usize> = meta
        .brokers
        .keys()
        .filter(|b| **b != id && !current.contains(b))
        .map(|b| (*b, 0))
        .collect();
    for t in meta.topics.values() {
        for r in t.placement.iter().flatten() {
            if let Some(n) = load.get_mut(r) {
                *n += 1;
            }
        }
    }
    let Some(to) = load.iter().min_by_key(|(b, n)| (**n, **b)).map(|(b, _)| *b) else {
        return current;
    };
    current
        .into_iter()
        .map(|b| if b == id { to } else { b })
        .collect()
}
