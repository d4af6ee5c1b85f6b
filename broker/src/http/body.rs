//! Request bodies (docs/http-api.md, "HTTP API"): read up to a limit (`413` past it), and counted against
//! one budget of bytes shared by every request in flight (`--max-inflight-body-bytes`), so that
//! many clients sending large or unfinished bodies cannot make the broker hold unbounded memory.
//!
//! A request takes its share of the budget as its bytes arrive, chunk by chunk, never on what its
//! `Content-Length` declares: a request that declares 64 MiB and sends nothing holds nothing, so
//! a few of them cannot lock everyone else out until the request deadline. The declared length
//! still refuses at once what cannot succeed: `413` past the route's limit, and `503` when it is
//! more than the budget has free at that moment (nothing is reserved by that check). When the
//! budget runs out while a body arrives the answer is `503` with `Retry-After`, and the
//! connection is closed: waiting would hold the connection, and a client's retry is as good. The
//! share is given back when the handler is done with the bytes, or when the request ends
//! otherwise (its future dropped: the client left, the deadline passed).
//!
//! A body that stops arriving for the header timeout (`--header-timeout-ms`, 10 s) is answered
//! `408` and gives its share back then, not at the request deadline (60 s): a client that has
//! started sending keeps sending, the same bound as for the bytes of its headers.
//!
//! In memory a body is a `Vec` whose capacity is what is counted, grown by doubling up to the
//! declared length (exactly that length at the end) or, for a chunked body, up to the limit.
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
use std::time::Duration;

use axum::body::BodyDataStream;
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
    /// The longest a body may go without a byte (see the module's comment).
    idle: Duration,
    metrics: Arc<HttpMetrics>,
}

impl BodyBudget {
    /// A budget of `size` bytes, for bodies that never stop for `idle`.
    pub(crate) fn new(size: usize, idle: Duration, metrics: Arc<HttpMetrics>) -> Arc<Self> {
        Arc::new(Self {
            free: Semaphore::new(size.min(Semaphore::MAX_PERMITS)),
            size,
            idle,
            metrics,
        })
    }

    fn spent(&self) -> String {
        self.metrics.body_budget_refusals.inc();
        format!(
            "the broker holds its limit of {} bytes of request bodies (--max-inflight-body-bytes); \
             retry shortly",
            self.size
        )
    }

    /// Refuses at once a body that declares more than is free now; reserves nothing. The body is
    /// left unread, so the connection closes after the answer (a client reusing it would find
    /// it gone).
    fn admit(&self, declared: usize) -> Result<(), ApiError> {
        if declared > self.free.available_permits() {
            return Err(ApiError::BusyMidBody(self.spent()));
        }
        Ok(())
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

    /// Grows the share to `total` bytes, or refuses (`503`, closing the connection: the body is
    /// under way) when the budget does not have them.
    fn cover(&mut self, total: usize) -> Result<(), ApiError> {
        let Some(more) = total.checked_sub(self.bytes).filter(|&n| n > 0) else {
            return Ok(());
        };
        let spent = |budget: &BodyBudget| ApiError::BusyMidBody(budget.spent());
        let permits = u32::try_from(more).map_err(|_| spent(&self.budget))?;
        match self.budget.free.try_acquire_many(permits) {
            Ok(permit) => permit.forget(),
            Err(_) => return Err(spent(&self.budget)),
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
    body: axum::body::Body,
    limit: usize,
) -> Result<Body, ApiError> {
    let declared = declared_len(&body);
    let stream = precheck(budget, body, declared, limit).await?;
    let mut held = Held::new(budget);
    let mut memory = InMemory {
        bytes: Vec::new(),
        bound: if declared > 0 { declared } else { limit },
    };
    receive(stream, limit, &mut held, &mut memory).await?;
    Ok(Body {
        bytes: memory.bytes,
        held,
    })
}

/// Receives a body of at most `limit` bytes into a temporary file in `dir`, then reads it back
/// (see the module's comment).
pub(super) async fn stage(
    budget: &Arc<BodyBudget>,
    body: axum::body::Body,
    limit: usize,
    dir: PathBuf,
) -> Result<Body, ApiError> {
    let declared = declared_len(&body);
    let stream = precheck(budget, body, declared, limit).await?;
    let mut held = Held::new(budget);
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
    receive(stream, limit, &mut held, &mut staged).await?;
    let bytes = staged.read_back().await.map_err(staging_error)?;
    Ok(Body { bytes, held })
}

/// The declared `Content-Length` (hyper's exact size hint), 0 without one (a chunked body is
/// covered as it arrives).
fn declared_len(body: &axum::body::Body) -> usize {
    use axum::body::HttpBody;
    body.size_hint()
        .exact()
        .map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX))
}

/// Refuses a body at once, before any of it is read: `413` (drained, so that the client sees the
/// answer) when it declares more than `limit`, `503` when it declares more than the budget has
/// free. Otherwise hands back its stream, reserving nothing.
async fn precheck(
    budget: &BodyBudget,
    body: axum::body::Body,
    declared: usize,
    limit: usize,
) -> Result<BodyDataStream, ApiError> {
    let stream = body.into_data_stream();
    if declared > limit {
        drain(
            stream,
            limit.saturating_add(DRAIN_OVERSIZED),
            budget.idle,
            0,
        )
        .await;
        return Err(ApiError::body_too_large(limit));
    }
    budget.admit(declared)?;
    Ok(stream)
}

/// Where the chunks of a body go.
trait Sink {
    /// The bytes to count against the budget once `more` have been put.
    fn footprint(&self, more: usize) -> usize;
    async fn put(&mut self, chunk: Bytes) -> std::io::Result<()>;
}

/// A body in memory: its capacity is what is counted, so it grows only in steps the budget covers
/// and never past `bound` (the declared length, else the limit) but to hold a chunk.
struct InMemory {
    bytes: Vec<u8>,
    bound: usize,
}

impl Sink for InMemory {
    fn footprint(&self, more: usize) -> usize {
        let need = self.bytes.len() + more;
        if need <= self.bytes.capacity() {
            return self.bytes.capacity();
        }
        (self.bytes.capacity() * 2).min(self.bound).max(need)
    }

    async fn put(&mut self, chunk: Bytes) -> std::io::Result<()> {
        let capacity = self.footprint(chunk.len());
        self.bytes.reserve_exact(capacity - self.bytes.len());
        self.bytes.extend_from_slice(&chunk);
        Ok(())
    }
}

/// Reads `body` into `sink`, covering every byte with `held`; past `limit` (declared or
/// received), answers `413`; a body that stops for the budget's `idle` time, `408`.
async fn receive(
    mut stream: BodyDataStream,
    limit: usize,
    held: &mut Held,
    sink: &mut impl Sink,
) -> Result<(), ApiError> {
    let idle = held.budget.idle;
    let mut total = 0usize;
    while let Some(chunk) = next_chunk(&mut stream, idle).await? {
        total = total.saturating_add(chunk.len());
        if total > limit {
            let bound = limit.saturating_add(DRAIN_OVERSIZED);
            drain(stream, bound, idle, total).await;
            return Err(ApiError::body_too_large(limit));
        }
        if let Err(spent) = held.cover(sink.footprint(chunk.len())) {
            // What was held is given back before the rest is thrown away.
            *held = Held::new(&held.budget);
            let bound = total.saturating_add(DRAIN_OVERSIZED);
            drain(stream, bound, idle, total).await;
            return Err(spent);
        }
        sink.put(chunk).await.map_err(|e| {
            ApiError::Internal(format!("cannot keep the body while it arrives: {e}"))
        })?;
    }
    Ok(())
}

/// The body's next chunk, `None` at its end; `408` when none comes within `idle`.
async fn next_chunk(
    stream: &mut axum::body::BodyDataStream,
    idle: Duration,
) -> Result<Option<Bytes>, ApiError> {
    match tokio::time::timeout(idle, stream.next()).await {
        Err(_) => Err(ApiError::BodyStalled(idle)),
        Ok(None) => Ok(None),
        Ok(Some(chunk)) => chunk
            .map(Some)
            .map_err(|e| ApiError::BadRequest(format!("cannot read the body: {e}"))),
    }
}

/// Reads and throws away what arrives until `total` (counting what was already read) passes
/// `bound`, the body ends or stalls, so that the client of a refused body gets to read its answer.
async fn drain(
    mut stream: axum::body::BodyDataStream,
    bound: usize,
    idle: Duration,
    mut total: usize,
) {
    while total <= bound {
        match next_chunk(&mut stream, idle).await {
            Ok(Some(chunk)) => total = total.saturating_add(chunk.len()),
            Ok(None) | Err(_) => break,
        }
    }
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
    fn footprint(&self, more: usize) -> usize {
        self.len + more
    }

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
