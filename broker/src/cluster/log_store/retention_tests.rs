//! Retention's purge on the store and the partition's state machine (docs/cluster.md,
//! "Retention in a cluster"): the snapshot is taken at a segment boundary, the purge removes
//! exactly the whole segments before it, and the store, the state machine and the files agree
//! after a reopen; a follower that installs the snapshot continues at that boundary.

use std::collections::BTreeSet;

use openraft::entry::RaftEntry;
use openraft::storage::{RaftLogStorage, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{Membership, StoredMembership};

use tempfile::TempDir;

use super::SegmentLogStore;
use super::layout::Entry;
use super::tests::{all, append, apply, id, msg, open, payload};
use crate::cluster::machine::{PartitionMachine, PartitionSnapshot, RetentionTarget};

fn members(term: u64, index: u64, voters: &[u64]) -> Entry {
    let voters: BTreeSet<u64> = voters.iter().copied().collect();
    RaftEntry::new_membership(
        id(term, index),
        Membership::new_with_defaults(vec![voters], []),
    )
}

/// Indexes 0..=n of term 1: the first membership {1,2,3} at 0, {1,2,4} at 30, {1,2,5} at 55,
/// a blank every ninth index, messages elsewhere.
fn history(n: u64) -> Vec<Entry> {
    (0..=n)
        .map(|i| match i {
            0 => members(1, 0, &[1, 2, 3]),
            30 => members(1, 30, &[1, 2, 4]),
            55 => members(1, 55, &[1, 2, 5]),
            i if i % 9 == 0 => RaftEntry::new_blank(id(1, i)),
            i => msg(1, i),
        })
        .collect()
}

/// The message entries of `h` in offset order, by index.
fn message_indexes(h: &[Entry]) -> Vec<u64> {
    h.iter()
        .filter(|e| matches!(e.payload, openraft::EntryPayload::Normal(_)))
        .map(|e| e.log_id.index)
        .collect()
}

/// A store and machine in a new directory, `history(70)` appended and its first `applied`
/// entries applied.
async fn opened(applied: usize) -> (TempDir, SegmentLogStore, PartitionMachine, Vec<Entry>) {
    let tmp = tempfile::tempdir().unwrap();
    let (mut store, mut machine) = open(tmp.path()).await.unwrap();
    let h = history(70);
    append(&mut store, &h).await;
    apply(&mut machine, &h[..applied]).await;
    (tmp, store, machine, h)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retention_purge_takes_whole_segments_at_a_snapshot_of_their_end() {
    // Only what was applied can go: entries up to 40.
    let (tmp, mut store, mut machine, h) = opened(41).await;
    let offsets = message_indexes(&h);
    let applied_end = offsets.iter().filter(|&&i| i <= 40).count() as u64;
    let starts: Vec<u64> = store.log().segments().iter().map(|s| s.start).collect();
    assert!(starts.len() > 4, "small segments: {starts:?}");
    let t = machine
        .retention_target(u64::MAX)
        .await
        .unwrap()
        .expect("something to delete");
    let boundary = *starts.iter().filter(|&&s| s <= applied_end).max().unwrap();
    assert_eq!(t.first_offset, boundary, "the last boundary applied");
    let last_index = offsets[(boundary - 1) as usize];
    assert_eq!(
        t,
        RetentionTarget {
            last: id(1, last_index),
            first_offset: boundary
        }
    );
    assert!(last_index > 30, "past the second membership: {last_index}");
    // The snapshot is taken there, with the membership in effect there (not the one applied
    // later at 55, once applied).
    apply(&mut machine, &h[41..]).await;
    let t = machine.retention_target(boundary).await.unwrap().unwrap();
    assert_eq!(t.first_offset, boundary);
    let snap = machine
        .try_create_snapshot_builder(false)
        .await
        .expect("the snapshot retention asked for")
        .build_snapshot()
        .await
        .unwrap();
    assert_eq!(snap.meta.last_log_id, Some(t.last));
    let at_30 = StoredMembership::new(
        Some(id(1, 30)),
        Membership::new_with_defaults(vec![[1, 2, 4].into()], []),
    );
    assert_eq!(snap.meta.last_membership, at_30);
    let data: PartitionSnapshot = serde_json::from_slice(&snap.snapshot).unwrap();
    assert_eq!(data.next_offset, boundary);
    // Nothing else builds one on its own.
    assert!(machine.try_create_snapshot_builder(false).await.is_none());
    // The purge: exactly the segments before the boundary.
    let before = store.log().segments();
    store.purge(t.last).await.unwrap();
    let after = store.log().segments();
    assert_eq!(store.log().first_offset(), boundary);
    assert_eq!(
        after.len(),
        before.len() - before.iter().filter(|s| s.start < boundary).count()
    );
    let kept = h[(last_index + 1) as usize..].to_vec();
    assert_eq!(all(&mut store).await, kept);
    assert_eq!(
        store.log().read(boundary).unwrap().unwrap(),
        payload(&h[offsets[boundary as usize] as usize])
    );
    let sidecar = std::fs::read(tmp.path().join("raft/entries")).unwrap();
    let records = super::parse_sidecar(&sidecar).unwrap().entries;
    assert!(records.iter().all(|e| e.log_id.index > last_index));
    // Nothing more to delete up to the boundary.
    assert_eq!(machine.retention_target(boundary).await.unwrap(), None);
    // A crash: the store, the state machine and the files agree.
    let state = store.get_log_state().await.unwrap();
    let (applied, _) = machine.applied_state().await.unwrap();
    drop((store, machine));
    let (mut store, mut machine) = open(tmp.path()).await.unwrap();
    assert_eq!(store.get_log_state().await.unwrap(), state);
    assert_eq!(all(&mut store).await, kept);
    assert_eq!(store.log().first_offset(), boundary);
    let current = machine.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, snap.meta);
    // The applied state was last written before the snapshot's point, or after: either way
    // the machine applies the rest at the offsets the log holds.
    let (reopened, _) = machine.applied_state().await.unwrap();
    assert!(reopened >= Some(t.last) && reopened <= applied);
    let rest: Vec<Entry> = h
        .iter()
        .filter(|e| Some(e.log_id) > reopened)
        .cloned()
        .collect();
    apply(&mut machine, &rest).await;
    assert_eq!(store.log().next_offset(), offsets.len() as u64);

    // A follower behind the purge installs the snapshot: its log starts at the boundary, and
    // the leader's entries after it take the same offsets there.
    let other = tempfile::tempdir().unwrap();
    let (mut follower, mut fm) = open(other.path()).await.unwrap();
    append(&mut follower, &h[..5]).await;
    fm.install_snapshot(&snap.meta, snap.snapshot.clone())
        .await
        .unwrap();
    assert_eq!(follower.log().first_offset(), boundary);
    append(&mut follower, &kept).await;
    apply(&mut fm, &kept).await;
    let read = |log: &crate::storage::Log| {
        log.read_from(boundary, usize::MAX, usize::MAX)
            .unwrap()
            .into_iter()
            .map(|e| e.payload.unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(read(follower.log()), read(store.log()));
    assert_eq!(
        fm.applied_state().await.unwrap(),
        machine.applied_state().await.unwrap()
    );
}

/// A build that runs beside an install never replaces the newer snapshot the install wrote.
#[tokio::test(flavor = "multi_thread")]
async fn a_retention_snapshot_never_replaces_a_newer_one() {
    let (tmp, store, mut machine, _) = opened(71).await;
    let t = machine.retention_target(12).await.unwrap().unwrap();
    let mut builder = machine.try_create_snapshot_builder(false).await.unwrap();
    // Meanwhile the leader's snapshot at the last entry is installed.
    let newer = machine
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    assert!(newer.meta.last_log_id > Some(t.last));
    let built = builder.build_snapshot().await.unwrap();
    assert_eq!(built.meta, newer.meta);
    drop((store, machine));
    let (_store, mut machine) = open(tmp.path()).await.unwrap();
    assert_eq!(
        machine.get_current_snapshot().await.unwrap().unwrap().meta,
        newer.meta
    );
}

/// A crash after the snapshot was taken and before the purge: the replica opens at the
/// snapshot's point or later with its whole log, and the next pass purges there, without
/// another snapshot.
#[tokio::test(flavor = "multi_thread")]
async fn a_crash_between_the_snapshot_and_the_purge_leaves_the_next_pass_to_purge() {
    let (tmp, store, mut machine, h) = opened(71).await;
    let t = machine.retention_target(25).await.unwrap().unwrap();
    let snap = machine
        .try_create_snapshot_builder(false)
        .await
        .unwrap()
        .build_snapshot()
        .await
        .unwrap();
    drop((store, machine));
    let (mut store, mut machine) = open(tmp.path()).await.unwrap();
    assert_eq!(all(&mut store).await, h, "nothing purged");
    assert_eq!(store.log().first_offset(), 0);
    let (applied, _) = machine.applied_state().await.unwrap();
    assert!(applied >= Some(t.last), "{applied:?}");
    assert_eq!(
        machine.get_current_snapshot().await.unwrap().unwrap().meta,
        snap.meta
    );
    assert_eq!(machine.retention_target(25).await.unwrap(), Some(t));
    assert!(
        machine.try_create_snapshot_builder(false).await.is_none(),
        "the snapshot covers it already"
    );
    store.purge(t.last).await.unwrap();
    assert_eq!(store.log().first_offset(), t.first_offset);
    assert_eq!(all(&mut store).await, h[(t.last.index + 1) as usize..]);
}
