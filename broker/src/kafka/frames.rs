//! Reading a connection's frames within the listener's budgets (docs/kafka.md, "Connections"),
//! the ones HTTP has too:
//!
//! - **Time.** A new connection's first frame size must come within `--first-byte-timeout-ms`;
//!   with `--auth-token`, the SASL login must be done within `--header-timeout-ms` of the connect,
//!   however many ApiVersions the client sends meanwhile; a started frame may go that long
//!   without a byte; between requests a connection may idle `--kafka-idle-ms`, and ApiVersions
//!   does not count as activity (a client that only asks it is idle).
//! - **Memory.** Every frame's bytes count against one budget for the listener
//!   (`--max-inflight-body-bytes`), taken whole when the frame's size arrives and given back
//!   once its answer is written, as Kafka's `queued.max.request.bytes`: a connection waits (its
//!   socket unread) until the budget has room, for at most `--header-timeout-ms`, then is closed.
//!   Taking the whole size at once is what keeps the waiting deadlock-free (no two half-read
//!   frames waiting on each other). The buffer itself grows as the bytes arrive, so a size that
//!   claims 100 MiB and sends nothing holds a reservation, not memory.

use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::connection::Refused;

/// A frame read whole, with its share of the budget (given back when it is dropped).
pub(crate) struct Frame {
    pub bytes: Bytes,
    /// Held until the request is answered.
    pub _share: Option<OwnedSemaphorePermit>,
}

/// What the next frame's size said.
pub(crate) enum Next {
    /// A frame of this many bytes follows.
    Size(usize),
    /// The client closed the connection between requests, or it idled out: nothing wrong.
    Done,
}

/// The deadlines a connection's next frame size must meet.
pub(crate) struct Clock {
    connected: Instant,
    last_active: Instant,
    first: bool,
}

impl Clock {
    pub(crate) fn new() -> Self {
        let now = Instant::now();
        Self {
            connected: now,
            last_active: now,
            first: true,
        }
    }

    /// A request other than ApiVersions was answered: the idle limit counts from now.
    pub(crate) fn active(&mut self) {
        self.last_active = Instant::now();
    }

    /// By when a client that is not logged in must be, its frames read whole included.
    pub(crate) fn login_by(&self, limits: &super::Limits) -> Instant {
        self.connected + limits.login
    }

    /// A frame arrived.
    pub(crate) fn arrived(&mut self) {
        self.first = false;
    }

    /// When the next size must have come, and the refusal if it has not (`None`: idle, closed
    /// quietly).
    pub(crate) fn deadline(
        &self,
        limits: &super::Limits,
        idle: Duration,
        authenticated: bool,
    ) -> (Instant, Option<Refused>) {
        let mut at = self.last_active + idle;
        let mut refusal = None;
        if !authenticated {
            let login = self.connected + limits.login;
            if login < at {
                at = login;
                refusal = Some(Refused::Stalled("a SASL login"));
            }
        }
        if self.first {
            let first = self.connected + limits.first_byte;
            if first < at {
                at = first;
                refusal = Some(Refused::Stalled("the first request"));
            }
        }
        (at, refusal)
    }
}

/// Reads the next frame's size, by `deadline`.
pub(crate) async fn size<R: AsyncRead + Unpin>(
    r: &mut R,
    deadline: (Instant, Option<Refused>),
) -> Result<Next, Refused> {
    let (at, refusal) = deadline;
    match tokio::time::timeout_at(at.into(), r.read_i32()).await {
        Ok(Ok(size)) if size >= 0 => Ok(Next::Size(size as usize)),
        Ok(Ok(size)) => Err(Refused::FrameSize(size.into(), 0)),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(Next::Done),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => match refusal {
            Some(refusal) => Err(refusal),
            None => Ok(Next::Done),
        },
    }
}

/// Takes `size` bytes of `budget` (waiting at most `stall`), then reads the frame, each read
/// within `stall` of the last, and all of it by `by` when given (a client not logged in: a
/// frame trickling in a byte at a time must not outlive the login deadline). `head`, when
/// given, are bytes of the frame read already.
pub(crate) async fn read<R: AsyncRead + Unpin>(
    r: &mut R,
    size: usize,
    head: &[u8],
    budget: &std::sync::Arc<Semaphore>,
    total: usize,
    stall: Duration,
    by: Option<Instant>,
) -> Result<Frame, Refused> {
    let within = || match by {
        Some(by) => stall.min(by.saturating_duration_since(Instant::now())),
        None => stall,
    };
    if size > total {
        return Err(Refused::FrameSize(size as i64, total));
    }
    let permits = u32::try_from(size).map_err(|_| Refused::FrameSize(size as i64, total))?;
    let share = if permits == 0 {
        None
    } else {
        Some(
            tokio::time::timeout(within(), budget.clone().acquire_many_owned(permits))
                .await
                .map_err(|_| Refused::Budget(size))?
                .expect("never closed"),
        )
    };
    let mut bytes = Vec::with_capacity(size.min(GROWTH));
    bytes.extend_from_slice(head);
    while bytes.len() < size {
        if bytes.len() == bytes.capacity() {
            // Doubling, at least by GROWTH, never past the frame's size.
            bytes.reserve(bytes.capacity().max(GROWTH).min(size - bytes.len()));
        }
        let want = (size - bytes.len()).min(bytes.capacity() - bytes.len());
        let mut chunk = (&mut *r).take(want as u64);
        let n = tokio::time::timeout(within(), chunk.read_buf(&mut bytes))
            .await
            .map_err(|_| Refused::Stalled("the rest of a frame"))??;
        if n == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
    }
    Ok(Frame {
        bytes: Bytes::from(bytes),
        _share: share,
    })
}

/// A frame's buffer starts at this and doubles as its bytes arrive.
const GROWTH: usize = 64 << 10;

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// Frames of every size around the buffer's growth steps arrive whole, in pieces, and their
    /// share of the budget goes back with them.
    #[tokio::test]
    async fn a_frame_arrives_whole_whatever_its_size_and_gives_its_share_back() {
        let budget = std::sync::Arc::new(Semaphore::new(1 << 20));
        for size in [
            0,
            1,
            GROWTH - 1,
            GROWTH,
            GROWTH + 1,
            3 * GROWTH + 17,
            600_000,
        ] {
            let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            let (mut client, mut server) = tokio::io::duplex(8 << 10);
            let sent = data.clone();
            let writer = tokio::spawn(async move {
                for piece in sent.chunks(10_000) {
                    client.write_all(piece).await.unwrap();
                }
                client
            });
            let frame = read(
                &mut server,
                size,
                &[],
                &budget,
                1 << 20,
                Duration::from_secs(5),
                None,
            )
            .await
            .unwrap();
            assert_eq!(frame.bytes, data, "size {size}");
            assert_eq!(budget.available_permits(), (1 << 20) - size);
            drop(frame);
            assert_eq!(budget.available_permits(), 1 << 20);
            drop(writer.await.unwrap());
        }
    }
}
