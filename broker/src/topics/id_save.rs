//! Writing a topic's produce-id snapshot ([`super::id_snapshot`]; docs/storage.md, "Produce-id
//! snapshots"): at a clean stop once its logs are closed, and from every retention pass when
//! its partitions advanced since the last one, so that a boot after a crash reads only what came
//! since that pass.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::TopicLog;
use super::dedup::Ticket;
use super::id_snapshot::{self, Encoder, IdEntry, Written};
use crate::storage::{StorageError, Vfs};

/// How long a snapshot waits for appends under way to say where their ids went; an append
/// that takes longer (a disk that hangs) costs this snapshot, not correctness.
const PENDING_WAIT: Duration = Duration::from_secs(10);

/// What is on disk of a topic's snapshot, so that an idle topic is not written again, and
/// whether the topic is gone (then nothing is written: a write would leave a file in the
/// directory being removed).
#[derive(Debug, Default)]
pub struct Saved(Mutex<SavedState>);

#[derive(Debug, Default)]
struct SavedState {
    retired: bool,
    /// What the file on disk was read to; `None` when it is unknown or behind.
    scanned_to: Option<Vec<u64>>,
}

impl Saved {
    /// The file on disk was read to `scanned_to` (boot found it current).
    pub fn on_disk(scanned_to: Vec<u64>) -> Self {
        Self(Mutex::new(SavedState {
            retired: false,
            scanned_to: Some(scanned_to),
        }))
    }

    /// No snapshot is written any more (the topic is being deleted); waits for one being
    /// written. Blocking.
    pub fn retire(&self) {
        self.0.lock().retired = true;
    }

    /// Whether the file on disk was read to exactly `next`: nothing was stored since.
    fn is_current(&self, next: &[u64]) -> bool {
        self.0.lock().scanned_to.as_deref() == Some(next)
    }
}

/// Takes a snapshot of `t`'s ids of the window (`window_ms` before `now_ms`) while produces
/// go on; `None` if an append under way did not finish within `PENDING_WAIT` (10 s).
///
/// Why it keeps the file's promise: each partition's committed next offset `N` is read
/// *before* the table is looked at. An id whose message is committed below `N` was claimed
/// before its append, and its claim is then either stored in the table — taken if below `N` —
/// or still pending: its append has committed but has not yet said where (`Dedup::stored`
/// comes after the commit). A pending claim is waited for once every shard is read, and taken
/// with the position it resolves to (if below `N`; a withdrawn one stored nothing). Ids stored
/// at or past `N` are left to the boot's scan, which starts at `N`.
pub async fn take(t: &Arc<TopicLog>, window_ms: u64, now_ms: u64) -> Option<Written> {
    let horizon = now_ms.saturating_sub(window_ms);
    let topic = t.clone();
    let (encoder, pending) = tokio::task::spawn_blocking(move || dump(&topic, horizon))
        .await
        .expect("id snapshot task panicked");
    resolve(t, encoder, pending).await
}

/// A claim whose append was under way when the table was read, and when it was claimed.
pub(super) type Pending = (Ticket, u64);

/// Reads each partition's committed next offset, then every shard of the table: the ids
/// stored below those offsets since `horizon`, and the claims still pending. Blocking.
pub(super) fn dump(t: &TopicLog, horizon: u64) -> (Encoder, Vec<Pending>) {
    let next: Vec<u64> = t.partitions().iter().map(|p| p.log.next_offset()).collect();
    let mut encoder = Encoder::new(t.id, t.dedup.seed(), next);
    let mut pending = Vec::new();
    t.dedup.visit(
        |key, partition, offset, at_ms| {
            if at_ms >= horizon {
                encoder.push(IdEntry {
                    key,
                    partition,
                    offset,
                    at_ms,
                });
            }
        },
        |ticket, at_ms| pending.push((ticket, at_ms)),
    );
    (encoder, pending)
}

/// Adds where each pending claim's message went, once its append says.
pub(super) async fn resolve(
    t: &TopicLog,
    mut encoder: Encoder,
    pending: Vec<Pending>,
) -> Option<Written> {
    for (ticket, at_ms) in pending {
        match tokio::time::timeout(PENDING_WAIT, t.dedup.wait(&ticket)).await {
            Ok(Some((partition, offset))) => {
                encoder.push(IdEntry {
                    key: ticket.key(),
                    partition,
                    offset,
                    at_ms,
                });
            }
            // Withdrawn: its append failed and stored nothing.
            Ok(None) => {}
            Err(_) => {
                tracing::warn!(topic = %t.topic, "an append did not finish in time; the produce-id snapshot is skipped this time");
                return None;
            }
        }
    }
    Some(encoder.finish())
}

/// Writes `t`'s snapshot unless the one on disk is current; `true` if it wrote one.
pub async fn save(
    vfs: Arc<dyn Vfs>,
    t: &Arc<TopicLog>,
    window_ms: u64,
    now_ms: u64,
) -> Result<bool, StorageError> {
    // A cluster member rebuilds its ids from its replicated logs (docs/cluster.md, "Produce
    // ids in a cluster").
    if t.first().log.clustered() {
        return Ok(false);
    }
    let next: Vec<u64> = t.partitions().iter().map(|p| p.log.next_offset()).collect();
    if t.ids_file.is_current(&next) {
        return Ok(false);
    }
    let Some(written) = take(t, window_ms, now_ms).await else {
        return Ok(false);
    };
    let t = t.clone();
    tokio::task::spawn_blocking(move || {
        // Held while writing: two writers (a retention pass still running at shutdown) never
        // share the temporary file, and a delete's `retire` waits for the write.
        let mut state = t.ids_file.0.lock();
        let behind = |on_disk: &Vec<u64>| {
            on_disk.len() >= written.scanned_to.len()
                && on_disk.iter().zip(&written.scanned_to).all(|(d, w)| d >= w)
        };
        if state.retired || state.scanned_to.as_ref().is_some_and(behind) {
            return Ok(false);
        }
        // Unknown until it is written: a failed write may have left either file.
        state.scanned_to = None;
        id_snapshot::write(&*vfs, &t.dir, &written.bytes)?;
        state.scanned_to = Some(written.scanned_to);
        Ok(true)
    })
    .await
    .expect("id snapshot task panicked")
}
