//! The broker: topics, dispatchers and metrics behind one handle. The HTTP layer is a thin skin
//! over it, and it is what an application embeds.

use std::sync::Arc;
use std::time::Duration;

use mmmq_core::{ConsumerId, TopicInfo, TopicPattern};
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use crate::config::{self, ConfigError, DispatcherSpec, ServeConfig, TargetSpec};
use crate::dispatch::{
    Dispatch, DispatchError, Handler, InProcessTarget, ReloadReport, TargetFactory, Targets,
};
use crate::metrics::Metrics;
pub use crate::produce::{ProduceError, ProduceItem};
use crate::storage::lock::RootLock;
use crate::storage::{FileCache, OsFs, StorageError, Vfs, clean};
use crate::topics::Registry;

mod cluster_api;
mod cluster_append;
mod cluster_config;
mod cluster_plugins;
mod cluster_redrive;
mod cluster_release;
mod cluster_status;
mod plugin_admin;
mod plugin_logs;
mod produce_api;
mod pull;
mod topic_admin;

/// Errors of the broker layer.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// `dispatchers.json` is wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A dispatcher's target could not be built.
    #[error(transparent)]
    Dispatch(#[from] DispatchError),
    /// The disk said no.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A name that is not a valid consumerId or pattern.
    #[error("{0}")]
    InvalidName(String),
    /// Handler options out of their range (names the option).
    #[error("{0}")]
    InvalidOptions(String),
    /// A message that cannot be produced (bad topic, content or key).
    #[error(transparent)]
    Invalid(#[from] ProduceError),
    /// No such topic (pull).
    #[error("no topic {0:?}")]
    UnknownTopic(String),
    /// A topic configuration that cannot be applied (names the field).
    #[error(transparent)]
    InvalidSettings(#[from] crate::topics::settings::SettingsError),
    /// Stored messages could not be read (a disk error; corruption of single entries is not an
    /// error: those are left out).
    #[error("cannot read: {0}")]
    Read(#[source] StorageError),
    /// A batch over several topics of which some were stored and some were not (a disk error on
    /// one topic's log does not undo another topic's commit): `offsets` says which, per element
    /// in request order, so a client retries exactly the elements that are `None`.
    #[error("{error} ({n} of {total} messages of the batch were stored; the others were not)",
        n = stored.iter().flatten().count(), total = stored.len())]
    PartialBatch {
        /// The first disk error.
        #[source]
        error: StorageError,
        /// Per element: where it went when it was stored.
        stored: Vec<Option<Produced>>,
    },
    /// A produce named a partition the topic does not have.
    #[error(transparent)]
    NoSuchPartition(#[from] crate::topics::NoSuchPartition),
    /// The cluster could not do it now (no leader, a peer unreachable, the metadata refused).
    #[error(transparent)]
    Cluster(#[from] crate::cluster::node::ClusterError),
}

/// How an in-process handler is delivered to ([`Broker::handle_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandlerOptions {
    /// Resends after a NACK (`Err`) before the message is dead-lettered (default 3).
    pub max_nack_retries: u32,
    /// Lanes: concurrent calls per partition, each key one at a time (default 1).
    pub max_in_flight: usize,
    /// At-least-once (the default) or at-most-once: the handler is never called twice for a
    /// message, an `Err` dead-letters it at once (docs/delivery.md, "Delivery modes").
    pub delivery: config::DeliveryMode,
}

impl Default for HandlerOptions {
    fn default() -> Self {
        Self {
            max_nack_retries: config::DEFAULT_MAX_NACK_RETRIES,
            max_in_flight: 1,
            delivery: config::DeliveryMode::AtLeastOnce,
        }
    }
}

/// Where a produced message went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Produced {
    /// Its partition.
    pub partition: u32,
    /// Its offset in that partition.
    pub offset: u64,
    /// Its id was seen within the topic's `dedupWindowMs`: nothing was appended, and this is
    /// where the first message with the id went.
    pub duplicate: bool,
}

/// Most messages one pull answers.
pub const MAX_PULL_MESSAGES: usize = 1000;
/// Longest a pull waits for a message.
pub const MAX_PULL_WAIT: Duration = Duration::from_secs(30);
/// Payload bytes one pull answer carries at most (at least one message is always returned).
pub const MAX_PULL_BYTES: usize = 8 << 20;

/// A running broker.
pub struct Broker {
    /// The root dir's one-process lock (contract §1), released when the broker is dropped.
    root_lock: std::sync::Mutex<Option<RootLock>>,
    config: ServeConfig,
    vfs: Arc<dyn Vfs>,
    /// The segment-file cache every log shares.
    files: Arc<FileCache>,
    registry: Arc<Registry>,
    dispatch: Arc<Dispatch>,
    metrics: Arc<Metrics>,
    /// Stops the broker's own tasks (retention) at shutdown.
    background: CancellationToken,
    /// Pull consumer groups.
    groups: Arc<crate::groups::Groups>,
    /// Deployed plugins and their versions.
    plugins: Arc<crate::plugin::store::PluginStore>,
    /// This broker's part of a cluster, when it is a member (contract §13).
    cluster: Arc<std::sync::OnceLock<crate::cluster::node::Cluster>>,
    /// What it applied of the cluster's configuration, when it is a member.
    config_sync: Arc<cluster_config::ConfigSync>,
}

impl Broker {
    /// Recovers every topic, loads `dispatchers.json` and starts delivering.
    pub async fn open(config: ServeConfig) -> Result<Self, BrokerError> {
        Self::open_with(config, Arc::new(OsFs), Arc::new(Targets::default())).await
    }

    /// As [`Broker::open`], with a chosen file system and target factory.
    pub async fn open_with(
        config: ServeConfig,
        vfs: Arc<dyn Vfs>,
        factory: Arc<dyn TargetFactory>,
    ) -> Result<Self, BrokerError> {
        Self::open_until(config, vfs, factory, CancellationToken::new()).await
    }

    /// As [`Broker::open_with`]; `interrupt` stops recovery between two topics (a shutdown
    /// requested while a large root dir is still being recovered), and the answer is then
    /// [`StorageError::Interrupted`].
    pub async fn open_until(
        config: ServeConfig,
        vfs: Arc<dyn Vfs>,
        factory: Arc<dyn TargetFactory>,
        interrupt: CancellationToken,
    ) -> Result<Self, BrokerError> {
        config.validate()?;
        let lock = vfs
            .lock_root(&config.root_dir)
            .map_err(StorageError::from)?;
        Self::open_locked(config, vfs, factory, interrupt, lock).await
    }

    /// As [`Broker::open_until`], on a root dir whose lock the caller already holds (`mmmq
    /// serve` takes it before a cluster member's Raft logs are opened); the broker keeps it
    /// until it is dropped.
    pub async fn open_locked(
        config: ServeConfig,
        vfs: Arc<dyn Vfs>,
        factory: Arc<dyn TargetFactory>,
        interrupt: CancellationToken,
        root_lock: Option<RootLock>,
    ) -> Result<Self, BrokerError> {
        config.validate()?;
        if config.cluster.is_none() && vfs.is_dir(&config.root_dir.join("cluster")) {
            // Its logs carry log ids and uncommitted tails only Raft can tell apart.
            return Err(BrokerError::Config(ConfigError::Setting {
                name: "--root-dir",
                reason: format!(
                    "{} is a cluster member's root dir: start it with its --node-id and --peers",
                    config.root_dir.display()
                ),
            }));
        }
        let root = config.root_dir.clone();
        let specs = tokio::task::spawn_blocking(move || config::load_dispatchers(&root))
            .await
            .expect("config task panicked")?;
        let plugins_root = config.root_dir.clone();
        let plugins = Arc::new(
            tokio::task::spawn_blocking(move || {
                crate::plugin::store::PluginStore::open(&plugins_root)
            })
            .await
            .expect("plugin store task panicked"),
        );
        let metrics = Arc::new(Metrics::new());
        let m = metrics.clone();
        let files = config.file_cache();
        tracing::debug!(max_open_files = files.capacity(), "segment file cache");
        let mut log_config =
            config.log_config(files.clone(), Some(Arc::new(move |n| m.observe_commit(n))));
        // A cluster member's partitions are Raft logs (docs/cluster.md, "Clustered partitions
        // on disk").
        log_config.raft_header = config.cluster.is_some();
        let (root, marker_vfs) = (config.root_dir.clone(), vfs.clone());
        log_config.tail_check =
            tokio::task::spawn_blocking(move || clean::take(&*marker_vfs, &root))
                .await
                .expect("marker task panicked")?;
        tracing::info!(tail_check = ?log_config.tail_check, "recovering topics");
        let registry = Arc::new(
            Registry::restore(config.topics_dir(), vfs.clone(), log_config, interrupt)
                .await?
                .with_max_topics(config.max_topics)
                .with_max_produce_ids(config.max_produce_ids)
                .with_max_partitions(config.max_partitions)
                .with_defaults(config.topic_defaults.clone()),
        );
        let background = CancellationToken::new();
        if let Some(records) = factory.take_log_records() {
            plugin_logs::spawn(registry.clone(), records, background.clone());
        }
        let emitter = Arc::new(crate::emit::Emitter::new(
            registry.clone(),
            metrics.clone(),
            config.max_body_bytes,
        ));
        let dispatch = Dispatch::start(registry.clone(), metrics.clone(), factory, emitter);
        // A cluster member runs the cluster's dispatchers.json, applied once its metadata is
        // settled (docs/cluster.md, "Configuration in a cluster"): its own file is only checked.
        let report = match config.cluster {
            None => dispatch.apply(specs).await?,
            Some(_) => ReloadReport::default(),
        };
        let config_sync = Arc::new(cluster_config::ConfigSync::new(
            config.root_dir.clone(),
            vfs.clone(),
            dispatch.clone(),
            plugins.clone(),
        ));
        let groups = Arc::new(crate::groups::Groups::new(
            registry.clone(),
            metrics.clone(),
            config.max_groups,
        ));
        let cluster = Arc::new(std::sync::OnceLock::new());
        topic_admin::spawn_retention(
            cluster.clone(),
            registry.clone(),
            dispatch.clone(),
            groups.clone(),
            metrics.clone(),
            config.retention_check,
            background.clone(),
        );
        tracing::info!(
            dispatchers = report.added.len(),
            topics = registry.len(),
            "broker ready"
        );
        Ok(Self {
            root_lock: std::sync::Mutex::new(root_lock),
            config,
            vfs,
            files,
            registry,
            dispatch,
            metrics,
            background,
            groups,
            plugins,
            cluster,
            config_sync,
        })
    }

    /// This broker's part of a cluster, when it is a member.
    pub fn cluster(&self) -> Option<&crate::cluster::node::Cluster> {
        self.cluster.get()
    }

    /// Makes this broker a cluster member's (once; later calls change nothing): from now on
    /// its topics follow the cluster's metadata and its produces go through Raft.
    pub fn attach_cluster(&self, cluster: crate::cluster::node::Cluster) {
        if self.cluster.set(cluster.clone()).is_ok() {
            self.groups.attach_cluster(cluster.clone());
            cluster_append::attach(
                &self.registry,
                cluster.clone(),
                self.config.topic_defaults.clone(),
            );
            tokio::spawn(cluster_config::follow(
                self.config_sync.clone(),
                cluster.clone(),
                self.background.clone(),
            ));
            tokio::spawn(cluster_api::follow(
                self.registry.clone(),
                self.dispatch.clone(),
                cluster,
                self.vfs.clone(),
                self.background.clone(),
            ));
        }
    }

    /// The settings it runs with.
    pub fn config(&self) -> &ServeConfig {
        &self.config
    }

    /// The segment-file cache every log shares (its cap and how many are open).
    pub fn file_cache(&self) -> &Arc<FileCache> {
        &self.files
    }

    /// The topics.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Pull consumer groups.
    pub fn groups(&self) -> &Arc<crate::groups::Groups> {
        &self.groups
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Every topic with its sizes, by name (`GET /mmmq/topics`).
    pub fn topics(&self) -> Vec<TopicInfo> {
        self.registry
            .all()
            .into_iter()
            .map(|t| {
                let stats: Vec<_> = t.partitions().iter().map(|p| p.log.stats()).collect();
                let config = self.registry.config_of(&t);
                TopicInfo {
                    name: t.topic.to_string(),
                    topic_id: Some(t.id),
                    next_offset: stats.iter().map(|s| s.next_offset).sum(),
                    segments: stats.iter().map(|s| s.segments as u64).sum(),
                    bytes: stats.iter().map(|s| s.bytes).sum(),
                    partition_count: config.partitions,
                    first_offset: t.first().log.first_offset(),
                    retention_ms: config.retention_ms,
                    retention_bytes: config.retention_bytes,
                }
            })
            .collect()
    }

    /// Re-reads `dispatchers.json` and applies it; a bad file changes nothing. On a cluster
    /// member the file becomes the cluster's (docs/cluster.md, "Configuration in a cluster").
    pub async fn reload(&self) -> Result<ReloadReport, BrokerError> {
        if let Some(cluster) = self.cluster() {
            return self.reload_clustered(cluster).await;
        }
        let root = self.config.root_dir.clone();
        let specs = tokio::task::spawn_blocking(move || config::load_dispatchers(&root))
            .await
            .expect("config task panicked")?;
        let report = self.dispatch.apply(specs).await?;
        tracing::info!(?report, "dispatchers reloaded");
        Ok(report)
    }

    /// The metrics in Prometheus text format, with the gauges that are read rather than counted
    /// (lag, open segment files) refreshed first, and the HTTP server's when given.
    pub async fn metrics_text(&self, http: Option<&crate::metrics::HttpMetrics>) -> String {
        self.dispatch.status().await;
        let (m, files) = (&self.metrics, &self.files);
        let gauge = |n: usize| n.min(i64::MAX as usize) as i64;
        m.open_segment_files.set(gauge(files.open_files()));
        m.max_open_segment_files.set(gauge(files.capacity()));
        let ids = self.registry.produce_ids();
        m.produce_ids.set(gauge(ids.used()));
        m.max_produce_ids.set(gauge(ids.max()));
        let forgotten = &m.produce_ids_forgotten_early;
        forgotten.inc_by(ids.forgotten_early().saturating_sub(forgotten.get()));
        m.groups.set(gauge(self.groups.len()));
        m.max_groups.set(gauge(self.groups.max()));
        let (partitions, max_partitions) = self.registry.partition_usage();
        m.partitions.set(gauge(partitions));
        m.max_partitions.set(gauge(max_partitions));
        let cluster = self.cluster().map(|c| c.metrics().registry());
        self.metrics.encode(http, cluster)
    }

    /// Starts delivering `consumer_id`'s dead letters again to its own target (docs/delivery.md,
    /// "Dead-letter redrive"): offsets `from`…`to`−1 of `__dlq.<consumerId>`, by default from
    /// where the last redrive stopped to the end. Progress is in the dispatcher's status.
    pub async fn redrive(
        &self,
        consumer_id: &str,
        from: Option<u64>,
        to: Option<u64>,
    ) -> Result<mmmq_core::RedriveStatus, crate::dispatch::redrive::RedriveError> {
        match self.cluster() {
            Some(cluster) => self.redrive_clustered(cluster, consumer_id, from, to).await,
            None => self.dispatch.redrive(consumer_id, from, to).await,
        }
    }

    /// Produces `content` to `topic` from inside the application (the embedded use): checked by
    /// the same rules as a produce over HTTP ([`ProduceItem::new`]), durable when it returns.
    pub async fn produce_json<T: serde::Serialize + ?Sized>(
        &self,
        topic: &str,
        key: Option<&str>,
        content: &T,
    ) -> Result<Produced, BrokerError> {
        let json = serde_json::to_string(content).map_err(|e| {
            ProduceError::Unparseable(format!("the content does not serialize as JSON: {e}"))
        })?;
        let content = RawValue::from_string(json).expect("serde_json output is JSON");
        let item = ProduceItem::new(
            topic,
            key.map(str::to_owned),
            content,
            self.config.max_body_bytes,
        )?;
        self.produce(item).await
    }

    /// Registers an in-process handler as a dispatcher: every topic matching `pattern`, from the
    /// checkpoint of `consumer_id` (0 the first time), in order, with `maxNackRetries` of 3 and the
    /// dead-letter topic `__dlq.<consumer_id>`, exactly as a remote consumer, without HTTP. `Ok`
    /// is an ACK, `Err` a NACK, content that does not deserialize into `T` a NACK.
    pub async fn handle<T, F, Fut, E>(
        &self,
        consumer_id: &str,
        pattern: &str,
        handler: F,
    ) -> Result<(), BrokerError>
    where
        T: serde::de::DeserializeOwned + Send + 'static,
        F: Fn(mmmq_core::Message<T>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Display + 'static,
    {
        self.handle_with_retries(
            consumer_id,
            pattern,
            config::DEFAULT_MAX_NACK_RETRIES,
            handler,
        )
        .await
    }

    /// As [`Broker::handle`], with a chosen number of NACK resends.
    pub async fn handle_with_retries<T, F, Fut, E>(
        &self,
        consumer_id: &str,
        pattern: &str,
        max_nack_retries: u32,
        handler: F,
    ) -> Result<(), BrokerError>
    where
        T: serde::de::DeserializeOwned + Send + 'static,
        F: Fn(mmmq_core::Message<T>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Display + 'static,
    {
        let options = HandlerOptions {
            max_nack_retries,
            ..HandlerOptions::default()
        };
        self.handle_with(consumer_id, pattern, options, handler)
            .await
    }

    /// As [`Broker::handle`], with chosen NACK resends, `maxInFlight` lanes (docs/dispatchers.md,
    /// "Dispatchers": with more than one lane the handler is called concurrently, each key's
    /// messages still one at a time, in offset order) and delivery mode (docs/delivery.md,
    /// "Delivery modes").
    pub async fn handle_with<T, F, Fut, E>(
        &self,
        consumer_id: &str,
        pattern: &str,
        options: HandlerOptions,
        handler: F,
    ) -> Result<(), BrokerError>
    where
        T: serde::de::DeserializeOwned + Send + 'static,
        F: Fn(mmmq_core::Message<T>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Display + 'static,
    {
        let max = config::dispatchers::MAX_IN_FLIGHT as usize;
        if !(1..=max).contains(&options.max_in_flight) {
            return Err(BrokerError::InvalidOptions(format!(
                "maxInFlight must be 1 to {max}, not {}",
                options.max_in_flight
            )));
        }
        let max_nack_retries = options.max_nack_retries;
        let consumer_id =
            ConsumerId::new(consumer_id).map_err(|e| BrokerError::InvalidName(e.to_string()))?;
        let pattern =
            TopicPattern::new(pattern).map_err(|e| BrokerError::InvalidName(e.to_string()))?;
        let erased: Handler = mmmq_core::erase(handler);
        let spec = DispatcherSpec {
            consumer_id,
            pattern,
            target: TargetSpec::InProcess,
            max_nack_retries,
            batch_max_messages: 1,
            max_in_flight: options.max_in_flight,
            checkpoint_interval: std::time::Duration::from_millis(
                crate::config::DEFAULT_CHECKPOINT_INTERVAL_MS,
            ),
            delivery: options.delivery,
        };
        self.dispatch
            .add_pinned(spec, Arc::new(InProcessTarget::new(erased)))
            .await?;
        Ok(())
    }

    /// Stops every dispatcher (their final positions written); [`Broker::shutdown`] does it too.
    pub async fn stop_dispatch(&self) {
        self.dispatch.shutdown().await;
    }

    /// Stops delivery cleanly: in-flight deliveries finish, checkpoints are written.
    ///
    /// Then it closes every log (each tail's index synced, its preallocated zeros cut: the exact
    /// layout) and leaves the clean-shutdown marker, which spares the next boot the full check of each
    /// tail segment. Call it when nothing produces any more (`serve` does, after the HTTP server
    /// has finished its requests); if the marker cannot be written, the next boot checks fully.
    pub async fn shutdown(&self) {
        self.background.cancel();
        self.dispatch.shutdown().await;
        if !self.registry.close_all().await {
            tracing::warn!("a log did not close cleanly; the next boot checks every tail segment");
            return;
        }
        let (vfs, root) = (self.vfs.clone(), self.config.root_dir.clone());
        let marked = tokio::task::spawn_blocking(move || clean::mark(&*vfs, &root))
            .await
            .expect("marker task panicked");
        if let Err(e) = marked {
            tracing::warn!(error = %e, "cannot leave the clean-shutdown marker; the next boot checks every tail segment");
        }
        // Every log is closed: the root dir is free for the next broker, even while this
        // value lives on (an embedding application that reopens it in the same process).
        drop(self.root_lock.lock().expect("root lock poisoned").take());
    }
}
