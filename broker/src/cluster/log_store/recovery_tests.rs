//! The store across purges, reopens, crashes and snapshots, with message entries
//! (docs/cluster.md, "Clustered partitions on disk").

use std::sync::Arc;

use openraft::storage::{RaftLogStorage, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{RaftLogReader, Vote};

use super::files::{RAFT_DIR, Sidecar};
use super::layout::Entry;
use super::tests::{all, append, apply, id, msg, open};
use crate::cluster::machine::{APPLIED, PartitionSnapshot, SNAPSHOT, SnapshotFile, SnapshotMeta};
use crate::cluster::types::LogId;
use crate::storage::vfs::Vfs;
use crate::storage::{Log, LogConfig, OsFs};

/// Entries 1..=n of term `term`: every seventh a blank, the rest messages.
fn entries(term: u64, from: u64, to: u64) -> Vec<Entry> {
    (from..=to)
        .map(|i| {
            if i % 7 == 0 {
                openraft::entry::RaftEntry::new_blank(id(term, i))
            } else {
                msg(term, i)
            }
        })
        .collect()
}

fn messages_before(index: u64) -> u64 {
    (1..index).filter(|i| i % 7 != 0).count() as u64
}

/// The offset of the message at `index` as its frame says.
fn frame_offset(log: &Log, index: u64) -> Option<u64> {
    log.read_raft_from(log.first_offset(), usize::MAX, usize::MAX)
        .unwrap()
        .into_iter()
        .find(|f| f.entry.as_ref().unwrap().0.1 == index)
        .map(|f| f.offset)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_purge_removes_whole_segments_and_the_offsets_go_on() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut store, mut machine) = open(tmp.path()).await.unwrap();
    let h = entries(1, 1, 60);
    append(&mut store, &h).await;
    apply(&mut machine, &h).await;
    let segments = store.log().segments().len();
    store.purge(id(1, 40)).await.unwrap();
    let state = store.get_log_state().await.unwrap();
    assert_eq!(
        (state.last_purged_log_id, state.last_log_id),
        (Some(id(1, 40)), Some(id(1, 60)))
    );
    assert_eq!(all(&mut store).await, h[40..]);
    let first = store.log().first_offset();
    assert!(
        store.log().segments().len() < segments,
        "whole segments went"
    );
    assert!(0 < first && first <= messages_before(41), "{first}");
    let sidecar = std::fs::read(tmp.path().join("raft/entries")).unwrap();
    let left = super::parse_sidecar(&sidecar).unwrap().entries;
    assert!(left.iter().all(|e| e.log_id.index > 40), "{left:?}");
    // Reopened: the same, and the next message continues the offsets.
    store.close().await.unwrap();
    machine.close().await.unwrap();
    drop((store, machine));
    let (mut store, _machine) = open(tmp.path()).await.unwrap();
    assert_eq!(store.get_log_state().await.unwrap(), state);
    assert_eq!(all(&mut store).await, h[40..]);
    append(&mut store, &[msg(1, 61)]).await;
    assert_eq!(frame_offset(store.log(), 61), Some(messages_before(61)));
    // Past the last entry: nothing is held, and the log continues after the purge point.
    store.purge(id(2, 70)).await.unwrap();
    assert!(all(&mut store).await.is_empty());
    append(&mut store, &[msg(2, 71)]).await;
    drop(store);
    let (mut store, _machine) = open(tmp.path()).await.unwrap();
    let state = store.get_log_state().await.unwrap();
    assert_eq!(
        (state.last_purged_log_id, state.last_log_id),
        (Some(id(2, 70)), Some(id(2, 71)))
    );
    assert_eq!(all(&mut store).await, [msg(2, 71)]);
    assert_eq!(frame_offset(store.log(), 71), Some(messages_before(62)));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_or_a_close_leaves_the_same_store_and_state_machine() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut store, mut machine) = open(tmp.path()).await.unwrap();
    let vote = Vote::new(3, 2);
    store.save_vote(&vote).await.unwrap();
    append(&mut store, &entries(1, 1, 30)).await;
    store.truncate_after(Some(id(1, 24))).await.unwrap();
    let h: Vec<Entry> = entries(1, 1, 24)
        .into_iter()
        .chain(entries(3, 25, 45))
        .collect();
    append(&mut store, &h[24..]).await;
    apply(&mut machine, &h[..35]).await;
    store.purge(id(1, 20)).await.unwrap();
    machine.close().await.unwrap();
    let snapshot = |store: &super::SegmentLogStore| {
        let log = store.log();
        (log.next_offset(), log.durable_end(), log.first_offset())
    };
    let before = (
        store.get_log_state().await.unwrap(),
        all(&mut store).await,
        snapshot(&store),
        machine.applied_state().await.unwrap(),
    );
    assert_eq!(before.1, h[20..]);
    assert_eq!(before.2.0, messages_before(36), "applied messages visible");
    for crash in [true, false] {
        if !crash {
            store.close().await.unwrap();
            machine.close().await.unwrap();
        }
        drop((store, machine));
        (store, machine) = open(tmp.path()).await.unwrap();
        let after = (
            store.get_log_state().await.unwrap(),
            all(&mut store).await,
            snapshot(&store),
            machine.applied_state().await.unwrap(),
        );
        assert_eq!(after, before, "crash: {crash}");
        assert_eq!(store.read_vote().await.unwrap(), Some(vote));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sidecar_entry_past_a_gap_is_removed_at_open() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut store, machine) = open(tmp.path()).await.unwrap();
    append(&mut store, &[msg(1, 1), msg(1, 2)]).await;
    store.close().await.unwrap();
    drop((store, machine));
    // A later append's blank at 4 was synced, the message at 3 before it never was.
    let vfs: Arc<dyn Vfs> = Arc::new(OsFs);
    let raft = tmp.path().join(RAFT_DIR);
    let (mut sidecar, _) = Sidecar::load(&vfs, &raft).unwrap();
    sidecar
        .append(&[openraft::entry::RaftEntry::new_blank(id(1, 4))])
        .unwrap();
    let (mut store, _machine) = open(tmp.path()).await.unwrap();
    assert_eq!(
        store.get_log_state().await.unwrap().last_log_id,
        Some(id(1, 2))
    );
    let raw = std::fs::read(raft.join("entries")).unwrap();
    assert!(super::parse_sidecar(&raw).unwrap().entries.is_empty());
    append(&mut store, &[msg(1, 3)]).await;
    assert_eq!(all(&mut store).await, [msg(1, 1), msg(1, 2), msg(1, 3)]);
}

#[tokio::test(flavor = "multi_thread")]
async fn frames_past_a_gap_are_removed_at_open() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join(RAFT_DIR)).unwrap();
    {
        // The sidecar record of the blank at 2 never landed; the frames around it did.
        let config = LogConfig {
            raft_header: true,
            ..LogConfig::default()
        };
        let log = Log::open(tmp.path(), Arc::new(OsFs), config).unwrap();
        let frames = [(1, 1, b"{\"a\":1}".to_vec()), (1, 3, b"{\"a\":3}".to_vec())];
        log.append_raft(&frames).unwrap().await.unwrap();
        log.close().await.unwrap();
    }
    let (mut store, _machine) = open(tmp.path()).await.unwrap();
    let got = all(&mut store).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].log_id, id(1, 1));
    assert_eq!(store.log().durable_end(), 1);
}

/// A snapshot from a leader: `h` applied there, its next offset.
async fn leader_snapshot(h: &[Entry]) -> (SnapshotMeta, PartitionSnapshot) {
    let tmp = tempfile::tempdir().unwrap();
    let (mut store, mut machine) = open(tmp.path()).await.unwrap();
    append(&mut store, h).await;
    apply(&mut machine, h).await;
    let snap = machine
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let data: PartitionSnapshot = serde_json::from_slice(&snap.snapshot).unwrap();
    assert_eq!(data.next_offset, messages_before(h.len() as u64 + 1));
    (snap.meta, data)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_follower_behind_a_snapshot_starts_over_at_its_next_offset() {
    let h = entries(2, 1, 30);
    let (meta, data) = leader_snapshot(&h).await;
    let next = data.next_offset;
    let tmp = tempfile::tempdir().unwrap();
    let (mut store, mut machine) = open(tmp.path()).await.unwrap();
    append(&mut store, &entries(1, 1, 5)).await;
    let bytes = serde_json::to_vec(&data).unwrap();
    machine
        .install_snapshot(&meta, bytes.clone())
        .await
        .unwrap();
    let log = store.log().clone();
    assert_eq!(
        (log.first_offset(), log.durable_end(), log.next_offset()),
        (next, next, next)
    );
    let state = store.get_log_state().await.unwrap();
    assert_eq!(
        (state.last_purged_log_id, state.last_log_id),
        (Some(id(2, 30)), Some(id(2, 30)))
    );
    assert_eq!(machine.applied_state().await.unwrap().0, Some(id(2, 30)));
    assert_eq!(
        machine.get_current_snapshot().await.unwrap().unwrap().meta,
        meta
    );
    append(&mut store, &[msg(3, 31)]).await;
    apply(&mut machine, &[msg(3, 31)]).await;
    assert_eq!(
        log.read(next).unwrap().unwrap(),
        super::tests::payload(&msg(3, 31))
    );
    drop((store, machine, log));
    let (mut store, mut machine) = open(tmp.path()).await.unwrap();
    assert_eq!(all(&mut store).await, [msg(3, 31)]);
    assert_eq!(store.log().first_offset(), next);
    assert_eq!(
        machine.get_current_snapshot().await.unwrap().unwrap().meta,
        meta
    );
    // A follower that holds the snapshot's last entry keeps its log.
    let tmp = tempfile::tempdir().unwrap();
    let (mut store, mut machine) = open(tmp.path()).await.unwrap();
    append(&mut store, &h).await;
    machine.install_snapshot(&meta, bytes).await.unwrap();
    assert_eq!(all(&mut store).await, h);
    assert_eq!(store.log().first_offset(), 0);
    assert_eq!(store.log().next_offset(), next);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_installed_as_the_power_failed_is_finished_at_open() {
    let h = entries(2, 1, 30);
    let (meta, data) = leader_snapshot(&h).await;
    let tmp = tempfile::tempdir().unwrap();
    let (mut store, machine) = open(tmp.path()).await.unwrap();
    append(&mut store, &entries(1, 1, 5)).await;
    drop((store, machine));
    // The install wrote the snapshot and the state, then the power failed.
    let raft = tmp.path().join(RAFT_DIR);
    let file = SnapshotFile {
        meta: meta.clone(),
        data: data.clone(),
    };
    super::files::write_json(&OsFs, &raft.join(SNAPSHOT), &file).unwrap();
    super::files::write_json(&OsFs, &raft.join(APPLIED), &data).unwrap();
    let (mut store, mut machine) = open(tmp.path()).await.unwrap();
    let last: Option<LogId> = Some(id(2, 30));
    assert_eq!(store.get_log_state().await.unwrap().last_log_id, last);
    assert!(all(&mut store).await.is_empty());
    assert_eq!(store.log().first_offset(), data.next_offset);
    assert_eq!(machine.applied_state().await.unwrap().0, last);
}

/// A single-node log is no clustered partition's: its frames have no log ids.
#[tokio::test(flavor = "multi_thread")]
async fn a_single_node_log_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let log = Log::open(tmp.path(), Arc::new(OsFs), LogConfig::default()).unwrap();
    log.append(br#"{"timestamp":1,"key":null,"content":"a message of a single node"}"#)
        .await
        .unwrap();
    log.close().await.unwrap();
    let err = open(tmp.path()).await.unwrap_err();
    assert!(err.to_string().contains("single-node"), "{err}");
}

/// An applied state past the log (never written so by the state machine, which waits for its
/// messages to be durable here) is not trusted: the log keeps every entry, and Raft applies them
/// again.
#[tokio::test(flavor = "multi_thread")]
async fn an_applied_state_past_the_log_never_empties_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut store, machine) = open(tmp.path()).await.unwrap();
    let h = entries(1, 1, 10);
    append(&mut store, &h).await;
    store.close().await.unwrap();
    drop((store, machine));
    let ahead = PartitionSnapshot {
        last_log_id: Some(id(1, 12)),
        next_offset: 11,
        ..PartitionSnapshot::default()
    };
    let raft = tmp.path().join(RAFT_DIR);
    super::files::write_json(&OsFs, &raft.join(APPLIED), &ahead).unwrap();
    let (mut store, mut machine) = open(tmp.path()).await.unwrap();
    assert_eq!(all(&mut store).await, h);
    assert_eq!(machine.applied_state().await.unwrap().0, None);
    assert_eq!(store.log().next_offset(), 0);
    apply(&mut machine, &h).await;
    assert_eq!(store.log().next_offset(), messages_before(11));
}

/// A log that starts later than the index after its purge point keeps its entries, open or
/// reopened (openraft's suite purges below such a log).
#[tokio::test(flavor = "multi_thread")]
async fn a_purge_below_a_log_that_starts_later_keeps_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut store, machine) = open(tmp.path()).await.unwrap();
    let h = entries(1, 5, 9);
    append(&mut store, &h).await;
    store.purge(id(1, 2)).await.unwrap();
    assert_eq!(all(&mut store).await, h);
    drop((store, machine));
    let (mut store, _machine) = open(tmp.path()).await.unwrap();
    assert_eq!(all(&mut store).await, h);
    let state = store.get_log_state().await.unwrap();
    assert_eq!(
        (state.last_purged_log_id, state.last_log_id),
        (Some(id(1, 2)), Some(id(1, 9)))
    );
    append(&mut store, &[msg(1, 10)]).await;
    assert_eq!(frame_offset(store.log(), 10), Some(4));
}
