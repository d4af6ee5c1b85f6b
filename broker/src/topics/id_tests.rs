//! The produce-id snapshot against real logs (docs/storage.md, "Produce-id snapshots"): boot
//! restores the window from it without reading a message, reads what came after it, and reads
//! the whole window again when the file cannot be trusted.

use std::path::Path;
use std::sync::Arc;

use mmmq_core::{StoredMessage, Topic, now_ms};

use super::dedup::{self, Claim};
use super::id_restore::Restored;
use super::id_snapshot::{self, Encoder, Rejected};
use super::open::open_topic;
use super::{TopicLog, id_save, incarnation};
use crate::storage::{LogConfig, OsFs, Vfs};

const WINDOW: u64 = 120_000;

fn vfs() -> Arc<dyn Vfs> {
    Arc::new(OsFs)
}

/// Opens (creating it first if needed) the topic `t` under `root` with `partitions`.
fn open(root: &Path, partitions: u32) -> (Arc<TopicLog>, Restored) {
    let dir = root.join("t");
    if !dir.exists() {
        incarnation::create(&OsFs, &dir).unwrap();
    }
    let (t, restored) = open_topic(
        Topic::new("t").unwrap(),
        dir,
        vfs(),
        LogConfig::default(),
        partitions,
        dedup::IdBudget::new(dedup::MAX_IDS),
    )
    .unwrap();
    (Arc::new(t), restored)
}

/// Produces a message to partition `p` as the broker does: an id is claimed, appended, then
/// stored. Returns its offset.
async fn produce(t: &TopicLog, p: u32, id: Option<&str>) -> u64 {
    let claim = id.map(|id| t.dedup.claim(id, now_ms(), WINDOW));
    let payload = StoredMessage {
        timestamp: now_ms(),
        key: None,
        content: serde_json::value::to_raw_value(&1).unwrap(),
        id: id.map(str::to_owned),
        origin: None,
        binary: Default::default(),
    }
    .to_payload();
    let offset = t.partition(p).unwrap().log.append(&payload).await.unwrap();
    if let Some(Claim::New(ticket)) = claim {
        t.dedup.stored(&ticket, p, offset);
    }
    offset
}

/// Closes `t`'s logs, as a clean stop does, and drops it.
async fn close(t: Arc<TopicLog>) {
    assert!(t.close().await);
}

async fn save(t: &Arc<TopicLog>) -> bool {
    id_save::save(vfs(), t, WINDOW, now_ms()).await.unwrap()
}

/// Whether a snapshot was used, ids loaded from it, messages read.
fn counts(r: &Restored) -> (bool, u64, u64) {
    (r.from_snapshot, r.loaded, r.scanned)
}

/// Every id of `ids` is a duplicate at the position it was first stored at.
fn assert_remembered(t: &TopicLog, ids: &[(&str, u32, u64)]) {
    for &(id, p, offset) in ids {
        match t.dedup.claim(id, now_ms(), WINDOW) {
            Claim::Stored(sp, so) => assert_eq!((sp, so), (p, offset), "{id}"),
            other => panic!("{id} was forgotten: {other:?}"),
        }
    }
}

#[tokio::test]
async fn after_a_clean_stop_the_ids_come_back_without_reading_a_message() {
    let tmp = tempfile::tempdir().unwrap();
    let (t, first) = open(tmp.path(), 2);
    assert_eq!((first.from_snapshot, first.scanned), (false, 0));
    let mut ids = Vec::new();
    for (n, id) in ["a", "b", "c", "d", "e"].into_iter().enumerate() {
        let p = n as u32 % 2;
        ids.push((id, p, produce(&t, p, Some(id)).await));
        produce(&t, p, None).await;
    }
    let seed = t.dedup.seed();
    close(t.clone()).await;
    assert!(save(&t).await);
    drop(t);
    let (t, restored) = open(tmp.path(), 2);
    assert_eq!(counts(&restored), (true, 5, 0));
    assert_eq!(
        t.dedup.seed(),
        seed,
        "the keys are hashes under the saved seed"
    );
    assert_remembered(&t, &ids);
    assert!(
        !save(&t).await,
        "current: an idle topic is not written again"
    );
}

#[tokio::test]
async fn ids_stored_after_the_snapshot_are_read_from_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let (t, _) = open(tmp.path(), 2);
    let mut ids = vec![("a", 0, produce(&t, 0, Some("a")).await)];
    ids.push(("b", 1, produce(&t, 1, Some("b")).await));
    assert!(save(&t).await);
    // After the snapshot, then a crash (nothing closed, nothing saved).
    ids.push(("c", 1, produce(&t, 1, Some("c")).await));
    produce(&t, 0, None).await;
    ids.push(("d", 0, produce(&t, 0, Some("d")).await));
    drop(t);
    let (t, restored) = open(tmp.path(), 2);
    assert_eq!(
        counts(&restored),
        (true, 2, 3),
        "only the three messages after the snapshot are read"
    );
    assert_remembered(&t, &ids);
}

/// A file that cannot be trusted is passed over and the whole window is read from the logs:
/// torn or damaged, of another incarnation of the topic, or read past where a log now ends.
#[tokio::test]
async fn a_snapshot_that_cannot_be_trusted_is_passed_over_for_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let (t, _) = open(tmp.path(), 1);
    let ids = [
        ("a", 0, produce(&t, 0, Some("a")).await),
        ("b", 0, produce(&t, 0, Some("b")).await),
    ];
    produce(&t, 0, None).await;
    close(t.clone()).await;
    assert!(save(&t).await);
    let (id, seed) = (t.id, t.dedup.seed());
    drop(t);
    let file = tmp.path().join("t").join(id_snapshot::FILE);
    let good = std::fs::read(&file).unwrap();
    let mut flipped = good.clone();
    flipped[70] ^= 1;
    let past_end = Encoder::new(id, seed, vec![4]).finish().bytes;
    for (what, bytes, why) in [
        (
            "truncated",
            good[..good.len() - 5].to_vec(),
            "bytes, not the",
        ),
        ("a flipped bit", flipped, "CRC32C"),
        ("read past the log's end", past_end, "past its log's end"),
    ] {
        assert!(
            id_snapshot::decode(bytes.clone(), id, &[3])
                .unwrap_err()
                .to_string()
                .contains(why),
            "{what}"
        );
        std::fs::write(&file, &bytes).unwrap();
        let (t, restored) = open(tmp.path(), 1);
        assert_eq!(counts(&restored), (false, 0, 3), "{what}");
        assert_remembered(&t, &ids);
        close(t).await;
    }
    // The topic deleted and made again: a snapshot of the old incarnation left in its place
    // (the delete takes the file with the directory; here it is put back by hand) is not used.
    std::fs::remove_dir_all(tmp.path().join("t")).unwrap();
    let (t, _) = open(tmp.path(), 1);
    produce(&t, 0, None).await;
    close(t).await;
    std::fs::write(&file, &good).unwrap();
    let (t, restored) = open(tmp.path(), 1);
    assert!(!restored.from_snapshot);
    assert_eq!(
        id_snapshot::decode(good, t.id, &[3]).unwrap_err(),
        Rejected::Incarnation(id)
    );
    assert!(
        matches!(t.dedup.claim("a", now_ms(), WINDOW), Claim::New(_)),
        "an id of the old incarnation"
    );
}

/// A claim whose append has committed but not yet said where (`stored` comes after the commit)
/// when the table is read is in the snapshot once it says; a withdrawn one is not.
#[tokio::test]
async fn a_claim_pending_at_the_snapshot_is_in_it_once_it_resolves() {
    let tmp = tempfile::tempdir().unwrap();
    let (t, _) = open(tmp.path(), 1);
    let Claim::New(late) = t.dedup.claim("late", now_ms(), WINDOW) else {
        panic!()
    };
    let Claim::New(failing) = t.dedup.claim("failing", now_ms(), WINDOW) else {
        panic!()
    };
    let offset = produce(&t, 0, None).await;
    let (encoder, pending) = id_save::dump(&t, 0);
    assert_eq!(pending.len(), 2);
    let resolving = tokio::spawn({
        let t = t.clone();
        async move { id_save::resolve(&t, encoder, pending).await }
    });
    tokio::task::yield_now().await;
    assert!(!resolving.is_finished(), "it waits for the pending claims");
    t.dedup.stored(&late, 0, offset);
    t.dedup.withdraw(&failing);
    let written = resolving.await.unwrap().unwrap();
    let snapshot = id_snapshot::decode(written.bytes.clone(), t.id, &[1]).unwrap();
    assert_eq!(
        snapshot.len(),
        1,
        "the resolved claim, not the withdrawn one"
    );
    close(t.clone()).await;
    id_snapshot::write(&OsFs, &t.dir, &written.bytes).unwrap();
    drop(t);
    let (t, restored) = open(tmp.path(), 1);
    assert_eq!((restored.loaded, restored.scanned), (1, 0));
    assert_remembered(&t, &[("late", 0, offset)]);
    assert!(matches!(
        t.dedup.claim("failing", now_ms(), WINDOW),
        Claim::New(_)
    ));
}

/// Entries whose window ended before the boot are left out; a delete stops snapshots of the
/// topic (a late one would leave a file in the directory being removed).
#[tokio::test]
async fn expired_entries_are_dropped_and_a_retired_topic_is_not_written() {
    let tmp = tempfile::tempdir().unwrap();
    let (t, _) = open(tmp.path(), 1);
    let fresh = produce(&t, 0, Some("fresh")).await;
    let old = now_ms() - 2 * WINDOW;
    let Claim::New(ticket) = t.dedup.claim("old", old, u64::MAX) else {
        panic!()
    };
    t.dedup.stored(&ticket, 0, produce(&t, 0, None).await);
    let written = id_save::take(&t, u64::MAX, now_ms()).await.unwrap();
    id_snapshot::write(&OsFs, &t.dir, &written.bytes).unwrap();
    let snapshot = id_snapshot::decode(written.bytes, t.id, &[2]).unwrap();
    assert_eq!(snapshot.len(), 2, "both inside a window without end");
    close(t.clone()).await;
    drop(t);
    let (t, restored) = open(tmp.path(), 1);
    assert_eq!((restored.loaded, restored.scanned), (1, 0));
    assert_remembered(&t, &[("fresh", 0, fresh)]);
    produce(&t, 0, None).await;
    t.retire();
    assert!(!save(&t).await);
    let on_disk = std::fs::read(t.dir.join(id_snapshot::FILE)).unwrap();
    assert_eq!(
        id_snapshot::decode(on_disk, t.id, &[3]).unwrap().scanned_to,
        [2],
        "the file of before the retire"
    );
}

/// An id found twice at boot (stored again after the budget forgot it early) is remembered at
/// its later position and still expires with its window, instead of staying forever.
#[test]
fn an_id_remembered_twice_still_expires() {
    let budget = dedup::IdBudget::new(dedup::MAX_IDS);
    let d = dedup::Dedup::new(budget.clone());
    d.remember("x", 1_000, 0, 1);
    d.remember("x", 2_000, 1, 7);
    assert!(matches!(d.claim("x", 2_001, 10_000), Claim::Stored(1, 7)));
    d.expire(2_000 + 10_001, 10_000);
    assert_eq!(budget.used(), 0);
}
