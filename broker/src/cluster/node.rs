//! One broker's place in a cluster (docs/cluster.md, "Design"): its Raft groups, the router to
//! its peers, and the metadata group it joins at boot.
//!
//! Boot: the metadata group's log and machine open from `{root}/cluster/meta/`; the broker with
//! the lowest id of `--peers` initializes the group once, with every peer a voter (one broker
//! initializing is what keeps two fresh brokers from writing two different first entries);
//! once the group has a leader every broker makes sure the metadata names it at its address,
//! and that it names the cluster (docs/cluster.md, "The cluster's id").

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::storage::RaftLogStorage;
use parking_lot::RwLock;
use tokio_util::sync::CancellationToken;

use super::faults::Faults;
use super::identity::Identity;
use super::meta_machine::MetaMachine;
use super::meta_state::{MetaCommand, MetaOutcome, MetaState};
use super::metrics::ClusterMetrics;
use super::network::{GroupId, NetworkFactory, RAFT_PATH, Router};
use super::rpc::{Endpoint, Groups};
use super::types::{Applied, BrokerId, Command, Raft};

/// How a broker takes part in a cluster (`serve --node-id N --peers …`).
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// This broker's id.
    pub node_id: BrokerId,
    /// Every initial broker's HTTP address (`host:port`), this one's included.
    pub peers: BTreeMap<BrokerId, String>,
    /// `{root}/cluster`.
    pub dir: PathBuf,
    /// The token peers present (`--auth-token`) on the client routes they forward to.
    pub token: Option<String>,
    /// The members' secret given by `--cluster-secret-file` (else the metadata's).
    pub secret: Option<String>,
    /// Raft's timing: heartbeats, and the election timeout's range (ms).
    pub heartbeat_ms: u64,
    /// The election timeout's lower bound (ms); the upper is twice it.
    pub election_ms: u64,
    /// Whether `PUT /mmmq/internal/faults` may cut or slow this broker's Raft traffic and make
    /// its disk refuse writes.
    pub fault_injection: bool,
}

impl ClusterConfig {
    /// The configuration of a broker started with `settings`, its files under `root/cluster`.
    pub fn new(
        settings: &crate::config::cluster::ClusterSettings,
        root: &Path,
        token: Option<String>,
    ) -> Self {
        Self {
            node_id: settings.node_id,
            peers: settings.peers.clone(),
            dir: root.join("cluster"),
            token,
            secret: settings.secret.clone(),
            heartbeat_ms: settings.heartbeat_ms,
            election_ms: settings.election_ms,
            fault_injection: settings.fault_injection,
        }
    }
}

impl ClusterConfig {
    /// This broker's own address, from its entry in the peers.
    pub fn addr(&self) -> &str {
        &self.peers[&self.node_id]
    }

    pub(super) fn raft_config(&self, kind: &str) -> Arc<openraft::Config> {
        let meta = kind == "meta";
        let config = openraft::Config {
            cluster_name: format!("mmmq-{kind}"),
            heartbeat_interval: self.heartbeat_ms,
            // A partition group has no timers: the broker's pings stand for its heartbeats and
            // start its elections (docs/cluster.md, "Liveness and elections"). Its lease (the
            // timeout's upper bound: how long a replica that heard from its leader refuses to
            // vote for another) is one election timeout, as long as a peer's silence must last
            // before its groups are taken over.
            enable_tick: meta,
            // (Its lower bound is also how long a vote request waits for an answer, which
            // includes the voter's fsync: kept close to the upper one.)
            election_timeout_min: if meta {
                self.election_ms
            } else {
                self.election_ms * 9 / 10
            },
            election_timeout_max: if meta {
                self.election_ms * 2
            } else {
                self.election_ms
            },
            // The metadata's snapshot is its whole state, and its log is purged behind it. A
            // partition's log is its messages: only retention deletes them, and builds the
            // snapshot its purge needs (docs/cluster.md, "Retention in a cluster").
            snapshot_policy: if meta {
                openraft::SnapshotPolicy::LogsSinceLast(1000)
            } else {
                openraft::SnapshotPolicy::Never
            },
            // openraft purges a partition's log only when retention asks (`trigger().purge_log`,
            // docs/cluster.md, "Retention in a cluster"): after a snapshot it keeps every entry.
            max_in_snapshot_log_to_keep: if meta { 100 } else { u64::MAX },
            // A leader may apply what its followers hold before its own fsync returns, so a
            // leader that restarts (a crash, or its group opened again after a storage error)
            // may have lost entries of its term that others hold. Restored as leader of that
            // term it would write other entries under the same log ids: it starts as a follower
            // and the next leader is elected in a later term (docs/cluster.md, "A disk that
            // refuses writes").
            enable_leader_restore: Some(false),
            ..Default::default()
        };
        Arc::new(
            config
                .validate()
                .expect("the cluster's Raft timings are valid"),
        )
    }
}

/// Why a cluster operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The group has no leader now (an election is under way, or a majority is down).
    #[error("no leader for {group} now")]
    NoLeader {
        /// The group.
        group: String,
        /// The last leader's address, if known.
        leader: Option<String>,
    },
    /// The metadata refused the change.
    #[error("{0}")]
    Refused(String),
    /// What the request names does not exist (a topic, a partition, a broker).
    #[error("{0}")]
    NotFound(String),
    /// A peer could not be asked.
    #[error("cannot reach broker {0}: {1}")]
    Unreachable(BrokerId, String),
    /// A write was sent to a leader that did not answer: it may or may not be stored (a retry
    /// without a produce id may store it twice).
    #[error("the outcome of a write sent to broker {0} is unknown: {1}")]
    Unknown(BrokerId, String),
    /// Raft or storage failed.
    #[error("{0}")]
    Failed(String),
}

/// The largest body of Raft's traffic a broker takes.
pub const RAFT_BODY_LIMIT: usize = 256 << 20;

/// A broker's part of the cluster. Cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) config: ClusterConfig,
    pub(super) router: Router,
    pub(super) meta: openraft::Raft<Raft, MetaMachine>,
    machine: MetaMachine,
    /// Partition groups this broker holds a replica of.
    pub(super) partitions: RwLock<HashMap<GroupId, Arc<dyn Endpoint>>>,
    /// The last leader each group's writes were forwarded to (learnt from answers).
    pub(super) hints: RwLock<HashMap<GroupId, BrokerId>>,
    /// What peers' pings said (docs/cluster.md, "Liveness and elections").
    pub(super) liveness: super::liveness::Liveness,
    /// The groups' metrics (`GET /metrics`).
    pub(super) metrics: ClusterMetrics,
    pub(super) stop: CancellationToken,
}

impl Inner {
    /// The group's endpoint on this broker: the metadata group, or a partition it replicates.
    pub(super) fn partitions_or_meta(&self, group: &GroupId) -> Option<Arc<dyn Endpoint>> {
        self.endpoint(group)
    }

    /// The metadata group as this broker sees it.
    pub(super) fn meta_view(&self) -> super::rpc::GroupView {
        Endpoint::view(&self.meta)
    }
}

impl Groups for Inner {
    fn endpoint(&self, group: &GroupId) -> Option<Arc<dyn Endpoint>> {
        match group {
            GroupId::Meta => Some(Arc::new(self.meta.clone())),
            other => self.partitions.read().get(other).cloned(),
        }
    }

    fn refused_here(&self, group: &GroupId) {
        let me = self.config.node_id;
        let leads = self
            .partitions
            .read()
            .get(group)
            .is_some_and(|ep| ep.view().leader == Some(me));
        if leads {
            self.liveness.refused_here(group);
        }
    }

    fn led(&self) -> Vec<(GroupId, u64)> {
        let me = self.config.node_id;
        self.partitions
            .read()
            .iter()
            .filter_map(|(g, ep)| {
                let view = ep.view();
                (view.leader == Some(me) && self.liveness.claims(g)).then(|| (g.clone(), view.term))
            })
            .collect()
    }
}

/// What the metadata group answered a command with.
pub(super) fn meta_outcome(applied: &[Applied]) -> Result<MetaOutcome, ClusterError> {
    match applied.first() {
        Some(Applied::Meta(outcome)) => serde_json::from_slice(outcome)
            .map_err(|e| ClusterError::Failed(format!("a metadata answer: {e}"))),
        other => Err(ClusterError::Failed(format!(
            "a metadata answer: {other:?}"
        ))),
    }
}

impl Cluster {
    /// Starts this broker's metadata group on `meta_log` (the group's log store in
    /// `{root}/cluster/meta/log`) and joins the cluster.
    pub async fn start<LS>(
        config: ClusterConfig,
        meta_log: LS,
        faults: Faults,
    ) -> Result<Self, ClusterError>
    where
        LS: RaftLogStorage<Raft>,
    {
        let identity = Identity::load(&config.dir, config.secret.clone()).await?;
        let peers: HashMap<_, _> = config.peers.clone().into_iter().collect();
        let router = Router::new(&peers, config.token.clone(), faults, identity.clone());
        let meta_dir = config.dir.join("meta");
        let machine = {
            let dir = meta_dir.clone();
            tokio::task::spawn_blocking(move || MetaMachine::open(&dir, identity))
                .await
                .map_err(|e| ClusterError::Failed(e.to_string()))?
                .map_err(|e| ClusterError::Failed(format!("{}: {e}", meta_dir.display())))?
        };
        let network = NetworkFactory::new(router.clone(), GroupId::Meta);
        let meta = openraft::Raft::new(
            config.node_id,
            config.raft_config("meta"),
            network,
            meta_log,
            machine.clone(),
        )
        .await
        .map_err(|e| ClusterError::Failed(e.to_string()))?;
        let first = *config.peers.keys().next().expect("peers name this broker");
        let initialized = meta
            .is_initialized()
            .await
            .map_err(|e| ClusterError::Failed(e.to_string()))?;
        if !initialized && first == config.node_id {
            let members: BTreeMap<BrokerId, openraft::BasicNode> = config
                .peers
                .iter()
                .map(|(id, addr)| (*id, openraft::BasicNode::new(addr)))
                .collect();
            meta.initialize(members)
                .await
                .map_err(|e| ClusterError::Failed(format!("initializing the cluster: {e}")))?;
            tracing::info!(node = config.node_id, "cluster initialized");
        }
        let cluster = Self {
            inner: Arc::new(Inner {
                config,
                router,
                meta,
                machine,
                partitions: RwLock::new(HashMap::new()),
                hints: RwLock::new(HashMap::new()),
                liveness: Default::default(),
                metrics: ClusterMetrics::new(),
                stop: CancellationToken::new(),
            }),
        };
        tokio::spawn(cluster.clone().announce());
        tokio::spawn(cluster.clone().follow_liveness());
        tokio::spawn(cluster.clone().watch_meta());
        Ok(cluster)
    }

    /// The cluster's metrics, for `GET /metrics`.
    pub fn metrics(&self) -> &ClusterMetrics {
        &self.inner.metrics
    }

    /// Keeps the metadata group's metrics from openraft's metrics channel, and says so if the
    /// group stops on an error (its supervision is not built: the broker must be restarted).
    async fn watch_meta(self) {
        let mut series = self.inner.metrics.meta();
        let mut rx = self.inner.meta.metrics();
        loop {
            {
                let m = rx.borrow_watched();
                series.observe(&m);
                if let Err(fatal) = &m.running_state {
                    if !self.inner.stop.is_cancelled() {
                        tracing::error!(error = %fatal, "the metadata group stopped; restart the broker");
                    }
                    series.stopped();
                    return;
                }
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { return },
                _ = self.inner.stop.cancelled() => return,
            }
        }
    }

    /// This broker's id.
    pub fn id(&self) -> BrokerId {
        self.inner.config.node_id
    }

    /// This broker's HTTP address, `host:port` (its `--peers` entry).
    pub fn addr(&self) -> &str {
        self.inner.config.addr()
    }

    /// The cluster's id, once this broker knows it (docs/cluster.md, "The cluster's id").
    pub fn cluster_id(&self) -> Option<String> {
        self.inner.router.identity().known()
    }

    /// The metadata as applied on this broker.
    pub fn metadata(&self) -> Arc<MetaState> {
        self.inner.machine.current()
    }

    /// Follows every change of the metadata.
    pub fn watch_metadata(&self) -> tokio::sync::watch::Receiver<Arc<MetaState>> {
        self.inner.machine.subscribe()
    }

    /// The routes of Raft's traffic, to merge into the broker's HTTP router (behind its guard).
    /// Every one of them is a member's only (docs/cluster.md, "Who may speak for the cluster").
    pub fn routes(&self) -> axum::Router {
        let groups: Arc<Inner> = self.inner.clone();
        let mut internal = axum::Router::new()
            .route(
                &format!("{RAFT_PATH}/{{rpc}}"),
                axum::routing::post(super::rpc::handle::<Inner>),
            )
            .with_state(groups);
        if self.inner.config.fault_injection {
            let faults = self.inner.router.faults().clone();
            internal = internal.route(
                "/mmmq/internal/faults",
                axum::routing::put(
                    move |axum::Json(rules): axum::Json<super::faults::FaultRules>| {
                        let faults = faults.clone();
                        async move {
                            tracing::warn!(?rules, "fault injection: rules set");
                            match faults.apply(rules) {
                                Ok(()) => (
                                    axum::http::StatusCode::OK,
                                    axum::Json(serde_json::json!({"ok": true})),
                                ),
                                Err(error) => (
                                    axum::http::StatusCode::BAD_REQUEST,
                                    axum::Json(serde_json::json!({"error": error})),
                                ),
                            }
                        }
                    },
                ),
            );
        }
        internal
            // A non-member's or another cluster's messages are refused before they are read
            // (docs/cluster.md, "The cluster's id").
            .layer(axum::middleware::from_fn_with_state(
                self.inner.router.identity().clone(),
                super::identity::guard,
            ))
            // An append carries up to openraft's batch of entries, a forwarded write a whole
            // produce batch (32 × --max-body-bytes): axum's 2 MiB default would stall both.
            .layer(axum::extract::DefaultBodyLimit::max(RAFT_BODY_LIMIT))
    }

    /// Keeps this broker named at its address in the metadata: proposed once the group has a
    /// leader, again whenever the metadata lost it (a snapshot from before the join). Then
    /// names the cluster if nobody has: the first id applied stays, so brokers that propose
    /// at once agree (docs/cluster.md, "The cluster's id").
    async fn announce(self) {
        let mut metadata = self.watch_metadata();
        loop {
            // Brokers added after this one started are not in its --peers.
            for (id, b) in &metadata.borrow().brokers {
                let base = self.inner.router.peer(*id);
                if base.is_none_or(|base| !base.ends_with(&b.addr)) {
                    self.inner.router.set_peer(*id, &b.addr);
                }
            }
            let me = self.id();
            let addr = self.inner.config.addr().to_owned();
            let named = metadata
                .borrow()
                .brokers
                .get(&me)
                .is_some_and(|b| b.addr == addr);
            if !named {
                match self.propose(MetaCommand::AddBroker { id: me, addr }).await {
                    Ok(MetaOutcome::Done) => continue,
                    Ok(MetaOutcome::TopicExists | MetaOutcome::Each(_)) => {
                        unreachable!("not a topic or positions command")
                    }
                    Ok(MetaOutcome::Refused(why)) => {
                        tracing::error!(node = me, %why, "the cluster refused this broker");
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(node = me, error = %e, "announcing this broker, retrying");
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_millis(200)) => continue,
                            _ = self.inner.stop.cancelled() => return,
                        }
                    }
                }
            }
            let (unnamed, no_secret) = {
                let m = metadata.borrow();
                (m.cluster_id.is_none(), m.member_secret.is_none())
            };
            let named = match (unnamed, no_secret) {
                (true, _) => self.name_cluster().await,
                (false, true) => self.give_secret().await,
                (false, false) => Ok(()),
            };
            if let Err(e) = named {
                tracing::debug!(node = me, error = %e, "naming the cluster, retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => continue,
                    _ = self.inner.stop.cancelled() => return,
                }
            }
            tokio::select! {
                changed = metadata.changed() => if changed.is_err() { return },
                _ = self.inner.stop.cancelled() => return,
            }
        }
    }

    /// Waits (up to `limit`) until the metadata names every voter of the metadata group: right
    /// after a cluster forms, its brokers are still announcing themselves, and a topic placed
    /// before they did would be placed on fewer brokers than there are.
    pub async fn wait_for_brokers(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        let mut metadata = self.watch_metadata();
        loop {
            let voters = self.inner.meta_view().voters;
            if voters
                .iter()
                .all(|v| metadata.borrow().brokers.contains_key(v))
            {
                return;
            }
            if tokio::time::timeout_at(deadline, metadata.changed())
                .await
                .is_err()
            {
                return;
            }
        }
    }

    /// Proposes a metadata change through the group's leader, wherever it is.
    pub async fn propose(&self, command: MetaCommand) -> Result<MetaOutcome, ClusterError> {
        let bytes =
            serde_json::to_vec(&command).map_err(|e| ClusterError::Failed(e.to_string()))?;
        let applied = self
            .write(GroupId::Meta, vec![Command::Meta(bytes.into())])
            .await?;
        meta_outcome(&applied)
    }

    /// Stops every group of this broker.
    pub async fn shutdown(&self) {
        self.inner.stop.cancel();
        let groups: Vec<Arc<dyn Endpoint>> = self
            .inner
            .partitions
            .write()
            .drain()
            .map(|(_, ep)| ep)
            .collect();
        for ep in groups {
            ep.stop().await;
        }
        let _ = self.inner.meta.shutdown().await;
    }

    /// Whether this broker runs a replica of partition `p` of `topic`.
    pub fn replicates(&self, topic: &str, p: u32) -> bool {
        self.inner
            .partitions
            .read()
            .contains_key(&GroupId::Partition(topic.to_owned(), p))
    }

    /// The voters of the metadata group: the cluster's brokers, whether or not they announced
    /// themselves yet.
    pub fn voters(&self) -> Vec<BrokerId> {
        self.inner.meta_view().voters
    }

    /// How many brokers the cluster has: those the metadata names, and the metadata group's
    /// voters that did not announce themselves yet (learners are named once added).
    pub fn broker_count(&self) -> usize {
        let mut all: std::collections::BTreeSet<BrokerId> =
            self.metadata().brokers.keys().copied().collect();
        all.extend(self.voters());
        all.len()
    }

    /// Whether this broker applied every metadata entry its log holds. Until it has, the
    /// metadata it shows may be older than what it acted on before (a replay at boot goes
    /// through every past state), so nothing is deleted on its word (docs/cluster.md,
    /// "Membership").
    pub fn metadata_settled(&self) -> bool {
        let view = self.inner.meta_view();
        // No log index yet: openraft has not loaded the log (its first metrics).
        view.last_log_index.is_some() && view.last_applied == view.last_log_index
    }
}
