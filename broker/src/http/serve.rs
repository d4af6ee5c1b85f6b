//! The accept loop, with the limits `axum::serve` does not have.
//!
//! `axum::serve` sets no header-read timeout and no connection cap, so a thousand clients sending
//! their headers a byte at a time would each hold a connection and a task forever (slowloris).
//! Here every connection is served by hyper (HTTP/1.1) with a header-read timeout that also runs while a
//! kept-alive connection waits for its next request (so idle connections are closed too), a cap on
//! header size, and a cap on concurrent connections: at the cap the broker stops accepting, and
//! new connections wait in the kernel's backlog until one closes — it slows down, it does not fail.
//! Each request also has a deadline ([`super::router`]), which covers a body that trickles in.
//!
//! Two more limits keep one client from taking every slot: a new connection must send its first
//! byte within `--first-byte-timeout-ms` (2 s, shorter than the header timeout: a socket opened
//! and left silent is closed quickly), and one client address holds at most
//! `--max-connections-per-ip`; past it a connection is answered `503` at once, without reading
//! its request, and closed (it cannot be left waiting: the backlog is shared by every address).
//! A refused connection gives its `--max-connections` slot back as soon as it is accepted and
//! never reaches hyper, so it cannot hold a slot through the first-byte and header timeouts: one
//! address opening connections as fast as it can only costs the broker a short write each.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::App;
pub use crate::config::HttpLimits;
use crate::listen::PerAddress;
use crate::metrics::HttpMetrics;

/// Serves `app` on `listener` until `stop` is cancelled, then stops accepting and waits (up to
/// [`HttpLimits::shutdown_grace`]) for the connections in flight to finish their requests.
pub async fn serve(
    listener: TcpListener,
    app: App,
    limits: HttpLimits,
    metrics: Arc<HttpMetrics>,
    stop: CancellationToken,
) -> std::io::Result<()> {
    // HTTP/1.1 only: protocol detection for HTTP/2 would read the first bytes of a connection
    // before hyper's header timeout starts, so a connection that sends nothing would never close.
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_header_bytes)
        .max_headers(limits.max_headers);
    let builder = Arc::new(builder);
    let first_byte = limits.first_byte_timeout.min(limits.header_read_timeout);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let per_address = PerAddress::new(limits.max_connections_per_ip);
    let refusing = Arc::new(Semaphore::new(limits.max_connections.max(MIN_REFUSALS)));
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
        // Taken here, in accept order, so that the count is exact when the next one comes.
        let Some(share) = per_address.take(peer.ip()) else {
            drop(slot);
            metrics.connections_refused.inc();
            // Past `refusing` answers in flight the connection is just closed: refusals cannot
            // pile up open descriptors either.
            if let Ok(turn) = refusing.clone().try_acquire_owned() {
                let answer = too_many(peer.ip(), per_address.cap());
                tokio::spawn(async move {
                    refuse(stream, answer).await;
                    drop(turn);
                });
            }
            continue;
        };
        let (app, builder, metrics, stop) =
            (app.clone(), builder.clone(), metrics.clone(), stop.clone());
        let watcher = graceful.watcher();
        metrics.connections_open.inc();
        tokio::spawn(async move {
            if first_byte_arrives(&stream, first_byte, &stop, &metrics).await {
                let io = TokioIo::new(stream);
                let service = TowerToHyperService::new(app);
                let served = watcher.watch(builder.serve_connection(io, service)).await;
                drop(share);
                if let Err(e) = served {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
            }
            metrics.connections_open.dec();
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

/// Waits for a new connection's first byte; false (and the connection is to be dropped) when it
/// closes, sends nothing within `timeout`, or the server stops meanwhile.
async fn first_byte_arrives(
    stream: &TcpStream,
    timeout: Duration,
    stop: &CancellationToken,
    metrics: &HttpMetrics,
) -> bool {
    let mut byte = [0u8; 1];
    tokio::select! {
        peeked = tokio::time::timeout(timeout, stream.peek(&mut byte)) => match peeked {
            Ok(Ok(n)) => n > 0,
            Ok(Err(_)) => false,
            Err(_) => {
                metrics.connections_silent_closed.inc();
                false
            }
        },
        _ = stop.cancelled() => false,
    }
}

/// Refusals answered at once, at least: as many as `--max-connections` when that is more. Each
/// lasts at most [`REFUSAL_TIME`].
const MIN_REFUSALS: usize = 64;

/// How long a refused connection has to take its `503` (and to finish sending, see [`refuse`]).
const REFUSAL_TIME: Duration = Duration::from_secs(1);

/// The whole answer to a connection past `--max-connections-per-ip`: a `503` with a JSON body
/// naming the limit, like the API's other `503`s (docs/http-api.md, "HTTP API"), and `Connection: close`.
fn too_many(ip: IpAddr, cap: usize) -> Vec<u8> {
    let body = serde_json::json!({
        "error": format!(
            "too many connections from {ip}: at most {cap} at once (--max-connections-per-ip)"
        )
    })
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\nRetry-After: 1\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Writes `answer` to a refused connection without reading its request, then reads (and throws
/// away) what the client sends until it closes: closing with its request unread would reset the
/// connection, and the client could lose the answer. All within [`REFUSAL_TIME`].
async fn refuse(mut stream: TcpStream, answer: Vec<u8>) {
    let _ = tokio::time::timeout(REFUSAL_TIME, async {
        stream.write_all(&answer).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}
