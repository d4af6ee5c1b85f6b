//! The store with what openraft's suite cannot build: message entries, interleaved with blanks
//! and memberships (docs/cluster.md, "Clustered partitions on disk").

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogStorage, RaftStateMachine};
use openraft::type_config::TypeConfigExt;
use openraft::{Membership, RaftLogReader};

use super::layout::Entry;
pub(super) use super::log_id as id;
use super::{SegmentLogStore, StoreError};
use crate::cluster::machine::PartitionMachine;
use crate::cluster::types::{Command, GroupKind, Raft};
use crate::storage::{LogConfig, OsFs};

pub(super) fn msg(term: u64, index: u64) -> Entry {
    let text = format!(
        r#"{{"m":{index},"pad":"{}"}}"#,
        "x".repeat((index % 23) as usize)
    );
    Entry::new_normal(id(term, index), Command::Message(Bytes::from(text)))
}

fn blank(term: u64, index: u64) -> Entry {
    Entry::new_blank(id(term, index))
}

fn membership(term: u64, index: u64) -> Entry {
    let voters: BTreeSet<u64> = [1, 2, 3].into();
    Entry::new_membership(
        id(term, index),
        Membership::new_with_defaults(vec![voters], []),
    )
}

pub(super) fn payload(e: &Entry) -> Vec<u8> {
    match &e.payload {
        openraft::EntryPayload::Normal(c) => c.payload().to_vec(),
        _ => panic!("{e} is no message"),
    }
}

pub(super) async fn open(dir: &Path) -> Result<(SegmentLogStore, PartitionMachine), StoreError> {
    let config = LogConfig {
        segment_max_bytes: 400,
        ..LogConfig::default()
    };
    let store = SegmentLogStore::open(dir, Arc::new(OsFs), config, GroupKind::Partition).await?;
    let machine = PartitionMachine::open(&store).await?;
    Ok((store, machine))
}

/// Appends and waits until openraft would hear that they are durable.
pub(super) async fn append(store: &mut SegmentLogStore, entries: &[Entry]) {
    let (tx, rx) = Raft::oneshot();
    store
        .append(entries.to_vec(), IOFlushed::signal(tx))
        .await
        .unwrap();
    rx.await.unwrap().unwrap();
}

pub(super) async fn apply(machine: &mut PartitionMachine, entries: &[Entry]) {
    let items: Vec<_> = entries.iter().map(|e| Ok((e.clone(), None))).collect();
    machine
        .apply(futures_util::stream::iter(items))
        .await
        .unwrap();
}

pub(super) async fn all(store: &mut SegmentLogStore) -> Vec<Entry> {
    store.try_get_log_entries(0..).await.unwrap()
}

/// The messages readers of the partition see, in offset order.
fn visible(store: &SegmentLogStore) -> Vec<Vec<u8>> {
    let log = store.log();
    log.read_from(log.first_offset(), usize::MAX, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|e| e.payload.unwrap())
        .collect()
}

fn history() -> Vec<Entry> {
    vec![
        blank(1, 1),
        msg(1, 2),
        msg(1, 3),
        membership(1, 4),
        msg(1, 5),
        blank(2, 6),
        msg(2, 7),
        msg(2, 8),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn messages_are_frames_at_dense_offsets_and_other_entries_sidecar_records() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut store, _machine) = open(tmp.path()).await.unwrap();
    let h = history();
    append(&mut store, &h[..5]).await;
    append(&mut store, &h[5..]).await;
    assert_eq!(all(&mut store).await, h);
    assert_eq!(store.try_get_log_entries(3..6).await.unwrap(), h[2..5]);
    assert_eq!(store.limited_get_log_entries(2, 9).await.unwrap(), h[1..]);
    assert_eq!(
        store.get_log_state().await.unwrap().last_log_id,
        Some(id(2, 8))
    );
    // Five messages at offsets 0–4, each with its log id; three records in the sidecar.
    let log = store.log().clone();
    assert_eq!(log.durable_end(), 5);
    let frames: Vec<_> = log
        .read_raft_from(0, usize::MAX, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|f| (f.offset, f.entry.unwrap().0))
        .collect();
    assert_eq!(
        frames,
        [
            (0, (1, 2)),
            (1, (1, 3)),
            (2, (1, 5)),
            (3, (2, 7)),
            (4, (2, 8))
        ]
    );
    let raw = std::fs::read(tmp.path().join("raft/entries")).unwrap();
    let sidecar = super::parse_sidecar(&raw).unwrap();
    let indexes: Vec<u64> = sidecar.entries.iter().map(|e| e.log_id.index).collect();
    assert_eq!(indexes, [1, 4, 6]);
    // An entry that does not follow is refused, and nothing changes.
    let (tx, _rx) = Raft::oneshot();
    assert!(
        store
            .append(vec![msg(2, 10)], IOFlushed::signal(tx))
            .await
            .is_err()
    );
    assert_eq!(all(&mut store).await, h);
}

#[tokio::test(flavor = "multi_thread")]
async fn readers_see_a_message_only_once_it_is_applied() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut store, mut machine) = open(tmp.path()).await.unwrap();
    let h = history();
    append(&mut store, &h).await;
    assert_eq!(store.log().next_offset(), 0);
    assert!(visible(&store).is_empty());
    let mut sub = store.log().subscribe();
    apply(&mut machine, &h[..3]).await;
    assert_eq!(*sub.borrow_and_update(), 2);
    assert_eq!(visible(&store), [payload(&h[1]), payload(&h[2])]);
    assert_eq!(machine.next_offset(), 2);
    apply(&mut machine, &h[3..]).await;
    assert_eq!(store.log().next_offset(), 5);
    assert_eq!(
        machine.applied_state().await.unwrap(),
        (
            Some(id(2, 8)),
            openraft::StoredMembership::new(
                Some(id(1, 4)),
                Membership::new_with_defaults(vec![[1, 2, 3].into()], [])
            )
        )
    );
    // A message the log does not hold at that offset is refused.
    let stray = vec![Ok((msg(2, 9), None))];
    assert!(
        machine
            .apply(futures_util::stream::iter(stray))
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cut_gives_its_offsets_to_the_new_leaders_messages() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut store, mut machine) = open(tmp.path()).await.unwrap();
    let h = history();
    append(&mut store, &h).await;
    apply(&mut machine, &h[..2]).await;
    store.truncate_after(Some(id(1, 5))).await.unwrap();
    assert_eq!(all(&mut store).await, h[..5]);
    assert_eq!(store.log().durable_end(), 3);
    let new = vec![msg(3, 6), blank(3, 7), msg(3, 8), msg(3, 9)];
    append(&mut store, &new).await;
    let expect: Vec<Entry> = h[..5].iter().chain(&new).cloned().collect();
    assert_eq!(all(&mut store).await, expect);
    apply(&mut machine, &expect[2..]).await;
    let read: Vec<Vec<u8>> = expect
        .iter()
        .filter(|e| matches!(e.payload, openraft::EntryPayload::Normal(_)))
        .map(payload)
        .collect();
    assert_eq!(visible(&store), read);
    assert_eq!(store.log().read(3).unwrap().unwrap(), payload(&new[0]));
    // Reopened after a crash (no close): the same log.
    drop((store, machine));
    let (mut store, mut machine) = open(tmp.path()).await.unwrap();
    assert_eq!(all(&mut store).await, expect);
    // Its state machine had written nothing yet: applying again shows the same messages.
    assert!(visible(&store).is_empty());
    apply(&mut machine, &expect).await;
    assert_eq!(visible(&store), read);
    // Below what was applied: refused, and nothing changes.
    let err = store.truncate_after(Some(id(1, 3))).await.unwrap_err();
    assert!(err.to_string().contains("applied"), "{err}");
    assert_eq!(all(&mut store).await, expect);
    append(&mut store, &[msg(3, 10)]).await;
}
