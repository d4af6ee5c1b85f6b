//! The broker as a cluster member (docs/cluster.md, "Topics and produce in a cluster"): topics
//! live in the metadata group, every broker keeps its local topics in step with it, and a
//! produce is written through the partition's Raft group, acknowledged once a majority of its
//! replicas hold it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mmmq_core::{Topic, TopicConfig, TopicId};
use tokio_util::sync::CancellationToken;

use super::produce_api::stored_payload;
use super::{Broker, BrokerError, Produced};
use crate::cluster::delivery::{PartitionDelivery, PositionWriter};
use crate::cluster::ids::PartitionIds;
use crate::cluster::meta_state::{MetaCommand, MetaOutcome, MetaState};
use crate::cluster::network::GroupId;
use crate::cluster::node::{Cluster, ClusterError};
use crate::cluster::types::{Applied, Command};
use crate::dispatch::Dispatch;
use crate::produce::ProduceItem;
use crate::storage::Vfs;
use crate::topics::settings::TopicUpdate;
use crate::topics::{Registry, TopicLog};

/// How long a produce to a new topic waits for the metadata to create it here.
const CREATE_WAIT: Duration = Duration::from_secs(5);

impl Broker {
    /// Produces `items` through their partitions' leaders; answers in request order.
    pub(super) async fn produce_clustered(
        &self,
        cluster: &Cluster,
        items: &[ProduceItem],
    ) -> Result<Vec<Produced>, BrokerError> {
        let mut topics: Vec<Arc<TopicLog>> = Vec::with_capacity(items.len());
        for item in items {
            let t = match topics.iter().find(|t| &t.topic == item.topic()) {
                Some(t) => t.clone(),
                None => self.clustered_topic(cluster, item.topic()).await?,
            };
            topics.push(t);
        }
        // The produce runs to its end in a task of its own, whatever happens to this future (a
        // request dropped mid-write: its deadline, a client gone), so that its answer is
        // counted in the metrics and the hint of its partition's leader kept.
        let metrics = self.metrics.clone();
        let root = self.config.root_dir.clone();
        let (cluster, items) = (cluster.clone(), items.to_vec());
        tokio::spawn(
            async move { commit_clustered(&cluster, &metrics, &items, topics, root).await },
        )
        .await
        .expect("produce task panicked")
    }

    /// The local topic of a clustered topic, created in the metadata first (with the broker's
    /// defaults) if the cluster does not have it.
    async fn clustered_topic(
        &self,
        cluster: &Cluster,
        topic: &Topic,
    ) -> Result<Arc<TopicLog>, BrokerError> {
        let defaults = &self.config.topic_defaults;
        ensure_topic(cluster, &self.registry, defaults, topic).await
    }

    /// Waits until the metadata's topic exists here with `partitions` partitions (the follower
    /// task makes it).
    pub(super) async fn local_topic(
        &self,
        topic: &Topic,
        partitions: u32,
    ) -> Result<Arc<TopicLog>, BrokerError> {
        local_topic(&self.registry, topic, partitions).await
    }
}

/// The local topic of a clustered topic, created in the metadata first (with `config`) if the
/// cluster does not have it.
pub(super) async fn ensure_topic(
    cluster: &Cluster,
    registry: &Registry,
    config: &TopicConfig,
    topic: &Topic,
) -> Result<Arc<TopicLog>, BrokerError> {
    let wanted = match cluster.metadata().topics.get(topic.as_str()) {
        Some(t) => t.placement.len() as u32,
        None => {
            cluster.wait_for_brokers(CREATE_WAIT).await;
            let value =
                serde_json::to_value(config).map_err(|e| ClusterError::Failed(e.to_string()))?;
            let id = crate::topics::incarnation::random()?;
            let put = MetaCommand::PutTopic {
                name: topic.to_string(),
                config: value,
                replication_factor: Some(default_replication(cluster)),
                id: Some(id.to_string()),
            };
            match cluster.propose(put).await? {
                MetaOutcome::Done => config.partitions,
                MetaOutcome::TopicExists => topic_in_metadata(cluster, topic).await?,
                MetaOutcome::Refused(why) => return Err(ClusterError::Refused(why).into()),
                other => return Err(unexpected(other)),
            }
        }
    };
    local_topic(registry, topic, wanted).await
}

/// Waits until the metadata's topic exists here with `partitions` partitions (the follower task
/// makes it).
async fn local_topic(
    registry: &Registry,
    topic: &Topic,
    partitions: u32,
) -> Result<Arc<TopicLog>, BrokerError> {
    let deadline = Instant::now() + CREATE_WAIT;
    loop {
        if let Some(t) = registry.get(topic)
            && t.partition_count() >= partitions
        {
            return Ok(t);
        }
        if Instant::now() > deadline {
            return Err(ClusterError::Failed(format!(
                "topic {topic:?} is in the cluster's metadata but was not opened here in {} s",
                CREATE_WAIT.as_secs()
            ))
            .into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

impl Broker {
    /// `PUT /mmmq/topics/{topic}` in a cluster: the change is proposed to the metadata (from the
    /// metadata's configuration of the topic, or the defaults), and answered once this broker
    /// opened the topic as the metadata says.
    pub(super) async fn put_clustered_topic(
        &self,
        cluster: &Cluster,
        topic: &Topic,
        update: &TopicUpdate,
    ) -> Result<Arc<TopicLog>, BrokerError> {
        // A create found the topic there: this broker's metadata lagged; once it caught up,
        // the update applies to the topic as it is.
        for _ in 0..2 {
            if let Some(t) = self.try_put_clustered_topic(cluster, topic, update).await? {
                return Ok(t);
            }
            topic_in_metadata(cluster, topic).await?;
        }
        Err(ClusterError::Failed(format!(
            "topic {topic:?} changed under the update; try again"
        ))
        .into())
    }

    /// One try of [`Self::put_clustered_topic`]: `None` when a create found the topic there.
    async fn try_put_clustered_topic(
        &self,
        cluster: &Cluster,
        topic: &Topic,
        update: &TopicUpdate,
    ) -> Result<Option<Arc<TopicLog>>, BrokerError> {
        let existing = cluster.metadata().topics.get(topic.as_str()).cloned();
        let next = match &existing {
            Some(t) => {
                let current: TopicConfig = serde_json::from_value(t.config.clone())
                    .map_err(|e| ClusterError::Failed(format!("topic {topic:?}: {e}")))?;
                update.apply(&current)?
            }
            None => update.create(&self.config.topic_defaults)?,
        };
        if existing.is_none() {
            cluster.wait_for_brokers(CREATE_WAIT).await;
        }
        let id = match existing {
            Some(_) => None,
            None => Some(crate::topics::incarnation::random()?.to_string()),
        };
        let replication_factor = match (update.replication_factor(), &id) {
            (Some(rf), _) => Some(rf),
            (None, Some(_)) => Some(default_replication(cluster)),
            (None, None) => None,
        };
        let put = MetaCommand::PutTopic {
            name: topic.to_string(),
            config: serde_json::to_value(&next).map_err(|e| ClusterError::Failed(e.to_string()))?,
            replication_factor,
            id,
        };
        match cluster.propose(put).await? {
            MetaOutcome::Done => {}
            MetaOutcome::TopicExists => return Ok(None),
            MetaOutcome::Refused(why) => return Err(ClusterError::Refused(why).into()),
            other => return Err(unexpected(other)),
        }
        let deadline = Instant::now() + CREATE_WAIT;
        loop {
            let t = self.local_topic(topic, next.partitions).await?;
            if self.registry.config_of(&t) == next || Instant::now() > deadline {
                return Ok(Some(t));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// `DELETE /mmmq/topics/{topic}` in a cluster: proposed to the metadata; answered once this
    /// broker deleted its own copy (every other broker deletes its copy as it applies it).
    pub(super) async fn delete_clustered_topic(
        &self,
        cluster: &Cluster,
        topic: &Topic,
    ) -> Result<(), BrokerError> {
        let delete = MetaCommand::DeleteTopic {
            name: topic.to_string(),
        };
        match cluster.propose(delete).await? {
            MetaOutcome::Done => {}
            MetaOutcome::Refused(_) | MetaOutcome::TopicExists => {
                return Err(BrokerError::UnknownTopic(topic.to_string()));
            }
            other => return Err(unexpected(other)),
        }
        let deadline = Instant::now() + CREATE_WAIT;
        while self.registry.get(topic).is_some() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }
}

/// Whether two states of the metadata have the same brokers and topics (they may differ in
/// dispatchers' positions and pull groups' commits).
fn same_topics(a: &MetaState, b: &MetaState) -> bool {
    a.topics == b.topics
        && a.brokers == b.brokers
        && a.retired == b.retired
        && a.created == b.created
        && a.cluster_id == b.cluster_id
}

/// An answer the metadata gives another kind of command only.
fn unexpected(outcome: MetaOutcome) -> BrokerError {
    ClusterError::Failed(format!("the metadata answered {outcome:?}")).into()
}

/// Waits until this broker's metadata has `topic` (it lagged behind the metadata leader's);
/// answers its partition count.
async fn topic_in_metadata(cluster: &Cluster, topic: &Topic) -> Result<u32, BrokerError> {
    let mut metadata = cluster.watch_metadata();
    let wait = metadata.wait_for(|m| m.topics.contains_key(topic.as_str()));
    match tokio::time::timeout(CREATE_WAIT, wait).await {
        Ok(Ok(m)) => Ok(m.topics[topic.as_str()].placement.len() as u32),
        _ => Err(ClusterError::Failed(format!(
            "topic {topic:?} is in the cluster's metadata but not yet in this broker's"
        ))
        .into()),
    }
}

/// The produce: each partition's share written through its leader, which decides on produce
/// ids (docs/cluster.md, "Produce ids in a cluster"); answers in request order.
///
/// A message with an id and neither a key nor a partition goes where its id's hash sends it
/// (contract §4 lets a keyless message go to any partition), so that a retry through another
/// broker reaches the same partition's leader, whose log knows the id. Within one request, a
/// repeated id is sent once and answered as the first's duplicate.
async fn commit_clustered(
    cluster: &Cluster,
    metrics: &crate::metrics::Metrics,
    items: &[ProduceItem],
    topics: Vec<Arc<TopicLog>>,
    root: std::path::PathBuf,
) -> Result<Vec<Produced>, BrokerError> {
    let mut answers: Vec<Option<Produced>> = vec![None; items.len()];
    let mut groups: Vec<(GroupId, Vec<usize>)> = Vec::new();
    // Items whose id an earlier item of this request carries (to the same topic).
    let mut repeats: Vec<(usize, usize)> = Vec::new();
    let mut first_of: std::collections::HashMap<(&Topic, &str), usize> =
        std::collections::HashMap::new();
    for (i, (item, t)) in items.iter().zip(&topics).enumerate() {
        // Routed first: a repeat naming a partition the topic lacks is refused as on one broker.
        let route_key = item.key().or(item.id());
        let partition = t.route(item.partition(), route_key)?.number;
        if let Some(id) = item.id() {
            if let Some(&first) = first_of.get(&(item.topic(), id)) {
                repeats.push((i, first));
                continue;
            }
            first_of.insert((item.topic(), id), i);
        }
        let group = GroupId::Partition(item.topic().to_string(), partition);
        match groups.iter_mut().find(|(g, _)| *g == group) {
            Some((_, v)) => v.push(i),
            None => groups.push((group, vec![i])),
        }
    }
    let writes = groups.iter().map(|(group, indexes)| {
        let commands = indexes
            .iter()
            .map(|&i| Command::Message(stored_payload(&items[i]).into()))
            .collect();
        cluster.write(group.clone(), commands)
    });
    let results = futures_util::future::join_all(writes).await;
    let mut failure = None;
    for ((group, indexes), result) in groups.iter().zip(results) {
        let GroupId::Partition(_, partition) = group else {
            unreachable!("produce writes to partitions")
        };
        let applied = match result {
            Ok(applied) => applied,
            Err(e) => {
                failure = failure.or(Some(e));
                continue;
            }
        };
        for (&i, a) in indexes.iter().zip(applied) {
            answers[i] = match a {
                Applied::Offset(offset) => {
                    let bytes = items[i].content().get().len();
                    metrics.count_in(items[i].topic(), 1, bytes);
                    Some(Produced {
                        partition: *partition,
                        offset,
                        duplicate: false,
                    })
                }
                Applied::Duplicate { partition, offset } => Some(duplicate(partition, offset)),
                other => {
                    failure = failure.or(Some(ClusterError::Failed(format!(
                        "a message was applied as {other:?}"
                    ))));
                    None
                }
            };
        }
    }
    for (i, first) in repeats {
        answers[i] = answers[first].map(|a| duplicate(a.partition, a.offset));
    }
    match failure {
        None => Ok(answers.into_iter().map(|a| a.expect("answered")).collect()),
        Some(e) if answers.iter().all(Option::is_none) => Err(e.into()),
        Some(e) => Err(BrokerError::PartialBatch {
            error: crate::storage::StorageError::Refused {
                dir: root,
                reason: e.to_string(),
            },
            stored: answers,
        }),
    }
}

/// `min(3, brokers)` (contract §13), counting the cluster's brokers (the metadata group's
/// voters too), not only those that announced themselves yet.
fn default_replication(cluster: &Cluster) -> u8 {
    crate::cluster::meta_state::default_replication(cluster.broker_count())
}

fn duplicate(partition: u32, offset: u64) -> Produced {
    Produced {
        partition,
        offset,
        duplicate: true,
    }
}

/// The first wait before a topic that failed to follow the metadata is tried again.
const FOLLOW_RETRY_FIRST: Duration = Duration::from_millis(500);
/// The longest wait between two tries of a topic that keeps failing.
const FOLLOW_RETRY_MAX: Duration = Duration::from_secs(10);

/// Keeps the local topics in step with the metadata: every topic it names exists here with its
/// configuration and partitions, and each partition this broker replicates runs its Raft group;
/// a topic it no longer names is deleted here, and a replica moved away is released (its group
/// stopped, its files deleted) once the metadata is settled here (docs/cluster.md, "Membership").
/// A topic that fails (its files do not open, its group does not start) is logged and tried
/// again later, and never holds up the others.
pub(super) async fn follow(
    registry: Arc<Registry>,
    dispatch: Arc<Dispatch>,
    cluster: Cluster,
    vfs: Arc<dyn Vfs>,
    stop: CancellationToken,
) {
    let mut metadata = cluster.watch_metadata();
    let mut previous = metadata.borrow().clone();
    // Topics the metadata deleted that are not deleted here yet. Never "absent from the
    // metadata" alone: a broker replaying its metadata at boot starts from an empty state and
    // must not delete what the replay will name again.
    let mut deleted = std::collections::BTreeSet::new();
    let mut releases = super::cluster_release::Releases::default();
    let mut retry = FOLLOW_RETRY_FIRST;
    let writer = PositionWriter::start(cluster.clone());
    let mut first = true;
    loop {
        let state = metadata.borrow_and_update().clone();
        // Dispatchers' positions and pull groups' commits change the metadata many times a
        // second and concern no topic's files.
        if !first
            && retry == FOLLOW_RETRY_FIRST
            && !releases.pending()
            && same_topics(&previous, &state)
        {
            previous = state;
            tokio::select! {
                changed = metadata.changed() => if changed.is_err() { return },
                _ = stop.cancelled() => return,
            }
            continue;
        }
        first = false;
        deleted.extend(
            previous
                .topics
                .keys()
                .filter(|n| !state.topics.contains_key(*n))
                .cloned(),
        );
        deleted.retain(|n| !state.topics.contains_key(n));
        let failed = reconcile(
            (&registry, &dispatch),
            &cluster,
            &writer,
            &vfs,
            &mut deleted,
            &state,
        )
        .await;
        releases.moved_away(&previous, &state, cluster.id());
        previous = state;
        let waiting = !releases.run(&registry, &cluster, &vfs).await;
        let again = if failed == 0 {
            retry = FOLLOW_RETRY_FIRST;
            waiting.then_some(Duration::from_millis(200))
        } else {
            let wait = retry;
            retry = FOLLOW_RETRY_MAX.min(retry * 2);
            Some(if waiting {
                wait.min(Duration::from_millis(200))
            } else {
                wait
            })
        };
        let retry_later = async {
            match again {
                Some(wait) => tokio::time::sleep(wait).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = metadata.changed() => if changed.is_err() { return },
            _ = retry_later => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// Brings every topic in step with `state` and deletes those of `deleted` (each one done leaves
/// the set); answers how many failed, each logged.
async fn reconcile(
    (registry, dispatch): (&Registry, &Dispatch),
    cluster: &Cluster,
    writer: &PositionWriter,
    vfs: &Arc<dyn Vfs>,
    deleted: &mut std::collections::BTreeSet<String>,
    state: &MetaState,
) -> usize {
    let mut failed = 0;
    for name in deleted.clone() {
        match delete_topic((registry, dispatch), cluster, &name).await {
            Ok(()) => {
                deleted.remove(&name);
            }
            Err(error) => {
                failed += 1;
                tracing::warn!(topic = %name, %error, "deleting a topic the cluster deleted; trying again later");
            }
        }
    }
    for (name, meta) in &state.topics {
        if let Err(error) =
            follow_topic((registry, dispatch), cluster, writer, vfs, name, meta).await
        {
            failed += 1;
            tracing::warn!(topic = %name, %error, "following the cluster's metadata for a topic; trying again later");
        }
    }
    failed
}

async fn delete_topic(
    (registry, dispatch): (&Registry, &Dispatch),
    cluster: &Cluster,
    name: &str,
) -> Result<(), BrokerError> {
    let topic = Topic::new(name.to_owned()).map_err(|e| BrokerError::InvalidName(e.to_string()))?;
    // Its workers first, as on one broker: a topic created again gets new ones.
    dispatch.forget_topic(&topic).await;
    cluster.stop_topic(name).await;
    if let Some(old) = registry.begin_delete(&topic).await {
        old.close().await;
        registry.finish_delete(&old).await?;
        tracing::info!(topic = %name, "topic deleted (cluster metadata)");
    }
    Ok(())
}

/// Opens `name` here as the metadata describes it, and runs the groups of the partitions this
/// broker replicates.
async fn follow_topic(
    (registry, dispatch): (&Registry, &Dispatch),
    cluster: &Cluster,
    writer: &PositionWriter,
    vfs: &Arc<dyn Vfs>,
    name: &str,
    meta: &crate::cluster::meta_state::TopicMeta,
) -> Result<(), BrokerError> {
    let me = cluster.id();
    let topic = Topic::new(name.to_owned()).map_err(|e| BrokerError::InvalidName(e.to_string()))?;
    let config: TopicConfig = serde_json::from_value(meta.config.clone())
        .map_err(|e| ClusterError::Failed(format!("topic {name:?}'s configuration: {e}")))?;
    let partitions = meta.placement.len() as u32;
    let id: TopicId = meta
        .id
        .parse()
        .map_err(|_| ClusterError::Failed(format!("topic {name:?} has no usable id")))?;
    let local = match registry.get(&topic) {
        // A topic of another incarnation (deleted and created again while this broker was
        // away) goes, with its groups, before the new one opens.
        Some(t) if t.id != id => {
            dispatch.forget_topic(&topic).await;
            cluster.stop_topic(name).await;
            if let Some(old) = registry.begin_delete(&topic).await {
                registry.finish_delete(&old).await?;
            }
            registry
                .get_or_create_for_cluster(&topic, partitions, id)
                .await?
        }
        Some(t) => t,
        None => {
            registry
                .get_or_create_for_cluster(&topic, partitions, id)
                .await?
        }
    };
    let current = registry.config_of(&local);
    if current != config || local.partition_count() < partitions {
        let mut config = config.clone();
        config.partitions = partitions.max(config.partitions);
        registry.set_config(&local, config).await?;
    }
    for partition in local.partitions() {
        // Every broker's worker waits for its broker to lead the partition (docs/cluster.md,
        // "Delivery in a cluster"); a partition opened again (a new incarnation) gets its own.
        partition.delivery.set(PartitionDelivery::control(
            cluster.clone(),
            writer.clone(),
            name,
            &meta.id,
            partition.number,
        ));
    }
    for (p, replicas) in meta.placement.iter().enumerate() {
        let p = p as u32;
        if !meta.runs(p, me) {
            continue;
        }
        let partition = local
            .partition(p)
            .ok_or_else(|| ClusterError::Failed(format!("{name}/{p} was not opened here")))?;
        let initialize = meta.initializes(p, me).then_some(replicas.as_slice());
        let ids = PartitionIds::new(local.clone(), p);
        cluster
            .serve_partition(
                name,
                p,
                partition.log.clone(),
                vfs.clone(),
                Arc::new(ids),
                initialize,
            )
            .await?;
    }
    Ok(())
}
