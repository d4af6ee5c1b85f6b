//! A clustered partition's log (docs/cluster.md, "Clustered partitions on disk"): frames that
//! carry log ids, the visible end apart from the durable one, cutting back and starting over —
//! also with the power cut at every step of those.

use std::path::Path;
use std::sync::Arc;

use super::super::vfs::sim::{CutMode, SimFs};
use super::*;

fn clustered(segment_max_bytes: u64) -> LogConfig {
    LogConfig {
        segment_max_bytes,
        raft_header: true,
        ..LogConfig::default()
    }
}

fn open_clustered(dir: &Path, segment_max_bytes: u64) -> Log {
    Log::open(dir, Arc::new(OsFs), clustered(segment_max_bytes)).unwrap()
}

/// Entry `i` of the tests: term 1 + i / 10, raft index 100 + 2i (the odd indexes would be entries
/// that carry no message).
fn entry(i: u64) -> (u64, u64, Vec<u8>) {
    (1 + i / 10, 100 + 2 * i, payload(i))
}

async fn append_n(log: &Log, from: u64, n: u64) {
    let entries: Vec<_> = (from..from + n).map(entry).collect();
    let first = log.append_raft(&entries).unwrap().await.unwrap();
    assert_eq!(first, from);
}

/// The payloads of the durable entries, with their log ids.
fn raw(log: &Log) -> Vec<(u64, u64, Vec<u8>)> {
    log.read_raft_from(log.first_offset(), usize::MAX, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|f| {
            let ((term, index), p) = f.entry.unwrap();
            (term, index, p.to_vec())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clustered_frame_holds_the_log_id_before_the_message_under_one_crc() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open_clustered(tmp.path(), 1 << 20);
    let c = log
        .append_raft(&[(3, 7, &b"{\"a\":1}"[..]), (3, 8, &b"[]"[..])])
        .unwrap();
    assert_eq!(c.await.unwrap(), 0);
    close(log).await;
    let files = seg0(tmp.path());
    let mut expected = Vec::new();
    frame::encode_with_log_id_into(3, 7, b"{\"a\":1}", &mut expected);
    let second = expected.len() as u64;
    frame::encode_with_log_id_into(3, 8, b"[]", &mut expected);
    assert_eq!(std::fs::read(&files.data).unwrap(), expected);
    assert_eq!(
        std::fs::read(&files.index).unwrap(),
        [0u64.to_be_bytes(), second.to_be_bytes()].concat()
    );
    // The single-node API is refused, and a single-node log refuses log ids.
    let log = open_clustered(tmp.path(), 1 << 20);
    assert!(matches!(
        log.append(b"{}").await,
        Err(StorageError::Refused { .. })
    ));
    let single = open(&tmp.path().join("single"), 1 << 20).unwrap();
    assert!(single.append_raft(&[(1, 1, b"{}")]).is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn readers_see_only_what_was_applied_and_without_the_log_id() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open_clustered(tmp.path(), 300);
    append_n(&log, 0, 20).await;
    assert_eq!(log.durable_end(), 20);
    assert_eq!(log.next_offset(), 0, "nothing applied yet");
    assert_eq!(log.stats().next_offset, 0);
    assert!(log.read_from(0, 10, usize::MAX).unwrap().is_empty());
    assert_eq!(log.read(0).unwrap(), None);
    // The store reads everything durable, log ids included.
    let all = raw(&log);
    assert_eq!(all.len(), 20);
    for (i, got) in all.iter().enumerate() {
        assert_eq!(got, &entry(i as u64));
    }
    let mut sub = log.subscribe();
    log.advance_visible(5);
    assert_eq!(*sub.borrow_and_update(), 5);
    let read = read_all(&log);
    assert_eq!(read, (0..5).map(payload).collect::<Vec<_>>());
    // Never back; and not past what is durable here (a leader applies what others hold).
    log.advance_visible(3);
    assert_eq!(log.next_offset(), 5);
    log.advance_visible(25);
    assert_eq!(log.next_offset(), 20);
    append_n(&log, 20, 3).await;
    assert_eq!(log.next_offset(), 23, "the applied end shows once durable");
    append_n(&log, 23, 4).await;
    assert_eq!(log.next_offset(), 25);
    assert_eq!(read_all(&log), (0..25).map(payload).collect::<Vec<_>>());
    // A reopened clustered log shows nothing until its state machine says so.
    close(log).await;
    let log = open_clustered(tmp.path(), 300);
    assert_eq!((log.next_offset(), log.durable_end()), (0, 27));
    assert_eq!(raw(&log).len(), 27);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cut_removes_the_tail_across_segments_and_appends_go_on_at_its_offsets() {
    let tmp = tempfile::tempdir().unwrap();
    // About five entries a segment.
    let log = open_clustered(tmp.path(), 300);
    append_n(&log, 0, 30).await;
    let segments = log.segments().len();
    assert!(segments >= 5, "{segments} segments");
    log.advance_visible(3);
    let err = log.truncate(2).await.unwrap_err();
    assert!(err.to_string().contains("applied"), "{err}");
    assert!(log.truncate(31).await.is_err(), "past the end");
    log.truncate(30).await.unwrap();
    assert_eq!(log.durable_end(), 30);
    // In the middle of a sealed segment, then at a segment's first entry.
    let mid = log.segments()[2].start + 1;
    log.truncate(mid).await.unwrap();
    assert_eq!(log.durable_end(), mid);
    assert_eq!(raw(&log), (0..mid).map(entry).collect::<Vec<_>>());
    let boundary = log.segments()[1].start;
    assert!(boundary > 3);
    log.truncate(boundary).await.unwrap();
    assert_eq!(
        log.segments().len(),
        2,
        "an empty tail after the sealed one"
    );
    assert_eq!(raw(&log).len() as u64, boundary);
    // New entries take the cut offsets.
    let fresh: Vec<_> = (0..6)
        .map(|i| (9, 500 + i, format!("new {i}").into_bytes()))
        .collect();
    assert_eq!(log.append_raft(&fresh).unwrap().await.unwrap(), boundary);
    let expect: Vec<_> = (0..boundary)
        .map(entry)
        .chain(fresh.iter().cloned())
        .collect();
    assert_eq!(raw(&log), expect);
    log.advance_visible(boundary + 6);
    assert_eq!(log.read(boundary).unwrap().unwrap(), b"new 0");
    // Crash (no close) and reopen: the same log.
    drop(log);
    let log = open_clustered(tmp.path(), 300);
    assert_eq!(raw(&log), expect);
    close(log).await;
    let log = open_clustered(tmp.path(), 300);
    assert_eq!(raw(&log), expect);
    // Down to nothing (what a reopened log shows: nothing yet).
    assert_eq!(log.next_offset(), 0);
    log.truncate(0).await.unwrap();
    assert!(raw(&log).is_empty());
    assert_eq!(log.segments().len(), 1);
    append_n(&log, 0, 3).await;
    assert_eq!(raw(&log), (0..3).map(entry).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reset_starts_over_empty_at_the_offset_given() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open_clustered(tmp.path(), 300);
    append_n(&log, 0, 12).await;
    log.advance_visible(4);
    log.reset(1000).await.unwrap();
    assert_eq!((log.first_offset(), log.durable_end()), (1000, 1000));
    assert_eq!(log.next_offset(), 1000);
    assert_eq!(log.segments().len(), 1);
    let first = log
        .append_raft(&[(5, 77, b"after".to_vec())])
        .unwrap()
        .await
        .unwrap();
    assert_eq!(first, 1000);
    drop(log);
    let log = open_clustered(tmp.path(), 300);
    assert_eq!(log.first_offset(), 1000);
    assert_eq!(raw(&log), vec![(5, 77, b"after".to_vec())]);
}

/// The power fails at every file operation of a cut (and of a reset): the log opens, and holds a
/// prefix of what it held, never less than what the cut keeps (a reset: anything from nothing to
/// all of it, or the fresh start). Once the call returned, its outcome is durable.
#[tokio::test(flavor = "multi_thread")]
async fn a_power_cut_at_any_step_of_a_cut_or_reset_leaves_a_prefix_that_opens() {
    for reset in [false, true] {
        let mut ops = 0;
        loop {
            let mut finished = false;
            for mode in [CutMode::SyncedOnly, CutMode::Prefix, CutMode::TornSectors] {
                finished = cut_with_power_failing_after(reset, ops, mode).await;
            }
            if finished {
                break;
            }
            ops += 1;
            assert!(ops < 500, "the cut never finished");
        }
        assert!(ops > 5, "the cut is several steps: {ops}");
    }
}

/// One run of the test above; whether the cut (or reset) returned.
async fn cut_with_power_failing_after(reset: bool, ops: u64, mode: CutMode) -> bool {
    let root = Path::new("/sim");
    let before: Vec<_> = (0..30).map(entry).collect();
    let fs = SimFs::new();
    fs.mkdir_durable(root);
    let vfs: Arc<dyn Vfs> = Arc::new(fs.clone());
    let dir = root.join("p");
    let log = Log::open(&dir, vfs.clone(), clustered(300)).unwrap();
    append_n(&log, 0, 30).await;
    let mid = log.segments()[2].start + 2;
    fs.die_after(ops);
    let done = if reset {
        log.reset(40).await
    } else {
        log.truncate(mid).await
    };
    drop(log);
    fs.power_cut(ops * 7 + 1, mode);
    let log = Log::open(&dir, vfs, clustered(300))
        .unwrap_or_else(|e| panic!("opens after a cut at op {ops} ({mode:?}): {e}"));
    let got = raw(&log);
    let what = format!("reset {reset}, power failing after {ops} ops, {mode:?}");
    if reset && log.first_offset() == 40 {
        assert!(got.is_empty(), "the fresh start is empty ({what})");
    } else {
        assert_eq!(log.first_offset(), 0, "{what}");
        assert_eq!(got[..], before[..got.len()], "a prefix ({what})");
        if !reset {
            assert!(got.len() as u64 >= mid, "the cut keeps {mid} ({what})");
        }
    }
    if done.is_ok() {
        if reset {
            assert_eq!((log.first_offset(), got.len()), (40, 0), "{what}");
        } else {
            assert_eq!(got.len() as u64, mid, "{what}");
        }
    }
    done.is_ok()
}
