//! The store on a disk that fails at every step of an append of messages and entries without
//! one, then loses what was not synced (docs/cluster.md, "Clustered partitions on disk",
//! recovery): it opens, holds a prefix of what was appended with no gap, and never less than what
//! Raft was told is flushed.

use std::path::Path;
use std::sync::Arc;

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::type_config::TypeConfigExt;

use super::SegmentLogStore;
use super::layout::Entry;
use super::tests::{all, id, msg};
use crate::cluster::types::{GroupKind, Raft};
use crate::storage::LogConfig;
use crate::storage::vfs::Vfs;
use crate::storage::vfs::sim::{CutMode, SimFs};

fn history() -> Vec<Entry> {
    let members = openraft::Membership::new_with_defaults(vec![[1, 2, 3].into()], []);
    vec![
        msg(1, 1),
        msg(1, 2),
        RaftEntry::new_blank(id(2, 3)),
        msg(2, 4),
        RaftEntry::new_membership(id(2, 5), members),
        msg(2, 6),
        msg(2, 7),
        RaftEntry::new_blank(id(3, 8)),
        msg(3, 9),
    ]
}

async fn open(vfs: &Arc<dyn Vfs>) -> Result<SegmentLogStore, super::StoreError> {
    let config = LogConfig {
        segment_max_bytes: 200,
        retry_after: std::time::Duration::ZERO,
        ..LogConfig::default()
    };
    SegmentLogStore::open(
        Path::new("/sim/p"),
        vfs.clone(),
        config,
        GroupKind::Partition,
    )
    .await
}

/// Appends `entries` in the calls `splits` says; returns how many entries Raft was told are
/// flushed (a prefix: the store stops at its first failure).
async fn append_all(store: &mut SegmentLogStore, entries: &[Entry], splits: &[usize]) -> usize {
    let mut flushed = 0;
    let mut waits = Vec::new();
    let mut at = 0;
    for &n in splits {
        let (tx, rx) = Raft::oneshot();
        let batch = entries[at..at + n].to_vec();
        at += n;
        if store.append(batch, IOFlushed::signal(tx)).await.is_err() {
            break;
        }
        waits.push((at, rx));
    }
    for (end, rx) in waits {
        match rx.await {
            Ok(Ok(())) => flushed = end,
            _ => break,
        }
    }
    flushed
}

/// A fresh simulated disk and the store on it.
async fn fresh() -> (SimFs, Arc<dyn Vfs>, SegmentLogStore) {
    let fs = SimFs::new();
    fs.mkdir_durable(Path::new("/sim"));
    let vfs: Arc<dyn Vfs> = Arc::new(fs.clone());
    let store = open(&vfs).await.unwrap();
    (fs, vfs, store)
}

/// [`fresh`], holding `entries` (appended in one call, all flushed).
async fn fresh_holding(entries: &[Entry]) -> (SimFs, Arc<dyn Vfs>, SegmentLogStore) {
    let (fs, vfs, mut store) = fresh().await;
    assert_eq!(
        append_all(&mut store, entries, &[entries.len()]).await,
        entries.len()
    );
    (fs, vfs, store)
}

/// Cuts the power and opens the store again, which must work.
async fn cut_and_reopen(
    fs: &SimFs,
    vfs: &Arc<dyn Vfs>,
    seed: u64,
    mode: CutMode,
    what: &str,
) -> SegmentLogStore {
    fs.power_cut(seed, mode);
    open(vfs)
        .await
        .unwrap_or_else(|e| panic!("opens ({what}): {e}"))
}

const MODES: [CutMode; 3] = [CutMode::SyncedOnly, CutMode::Prefix, CutMode::TornSectors];

#[tokio::test(flavor = "multi_thread")]
async fn a_power_cut_at_any_step_of_appends_keeps_every_flushed_entry_and_no_gap() {
    let h = history();
    let splits = [2, 3, 1, 3];
    let mut finished = false;
    let mut ops = 0;
    while !finished {
        for mode in MODES {
            let (fs, vfs, mut store) = fresh().await;
            fs.die_after(ops);
            let flushed = append_all(&mut store, &h, &splits).await;
            finished = flushed == h.len();
            drop(store);
            let what = format!("power failing after {ops} ops, {mode:?}, {flushed} flushed");
            let mut store = cut_and_reopen(&fs, &vfs, ops * 31 + 7, mode, &what).await;
            let got = all(&mut store).await;
            assert!(
                got.len() >= flushed,
                "lost flushed entries ({what}): {got:?}"
            );
            assert_eq!(got[..], h[..got.len()], "a prefix ({what})");
            // The offsets agree with the frames: every message reads back where the log says.
            let messages = got
                .iter()
                .filter(|e| matches!(e.payload, openraft::EntryPayload::Normal(_)))
                .count();
            assert_eq!(store.log().durable_end(), messages as u64, "{what}");
            // And the log takes the rest.
            let (tx, rx) = Raft::oneshot();
            store
                .append(h[got.len()..].to_vec(), IOFlushed::signal(tx))
                .await
                .unwrap();
            rx.await.unwrap().unwrap();
            assert_eq!(all(&mut store).await, h, "{what}");
        }
        ops += 1;
        assert!(ops < 400, "the appends never finished");
    }
    assert!(ops > 5, "{ops}");
}

/// A new leader's entries replace an uncommitted tail while the disk fails at every step: what
/// opens is the old log or the new one, each as a prefix of at least what was kept, never a mix;
/// and a purge cut short leaves every entry after its point.
#[tokio::test(flavor = "multi_thread")]
async fn a_power_cut_at_any_step_of_a_cut_or_a_purge_leaves_one_history() {
    let old = history();
    let new: Vec<Entry> = old[..4]
        .iter()
        .cloned()
        .chain([msg(4, 5), RaftEntry::new_blank(id(4, 6)), msg(4, 7)])
        .collect();
    let mut finished = false;
    let mut ops = 0;
    while !finished {
        for mode in MODES {
            let (fs, vfs, mut store) = fresh_holding(&old).await;
            fs.die_after(ops);
            let mut done = store.truncate_after(Some(id(2, 4))).await.is_ok();
            done = done && append_all(&mut store, &new[4..], &[3]).await == 3;
            done = done && store.purge(id(2, 3)).await.is_ok();
            finished = done;
            drop(store);
            let what = format!("power failing after {ops} ops, {mode:?}");
            let mut store = cut_and_reopen(&fs, &vfs, ops * 17 + 3, mode, &what).await;
            let state = store.get_log_state().await.unwrap();
            let got = all(&mut store).await;
            let from = state.last_purged_log_id.map_or(0, |p| p.index as usize);
            let one_of = [&old, &new]
                .into_iter()
                .any(|h| got.len() + from <= h.len() && got[..] == h[from..from + got.len()]);
            assert!(one_of, "{what}: {got:?}");
            assert!(from + got.len() >= 4, "{what}: the cut keeps 4");
            if done {
                assert_eq!((from, &got[..]), (3, &new[3..]), "{what}");
            }
        }
        ops += 1;
        assert!(ops < 400, "never finished");
    }
    assert!(ops > 5, "{ops}");
}

/// Retention's purge at a segment boundary (docs/cluster.md, "Retention in a cluster") while the
/// disk fails at every step: what opens is the log before the purge or after it — the purge
/// point, the sidecar and the segments agreeing (a purge cut short after its point was written
/// is finished at open) — and every entry after the purge point is there.
#[tokio::test(flavor = "multi_thread")]
async fn a_power_cut_at_any_step_of_a_retention_purge_opens_before_or_after_it() {
    let h: Vec<Entry> = (1..=40)
        .map(|i| {
            if i % 6 == 0 {
                RaftEntry::new_blank(id(1, i))
            } else {
                msg(1, i)
            }
        })
        .collect();
    let mut finished = false;
    let mut ops = 0;
    while !finished {
        for mode in MODES {
            let (fs, vfs, mut store) = fresh_holding(&h).await;
            let starts: Vec<u64> = store.log().segments().iter().map(|s| s.start).collect();
            assert!(starts.len() >= 4, "{starts:?}");
            let boundary = starts[2];
            let frame = store.log().read_raft_from(boundary - 1, 1, 1).unwrap();
            let (term, index) = frame[0].entry.as_ref().unwrap().0;
            let last = id(term, index);
            fs.die_after(ops);
            finished = store.purge(last).await.is_ok();
            drop(store);
            let what = format!("power failing after {ops} ops, {mode:?}");
            let mut store = cut_and_reopen(&fs, &vfs, ops * 13 + 5, mode, &what).await;
            let purged = store.get_log_state().await.unwrap().last_purged_log_id;
            let got = all(&mut store).await;
            match purged {
                None => {
                    assert_eq!(got, h, "{what}");
                    assert_eq!(store.log().first_offset(), 0, "{what}");
                }
                Some(p) => {
                    assert_eq!(p, last, "{what}");
                    assert_eq!(got[..], h[index as usize..], "{what}");
                    assert_eq!(store.log().first_offset(), boundary, "{what}");
                    let raw =
                        crate::storage::vfs::read_whole(&*vfs, Path::new("/sim/p/raft/entries"))
                            .unwrap()
                            .unwrap_or_default();
                    let records = super::parse_sidecar(&raw).unwrap().entries;
                    assert!(records.iter().all(|e| e.log_id.index > index), "{what}");
                }
            }
            if finished {
                assert_eq!(purged, Some(last), "{what}");
            }
        }
        ops += 1;
        assert!(ops < 400, "never finished");
    }
    assert!(ops > 3, "{ops}");
}
