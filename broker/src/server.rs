//! `mmmq serve` as a function: given a bound listener and a shutdown future, serve until told to
//! stop. Tests start it on `127.0.0.1:0`; `main` only parses flags and calls it.

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::broker::{Broker, BrokerError};
use crate::cluster::faults::Faults;
use crate::cluster::log_store::SegmentLogStore;
use crate::cluster::node::{Cluster, ClusterConfig};
use crate::cluster::types::GroupKind;
use crate::config::ServeConfig;
use crate::dispatch::Targets;
use crate::http::serve::serve;
use crate::http::{AppState, router_with};
use crate::metrics::HttpMetrics;
use crate::storage::vfs::fault::FaultyFs;
use crate::storage::{OsFs, StorageError, Vfs};

/// Why the broker stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Boot failed: a bad `dispatchers.json`, a log that cannot be recovered.
    #[error(transparent)]
    Boot(#[from] BrokerError),
    /// The HTTP server failed.
    #[error("HTTP server: {0}")]
    Http(#[from] std::io::Error),
    /// The cluster could not be joined (its metadata log, its first election).
    #[error("cluster: {0}")]
    Cluster(String),
    /// The Kafka listener could not start (`--kafka-listen`).
    #[error("kafka: {0}")]
    Kafka(String),
}

/// Serves the HTTP API on `listener` while recovering and then running the broker, until
/// `shutdown` resolves; then stops accepting, finishes accepted requests, stops delivery and
/// persists checkpoints. SIGHUP reloads `dispatchers.json`.
pub async fn run(
    listener: TcpListener,
    config: ServeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    run_on(listener, config, Arc::new(OsFs), shutdown).await
}

/// As [`run`], with the storage on `vfs` (tests serve real HTTP over a file system that fails on
/// demand).
pub async fn run_on(
    listener: TcpListener,
    config: ServeConfig,
    vfs: Arc<dyn Vfs>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    // Signals first: SIGHUP's default action ends the process, and the shutdown future (SIGTERM,
    // SIGINT) registers its handlers when first polled, which is now, not after a long recovery.
    let hup = hangup_signal();
    let mut shutdown = std::pin::pin!(shutdown);
    // One process per root dir (contract §1): decided before anything in it is touched.
    let root_lock = {
        let (vfs, root) = (vfs.clone(), config.root_dir.clone());
        tokio::task::spawn_blocking(move || vfs.lock_root(&root))
            .await
            .expect("lock task panicked")
            .map_err(|e| ServeError::Boot(BrokerError::Storage(e.into())))?
    };
    // Under --fault-injection the storage runs on a file system that tests can make refuse
    // writes (docs/cluster.md, "Testing faults"); otherwise on `vfs` itself, at no cost.
    let (vfs, faults) = match &config.cluster {
        Some(settings) if settings.fault_injection => {
            let disk = FaultyFs::over(vfs);
            (
                Arc::new(disk.clone()) as Arc<dyn Vfs>,
                Faults::with_disk(disk),
            )
        }
        _ => (vfs, Faults::default()),
    };
    let stopping = CancellationToken::new();
    let loopback = listener.local_addr()?.ip().is_loopback();
    if !loopback && config.auth_token.is_none() {
        tracing::warn!(
            addr = %listener.local_addr()?,
            "listening beyond loopback without --auth-token: anyone who can reach this port can \
             produce, read and change the broker's configuration"
        );
    }
    let http_metrics = Arc::new(HttpMetrics::new(config.http.max_inflight_body_bytes));
    let state = AppState::new(&config, loopback, http_metrics.clone(), stopping.clone());
    // A cluster member joins its metadata group before it recovers its topics: Raft's traffic
    // is served from the start (docs/cluster.md, "Design").
    let cluster = match &config.cluster {
        Some(settings) => Some(start_cluster(settings, &config, &vfs, faults).await?),
        None => None,
    };
    // Kafka's port is taken before recovery, as HTTP's: a port in use is a clear error at once.
    let kafka = match &config.kafka {
        Some(settings) => {
            let listener = TcpListener::bind(&settings.listen).await.map_err(|e| {
                ServeError::Kafka(format!("cannot listen on {}: {e}", settings.listen))
            })?;
            let addr = listener.local_addr()?;
            tracing::info!(%addr, "kafka listening");
            if !addr.ip().is_loopback() && config.auth_token.is_none() {
                tracing::warn!(
                    %addr,
                    "the Kafka listener is reachable beyond loopback without --auth-token: \
                     any client can produce, read and delete topics"
                );
            }
            Some((listener, settings.clone()))
        }
        None => None,
    };
    let kafka_limits = crate::kafka::Limits {
        max_frame: config
            .max_body_bytes
            .saturating_mul(crate::config::BATCH_BODY_FACTOR),
        max_connections: config.http.max_connections,
        max_record: config.max_body_bytes,
        max_connections_per_ip: config.http.max_connections_per_ip,
        first_byte: config.http.first_byte_timeout,
        login: config.http.header_read_timeout,
        stall: config.http.header_read_timeout,
        max_inflight_bytes: config.http.max_inflight_body_bytes,
    };
    let app = router_with(state.clone(), cluster.as_ref().map(Cluster::routes));
    let limits = config.http.clone();
    let server = tokio::spawn({
        let stop = stopping.clone();
        async move { serve(listener, app, limits, http_metrics, stop).await }
    });
    // Health answers 503 until this is done. A shutdown requested meanwhile stops recovery
    // between two topics and ends the process cleanly.
    let interrupt = CancellationToken::new();
    let boot = Broker::open_locked(
        config,
        vfs,
        Arc::new(Targets::default()),
        interrupt.clone(),
        root_lock,
    );
    let mut boot = std::pin::pin!(boot);
    let opened = tokio::select! {
        opened = &mut boot => opened,
        _ = &mut shutdown => {
            tracing::info!("shutdown requested during boot; stopping recovery");
            interrupt.cancel();
            boot.await
        }
    };
    let broker = match opened {
        Ok(b) if !interrupt.is_cancelled() => Arc::new(b),
        Ok(b) => {
            // Recovery finished just as the shutdown came: nothing has started delivering yet
            // that needs more than a normal stop.
            stopping.cancel();
            let _ = server.await;
            b.shutdown().await;
            tracing::info!("stopped");
            return Ok(());
        }
        Err(BrokerError::Storage(StorageError::Interrupted { done, total })) => {
            tracing::info!(done, total, "recovery interrupted; stopped");
            stopping.cancel();
            let _ = server.await;
            return Ok(());
        }
        Err(e) => {
            stopping.cancel();
            let _ = server.await;
            return Err(e.into());
        }
    };
    if let Some(cluster) = &cluster {
        broker.attach_cluster(cluster.clone());
    }
    state.ready(broker.clone());
    spawn_sighup_reload(broker.clone(), hup, stopping.clone());
    if let Some(cluster) = &cluster
        && kafka.is_none()
    {
        // An address a run before announced would name a port nobody listens on.
        cluster.announce_kafka(None);
    }
    let kafka = kafka.map(|(listener, settings)| {
        let (broker, stop) = (broker.clone(), stopping.clone());
        tokio::spawn(crate::kafka::serve(
            listener,
            broker,
            settings,
            kafka_limits,
            stop,
        ))
    });

    shutdown.await;
    tracing::info!("shutting down: no new requests, finishing accepted ones");
    stopping.cancel();
    let served = server.await.expect("server task panicked");
    if let Some(kafka) = kafka
        && let Ok(Err(e)) = kafka.await
    {
        tracing::warn!(error = %e, "kafka listener");
    }
    if let Some(cluster) = &cluster {
        // Dispatchers first, while the groups still run: a leader's final positions are
        // replicated (docs/cluster.md, "Delivery in a cluster").
        broker.stop_dispatch().await;
        cluster.shutdown().await;
    }
    broker.shutdown().await;
    tracing::info!("stopped");
    served.map_err(ServeError::Http)
}

/// Opens the metadata group's log (`{root}/cluster/meta/log`) and joins the cluster.
async fn start_cluster(
    settings: &crate::config::cluster::ClusterSettings,
    config: &ServeConfig,
    vfs: &Arc<dyn Vfs>,
    faults: Faults,
) -> Result<Cluster, ServeError> {
    let cluster_config = ClusterConfig::new(settings, &config.root_dir, config.auth_token.clone());
    // A single broker's root dir holds logs without log ids: opened as a cluster member's they
    // would be misread and cut. A cluster member starts from an empty root dir or its own.
    let topics = config.topics_dir();
    let had_topics = vfs.is_dir(&topics) && !vfs.read_dir(&topics).unwrap_or_default().is_empty();
    if had_topics && !vfs.is_dir(&cluster_config.dir) {
        return Err(ServeError::Cluster(format!(
            "{} is a single broker's root dir (it has topics and no cluster/): a cluster member \
             starts from an empty root dir",
            config.root_dir.display()
        )));
    }
    let log_config = config.log_config(config.file_cache(), None);
    let dir = cluster_config.dir.join("meta").join("log");
    let store = SegmentLogStore::open(&dir, vfs.clone(), log_config, GroupKind::Meta)
        .await
        .map_err(|e| ServeError::Cluster(e.to_string()))?;
    tracing::info!(
        node = settings.node_id,
        peers = settings.peers.len(),
        "joining the cluster"
    );
    Cluster::start(cluster_config, store, faults)
        .await
        .map_err(|e| ServeError::Cluster(e.to_string()))
}

/// SIGHUP, listened for from the start so that one during boot is not fatal (it reloads once the
/// broker is up).
fn hangup_signal() -> Option<tokio::signal::unix::Signal> {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP; reload with POST /mmmq/admin/reload");
            None
        }
    }
}

fn spawn_sighup_reload(
    broker: Arc<Broker>,
    hup: Option<tokio::signal::unix::Signal>,
    stopping: CancellationToken,
) {
    let Some(mut hup) = hup else { return };
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stopping.cancelled() => return,
                s = hup.recv() => if s.is_none() { return },
            }
            tracing::info!("SIGHUP: reloading dispatchers.json");
            if let Err(e) = broker.reload().await {
                tracing::error!(error = %e, "reload refused; the running configuration stays");
            }
        }
    });
}
