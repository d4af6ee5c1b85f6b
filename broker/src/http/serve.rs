//! The accept loop, with the limits `axum::serve` does not have.
//!
//! `axum::serve` sets no header-read timeout and no connection cap, so a thousand clients sending
//! their headers a byte at a time would each hold a connection and a task forever (slowloris).
//! Here every connection is served by hyper (HTTP/1.1) with a header-read timeout that also runs while a
//! kept-alive connection waits for its next request (so idle connections are closed too), a cap on
//! header size, and a cap on concurrent connections: at the cap the broker stops accepting, and
//! new connections wait in the kernel's backlog until one closes — it slows down, it does not fail.
//! Each request also has a deadline, which covers a body that trickles in.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::response::{IntoResponse, Response};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::ApiError;
pub use crate::config::HttpLimits;

/// Serves `app` on `listener` until `stop` is cancelled, then stops accepting and waits (up to
/// [`HttpLimits::shutdown_grace`]) for the connections in flight to finish their requests.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let app = app.layer(axum::middleware::from_fn_with_state(
        limits.request_timeout,
        request_deadline,
    ));
    // HTTP/1.1 only: protocol detection for HTTP/2 would read the first bytes of a connection
    // before hyper's header timeout starts, so a connection that sends nothing would never close.
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_header_bytes)
        .max_headers(limits.max_headers);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    loop {
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => s.expect("never closed"),
            _ = stop.cancelled() => break,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, or a connection reset before accept: not fatal. Wait a
                    // little so that a persistent error does not spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the shutdown grace period; closing them");
    }
    Ok(())
}

async fn request_deadline(
    axum::extract::State(deadline): axum::extract::State<Duration>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match tokio::time::timeout(deadline, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::Timeout(deadline).into_response(),
    }
}
