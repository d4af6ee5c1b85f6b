//! Opening topics: every topic of a root dir at boot, and one topic when it is created; the
//! trash a delete moves a topic's directory into.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mmmq_core::{Topic, TopicConfig};
use tokio_util::sync::CancellationToken;

use super::{TopicLog, dedup, id_restore, id_save, id_snapshot, incarnation, partition, settings};
use crate::storage::vfs::create_dir_durably;
use crate::storage::{LogConfig, StorageError, Vfs};

/// Whether a topic found at boot counts against `--max-topics`: all but the dead-letter and
/// plugin-log topics the broker makes for its dispatchers (one each at most). (A topic the topic
/// API made under those two prefixes counts while it runs, and not after a restart.)
fn counts(topic: &Topic) -> bool {
    let name = topic.as_str();
    !(name.starts_with("__dlq.") || name.starts_with("__logs."))
}

/// Opens a topic: its configuration, every partition it has on disk or that its
/// configuration (else `default_partitions`) asks for, and its produce ids of the window (from
/// its snapshot and what its logs stored since). Blocking.
pub(super) fn open_topic(
    topic: Topic,
    dir: PathBuf,
    vfs: Arc<dyn Vfs>,
    config: LogConfig,
    default_partitions: u32,
    ids: Arc<dedup::IdBudget>,
) -> Result<(TopicLog, id_restore::Restored), StorageError> {
    let settings = settings::load(&*vfs, &dir)?;
    let wanted = settings
        .as_ref()
        .map_or(default_partitions, |c| c.partitions)
        .max(partition::partitions_on_disk(&*vfs, &dir));
    let id = incarnation::read(&*vfs, &dir, &topic)?;
    let partitions = (0..wanted)
        .map(|p| partition::open_partition(&dir, id, p, &vfs, &config))
        .collect::<Result<Vec<_>, _>>()?;
    let window = settings
        .as_ref()
        .map_or(TopicConfig::default().dedup_window_ms, |c| {
            c.dedup_window_ms
        });
    let next: Vec<u64> = partitions.iter().map(|p| p.log.next_offset()).collect();
    // A cluster member's partitions show nothing until their groups open, which restore their
    // ids then (docs/cluster.md, "Produce ids in a cluster"); it keeps no snapshot of them.
    let clustered = config.raft_header;
    let snapshot = if clustered {
        None
    } else {
        id_snapshot::load(&*vfs, &dir, &topic, id, &next)
    };
    // The snapshot's keys are hashes under its seed: the table must use the same one.
    let dedup = dedup::Dedup::with_seed(ids, snapshot.as_ref().map(|s| s.seed));
    // A snapshot read to every log's end is current: an idle topic is not written again.
    let saved = match &snapshot {
        Some(s) if s.scanned_to == next => id_save::Saved::on_disk(next),
        _ => id_save::Saved::default(),
    };
    let t = TopicLog::new(topic, id, dir, partitions, settings, dedup, saved);
    let restored = if clustered {
        id_restore::Restored::default()
    } else {
        id_restore::restore(&t, snapshot, window, mmmq_core::now_ms())?
    };
    Ok((t, restored))
}

/// Renames a topic's directory into the trash durably, then removes it.
pub(super) fn move_to_trash(vfs: &dyn Vfs, dir: &Path, trash: &Path) -> Result<(), StorageError> {
    create_dir_durably(vfs, trash)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    // The topic's name, cut so that the suffix still fits a 255-byte file name (a topic name is
    // up to 249 ASCII characters: a whole one with its suffix did not, and its delete failed).
    let name: String = dir
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        .chars()
        .take(200)
        .collect();
    let target = trash.join(format!("{name}.{nanos}"));
    vfs.rename(dir, &target)
        .map_err(|e| StorageError::io(dir, e))?;
    let parent = dir.parent().unwrap_or(Path::new("."));
    vfs.sync_dir(parent)
        .map_err(|e| StorageError::io(parent, e))?;
    vfs.sync_dir(trash)
        .map_err(|e| StorageError::io(trash, e))?;
    if let Err(e) = vfs.remove_dir_all(&target) {
        tracing::warn!(dir = %target.display(), error = %e, "cannot remove a deleted topic's files; the next boot tries again");
    }
    Ok(())
}

/// Empties the trash a crash left behind (topics deleted but not yet removed).
fn empty_trash(vfs: &dyn Vfs, trash: &Path) {
    if !vfs.is_dir(trash) {
        return;
    }
    for name in vfs.read_dir(trash).unwrap_or_default() {
        let path = trash.join(name);
        if let Err(e) = vfs.remove_dir_all(&path) {
            tracing::warn!(dir = %path.display(), error = %e, "cannot empty the trash");
        }
    }
}

pub(super) fn restore_all(
    dir: &std::path::Path,
    (vfs, shared): (&dyn Vfs, Arc<dyn Vfs>),
    config: &LogConfig,
    budget: &Arc<dedup::IdBudget>,
    interrupt: &CancellationToken,
) -> Result<BTreeMap<Topic, Arc<TopicLog>>, StorageError> {
    let mut out = BTreeMap::new();
    empty_trash(vfs, &dir.parent().unwrap_or(Path::new(".")).join("trash"));
    if !vfs.is_dir(dir) {
        create_dir_durably(vfs, dir)?;
        return Ok(out);
    }
    let mut names = vfs.read_dir(dir).map_err(|e| StorageError::io(dir, e))?;
    names.sort();
    let total = names.len();
    let start = Instant::now();
    let mut last_report = Instant::now();
    let mut ids = id_restore::Restored::default();
    for (i, name) in names.into_iter().enumerate() {
        if interrupt.is_cancelled() {
            return Err(StorageError::Interrupted { done: i, total });
        }
        let path = dir.join(&name);
        if !vfs.is_dir(&path) {
            continue;
        }
        if name.starts_with(incarnation::STAGING_PREFIX) {
            // A topic a crash stopped half made: it never existed.
            if let Err(e) = vfs.remove_dir_all(&path) {
                tracing::warn!(dir = %path.display(), error = %e, "cannot remove a half-made topic");
            }
            continue;
        }
        let topic = match Topic::new(name.clone()) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(dir = %path.display(), error = %e, "skipping a directory that is not a topic");
                continue;
            }
        };
        let (mut t, restored) = open_topic(
            topic.clone(),
            path,
            shared.clone(),
            config.clone(),
            1,
            budget.clone(),
        )?;
        ids += restored;
        t.counted = counts(&topic);
        out.insert(topic, Arc::new(t));
        if last_report.elapsed() > Duration::from_secs(2) {
            tracing::info!(done = i + 1, total, "restoring topics");
            last_report = Instant::now();
        }
    }
    tracing::info!(
        topics = out.len(),
        ids_loaded = ids.loaded,
        messages_scanned = ids.scanned,
        elapsed_ms = start.elapsed().as_millis() as u64,
        "topics restored"
    );
    Ok(out)
}
