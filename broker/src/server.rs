//! `mmmq serve` as a function: given a bound listener and a shutdown future, serve until told to
//! stop. Tests start it on `127.0.0.1:0`; `main` only parses flags and calls it.

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::broker::{Broker, BrokerError};
use crate::config::ServeConfig;
use crate::dispatch::Targets;
use crate::http::serve::serve;
use crate::http::{AppState, router};
use crate::storage::{OsFs, Vfs};

/// Why the broker stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Boot failed: a bad `dispatchers.json`, a log that cannot be recovered.
    #[error(transparent)]
    Boot(#[from] BrokerError),
    /// The HTTP server failed.
    #[error("HTTP server: {0}")]
    Http(#[from] std::io::Error),
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
    let stopping = CancellationToken::new();
    let state = AppState::new(config.max_body_bytes, stopping.clone())
        .with_auth_token(config.auth_token.clone());
    let app = router(state.clone());
    let limits = config.http.clone();
    let server = tokio::spawn({
        let stop = stopping.clone();
        async move { serve(listener, app, limits, stop).await }
    });
    // Health answers 503 until this is done.
    let broker = match Broker::open_with(config, vfs, Arc::new(Targets::default())).await {
        Ok(b) => Arc::new(b),
        Err(e) => {
            stopping.cancel();
            let _ = server.await;
            return Err(e.into());
        }
    };
    state.ready(broker.clone());
    spawn_sighup_reload(broker.clone(), stopping.clone());

    shutdown.await;
    tracing::info!("shutting down: no new requests, finishing accepted ones");
    stopping.cancel();
    let served = server.await.expect("server task panicked");
    broker.shutdown().await;
    tracing::info!("stopped");
    served.map_err(ServeError::Http)
}

fn spawn_sighup_reload(broker: Arc<Broker>, stopping: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot listen for SIGHUP; reload with POST /mmmq/admin/reload");
        return;
    };
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
