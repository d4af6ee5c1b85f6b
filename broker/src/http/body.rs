//! Request bodies (README, "HTTP API"): read up to a limit (`413` past it), and counted against
//! one budget of bytes shared by every request in flight (`--max-inflight-body-bytes`), so that
//! many clients sending large or unfinished bodies cannot make the broker hold unbounded memory.
//!
//! A request takes its share of the budget before its body is read: the whole declared
//! `Content-Length` at once (so a request that does not fit is refused before a byte of it is
//! read), or chunk by chunk for a chunked body. It gives the share back when the handler is done
//! with the bytes. When the budget is used up the answer is `503` with `Retry-After` at once:
//! waiting would hold the connection, and a client's retry is as good.
//!
//! A plugin upload (up to 64 MiB) is staged in a temporary file under
//! `{root-dir}/plugins/.uploads/` while it arrives, not in memory (an unfinished upload costs
//! disk, not memory), and read back once complete. It counts against the same budget, so the
//! disk it takes is bounded too. The file has no name (`O_TMPFILE` where the file system has it),
//! so a crash leaves nothing behind; `{root-dir}` rather than the system's temporary directory,
//! which may be memory (tmpfs).

use std::io::{Read, Seek, Write};
use std::path::PathBuf;
use std::sync::Arc;

use axum::http::{HeaderMap, header};
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::Semaphore;

use super::ApiError;
use crate::metrics::HttpMetrics;

/// How much of an oversized body is still read (and thrown away) before answering 413: a client
/// that is still sending when the answer comes and the connection closes sees a reset instead of
/// the 413, so modestly oversized bodies are drained; beyond this the connection is dropped.
const DRAIN_OVERSIZED: usize = 16 << 20;

/// A staged upload is written to its file this many bytes at a time (one blocking write each).
const STAGE_WRITE: usize = 1 << 20;

/// The bytes of request bodies the broker may hold at once.
pub(crate) struct BodyBudget {
    free: Semaphore,
    size: usize,
    metrics: Arc<HttpMetrics>,
}

impl BodyBudget {
    /// A budget of `size` bytes.
    pub(crate) fn new(size: usize, metrics: Arc<HttpMetrics>) -> Arc<Self> {
        Arc::new(Self {
            free: Semaphore::new(size.min(Semaphore::MAX_PERMITS)),
            size,
            metrics,
        })
    }

    fn busy(&self) -> ApiError {
        self.metrics.body_budget_refusals.inc();
        ApiError::Busy(format!(
            "the broker holds its limit of {} bytes of request bodies (--max-inflight-body-bytes); \
             retry shortly",
            self.size
        ))
    }
}

/// A request's share of the [`BodyBudget`], given back when dropped.
pub(super) struct Held {
    budget: Arc<BodyBudget>,
    bytes: usize,
}

impl Held {
    fn new(budget: &Arc<BodyBudget>) -> Self {
        Self {
            budget: budget.clone(),
            bytes: 0,
        }
    }

    /// Grows the share to `total` bytes, or refuses (`503`) when the budget does not have them.
    fn cover(&mut self, total: usize) -> Result<(), ApiError> {
        let Some(more) = total.checked_sub(self.bytes).filter(|&n| n > 0) else {
            return Ok(());
        };
        let permits = u32::try_from(more).map_err(|_| self.budget.busy())?;
        match self.budget.free.try_acquire_many(permits) {
            Ok(permit) => permit.forget(),
            Err(_) => return Err(self.budget.busy()),
        }
        self.bytes = total;
        self.budget.metrics.inflight_body_bytes.inc_by(more as i64);
        Ok(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.free.add_permits(self.bytes);
            self.budget
                .metrics
                .inflight_body_bytes
                .dec_by(self.bytes as i64);
        }
    }
}

/// A request body read whole, holding its share of the budget until dropped.
pub(super) struct Body {
    bytes: Vec<u8>,
    held: Held,
}

impl Body {
    /// The bytes, and the share of the budget to keep while they (or what is made of them) live.
    pub(super) fn into_parts(self) -> (Vec<u8>, Held) {
        (self.bytes, self.held)
    }
}

impl std::ops::Deref for Body {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

/// Reads a body of at most `limit` bytes into memory (`Content-Type` was checked by the guard).
pub(super) async fn read(
    budget: &Arc<BodyBudget>,
    headers: &HeaderMap,
    body: axum::body::Body,
    limit: usize,
) -> Result<Body, ApiError> {
    let declared = declared_len(headers);
    let mut held = Held::new(budget);
    let mut bytes = Vec::new();
    if declared <= limit {
        held.cover(declared)?;
        bytes.reserve_exact(declared);
    }
    receive(body, declared, limit, &mut held, &mut bytes).await?;
    Ok(Body { bytes, held })
}

/// Receives a body of at most `limit` bytes into a temporary file in `dir`, then reads it back
/// (see the module's comment).
pub(super) async fn stage(
    budget: &Arc<BodyBudget>,
    headers: &HeaderMap,
    body: axum::body::Body,
    limit: usize,
    dir: PathBuf,
) -> Result<Body, ApiError> {
    let declared = declared_len(headers);
    if declared > limit {
        return Err(drain_too_large(body.into_data_stream(), 0, limit).await);
    }
    let mut held = Held::new(budget);
    held.cover(declared)?;
    let staging_error = {
        let dir = dir.clone();
        move |e: std::io::Error| {
            ApiError::Internal(format!("cannot stage the upload in {}: {e}", dir.display()))
        }
    };
    let file = blocking(move || {
        std::fs::create_dir_all(&dir)?;
        tempfile::tempfile_in(&dir)
    })
    .await
    .map_err(&staging_error)?;
    let mut staged = Staged {
        file: Some(file),
        pending: Vec::new(),
        len: 0,
    };
    receive(body, declared, limit, &mut held, &mut staged).await?;
    let bytes = staged.read_back().await.map_err(staging_error)?;
    Ok(Body { bytes, held })
}

/// The declared `Content-Length`, 0 without one (a chunked body is covered as it arrives).
fn declared_len(headers: &HeaderMap) -> usize {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        .unwrap_or(0)
}

/// Where the chunks of a body go.
trait Sink {
    async fn put(&mut self, chunk: Bytes) -> std::io::Result<()>;
}

impl Sink for Vec<u8> {
    async fn put(&mut self, chunk: Bytes) -> std::io::Result<()> {
        self.extend_from_slice(&chunk);
        Ok(())
    }
}

/// Reads `body` into `sink`, covering every byte with `held`; past `limit` (declared or
/// received), answers `413`.
async fn receive(
    body: axum::body::Body,
    declared: usize,
    limit: usize,
    held: &mut Held,
    sink: &mut impl Sink,
) -> Result<(), ApiError> {
    let mut stream = body.into_data_stream();
    if declared > limit {
        return Err(drain_too_large(stream, 0, limit).await);
    }
    let mut total = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::BadRequest(format!("cannot read the body: {e}")))?;
        total = total.saturating_add(chunk.len());
        if total > limit {
            return Err(drain_too_large(stream, total, limit).await);
        }
        held.cover(total)?;
        sink.put(chunk).await.map_err(|e| {
            ApiError::Internal(format!("cannot keep the body while it arrives: {e}"))
        })?;
    }
    Ok(())
}

/// Reads and throws away up to [`DRAIN_OVERSIZED`] past `limit` (`total` already read), so that
/// the client gets to read the `413`.
async fn drain_too_large(
    mut stream: axum::body::BodyDataStream,
    mut total: usize,
    limit: usize,
) -> ApiError {
    while total <= limit.saturating_add(DRAIN_OVERSIZED) {
        match stream.next().await {
            Some(Ok(chunk)) => total = total.saturating_add(chunk.len()),
            _ => break,
        }
    }
    ApiError::body_too_large(limit)
}

/// An upload on its way to a temporary file, written a megabyte at a time off the executor.
struct Staged {
    /// `None` only while a write has it.
    file: Option<std::fs::File>,
    pending: Vec<u8>,
    len: usize,
}

impl Staged {
    async fn flush(&mut self) -> std::io::Result<()> {
        let mut file = self.file.take().expect("one write at a time");
        let pending = std::mem::take(&mut self.pending);
        let (file, pending) = blocking(move || {
            file.write_all(&pending)?;
            Ok((file, pending))
        })
        .await?;
        self.file = Some(file);
        self.pending = pending;
        self.pending.clear();
        Ok(())
    }

    /// The whole upload, from the file.
    async fn read_back(mut self) -> std::io::Result<Vec<u8>> {
        self.flush().await?;
        let mut file = self.file.take().expect("flushed");
        let len = self.len;
        blocking(move || {
            file.rewind()?;
            let mut bytes = Vec::with_capacity(len);
            file.read_to_end(&mut bytes)?;
            Ok(bytes)
        })
        .await
    }
}

impl Sink for Staged {
    async fn put(&mut self, chunk: Bytes) -> std::io::Result<()> {
        self.len += chunk.len();
        self.pending.extend_from_slice(&chunk);
        if self.pending.len() >= STAGE_WRITE {
            self.flush().await?;
        }
        Ok(())
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .expect("staging task panicked")
}
