//! Storage tests at the byte level: recovery of every damaged shape the README's "Storage" names, rotation,
//! concurrency, checkpoints and I/O faults.

use std::path::Path;
use std::sync::Arc;

use super::scan::{SegmentFiles, segment_file_name};
use super::vfs::fault::{FaultyFs, Op};
use super::*;

fn open(dir: &Path, segment_max_bytes: u64) -> Result<Log, StorageError> {
    Log::open(
        dir,
        Arc::new(OsFs),
        LogConfig {
            segment_max_bytes,
            ..LogConfig::default()
        },
    )
}

fn payload(i: u64) -> Vec<u8> {
    // Varied lengths so that positions are not a multiple of anything.
    format!(r#"{{"n":{i},"pad":"{}"}}"#, "x".repeat((i % 37) as usize)).into_bytes()
}

async fn fill(log: &Log, n: u64) {
    for i in 0..n {
        assert_eq!(log.append(&payload(i)).await.unwrap(), i);
    }
}

fn read_all(log: &Log) -> Vec<Vec<u8>> {
    log.read_from(0, usize::MAX, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|e| e.payload.unwrap())
        .collect()
}

fn seg0(dir: &Path) -> SegmentFiles {
    SegmentFiles::new(dir, 0)
}

fn len(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

fn truncate(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

fn append_bytes(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap()
        .write_all(bytes)
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn files_are_laid_out_as_the_readme_says() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 1 << 20).unwrap();
    assert_eq!(log.append(b"{\"a\":1}").await.unwrap(), 0);
    assert_eq!(log.append(b"[]").await.unwrap(), 1);
    let files = seg0(tmp.path());
    assert!(files.data.ends_with("0000000000000000000.mmm"));
    let data = std::fs::read(&files.data).unwrap();
    let mut expected = frame::encode(b"{\"a\":1}");
    expected.extend(frame::encode(b"[]"));
    assert_eq!(data, expected);
    let index = std::fs::read(&files.index).unwrap();
    assert_eq!(index, [0u64.to_be_bytes(), 15u64.to_be_bytes()].concat());
}

#[tokio::test(flavor = "multi_thread")]
async fn reopen_keeps_everything_and_continues_the_offsets() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 1 << 20).unwrap();
    fill(&log, 50).await;
    drop(log);
    let log = open(tmp.path(), 1 << 20).unwrap();
    assert_eq!(log.next_offset(), 50);
    assert_eq!(log.append(&payload(50)).await.unwrap(), 50);
    let all = read_all(&log);
    assert_eq!(all.len(), 51);
    for (i, p) in all.iter().enumerate() {
        assert_eq!(p, &payload(i as u64));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn recovery_empty_index_with_data_truncates_the_data() {
    let tmp = tempfile::tempdir().unwrap();
    drop(open(tmp.path(), 1 << 20).unwrap());
    let files = seg0(tmp.path());
    append_bytes(&files.data, &frame::encode(b"never committed"));
    let log = open(tmp.path(), 1 << 20).unwrap();
    assert_eq!(log.next_offset(), 0);
    assert_eq!(len(&files.data), 0);
    assert_eq!(log.append(b"1").await.unwrap(), 0);
    assert_eq!(read_all(&log), vec![b"1".to_vec()]);
}

#[tokio::test(flavor = "multi_thread")]
async fn recovery_cuts_data_past_the_last_indexed_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 1 << 20).unwrap();
    fill(&log, 5).await;
    drop(log);
    let files = seg0(tmp.path());
    let committed = len(&files.data);
    append_bytes(&files.data, &frame::encode(b"uncommitted"));
    append_bytes(&files.data, b"\x00\x00\x01");
    let log = open(tmp.path(), 1 << 20).unwrap();
    assert_eq!(len(&files.data), committed);
    assert_eq!(log.next_offset(), 5);
    assert_eq!(log.append(&payload(5)).await.unwrap(), 5);
    assert_eq!(read_all(&log).len(), 6);
}

#[tokio::test(flavor = "multi_thread")]
async fn recovery_refuses_an_index_that_points_past_the_data() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 1 << 20).unwrap();
    fill(&log, 3).await;
    drop(log);
    let files = seg0(tmp.path());
    // Cut the data inside the last committed entry: the index now points past it.
    truncate(&files.data, len(&files.data) - 1);
    let err = open(tmp.path(), 1 << 20).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, StorageError::Inconsistent { .. }), "{msg}");
    assert!(msg.contains("0000000000000000000.idx"), "{msg}");
    assert!(msg.contains("past the end of the data file"), "{msg}");
    // The files were not touched by the refused open.
    assert_eq!(len(&files.index), 24);
}

#[tokio::test(flavor = "multi_thread")]
async fn recovery_refuses_an_index_entry_beyond_the_data() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 1 << 20).unwrap();
    fill(&log, 2).await;
    drop(log);
    let files = seg0(tmp.path());
    append_bytes(&files.index, &10_000u64.to_be_bytes());
    let msg = open(tmp.path(), 1 << 20).unwrap_err().to_string();
    assert!(msg.contains("points to byte 10000"), "{msg}");
    assert!(msg.contains("0000000000000000000.idx"), "{msg}");
}

#[tokio::test(flavor = "multi_thread")]
async fn recovery_cuts_a_torn_index_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 1 << 20).unwrap();
    fill(&log, 4).await;
    drop(log);
    let files = seg0(tmp.path());
    append_bytes(&files.data, &frame::encode(b"half committed"));
    append_bytes(&files.index, &[0, 0, 0]);
    let log = open(tmp.path(), 1 << 20).unwrap();
    assert_eq!(log.next_offset(), 4);
    assert_eq!(len(&files.index), 32);
    assert_eq!(log.append(&payload(4)).await.unwrap(), 4);
    assert_eq!(read_all(&log).len(), 5);
}

/// A crash can stop the data write of the last entry at any byte: whichever byte it is, recovery
/// keeps every earlier entry and appends continue where they belong.
#[tokio::test(flavor = "multi_thread")]
async fn a_torn_tail_cut_at_every_byte_of_the_last_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let pristine = tmp.path().join("pristine");
    let log = open(&pristine, 1 << 20).unwrap();
    fill(&log, 3).await;
    drop(log);
    let files = seg0(&pristine);
    let committed = len(&files.data);
    let last = frame::encode(&payload(3));
    for cut in 0..=last.len() {
        let dir = tmp.path().join(format!("cut-{cut}"));
        std::fs::create_dir(&dir).unwrap();
        for f in [&files.data, &files.index] {
            std::fs::copy(f, dir.join(f.file_name().unwrap())).unwrap();
        }
        append_bytes(&seg0(&dir).data, &last[..cut]);
        let log = open(&dir, 1 << 20).unwrap();
        assert_eq!(log.next_offset(), 3, "cut {cut}");
        assert_eq!(len(&seg0(&dir).data), committed, "cut {cut}");
        assert_eq!(log.append(&payload(3)).await.unwrap(), 3);
        let all = read_all(&log);
        assert_eq!(all, (0..4).map(payload).collect::<Vec<_>>(), "cut {cut}");
    }
}

/// The other side: the index entry reached the disk but the data did not (impossible with the
/// write order, possible with a lying disk). Every cut inside the entry stops the open.
#[tokio::test(flavor = "multi_thread")]
async fn an_indexed_entry_cut_at_every_byte_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let pristine = tmp.path().join("pristine");
    let log = open(&pristine, 1 << 20).unwrap();
    fill(&log, 3).await;
    drop(log);
    let files = seg0(&pristine);
    let full = len(&files.data);
    let last_start = full - frame::encode(&payload(2)).len() as u64;
    for cut in last_start..full {
        let dir = tmp.path().join(format!("cut-{cut}"));
        std::fs::create_dir(&dir).unwrap();
        for f in [&files.data, &files.index] {
            std::fs::copy(f, dir.join(f.file_name().unwrap())).unwrap();
        }
        truncate(&seg0(&dir).data, cut);
        let err = open(&dir, 1 << 20).unwrap_err();
        assert!(
            matches!(err, StorageError::Inconsistent { .. }),
            "cut {cut}: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flipped_bit_isolates_one_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 1 << 20).unwrap();
    fill(&log, 5).await;
    drop(log);
    let files = seg0(tmp.path());
    let mut data = std::fs::read(&files.data).unwrap();
    let index = std::fs::read(&files.index).unwrap();
    let pos2 = u64::from_be_bytes(index[16..24].try_into().unwrap()) as usize;
    data[pos2 + frame::HEADER_LEN + 3] ^= 0x10;
    std::fs::write(&files.data, &data).unwrap();

    let log = open(tmp.path(), 1 << 20).unwrap();
    assert_eq!(log.next_offset(), 5);
    for i in [0, 1, 3, 4] {
        assert_eq!(log.read(i).unwrap().unwrap(), payload(i));
    }
    match log.read(2) {
        Err(StorageError::Corrupt(c)) => {
            assert_eq!(c.offset, 2);
            assert_eq!(c.position, pos2 as u64);
            assert!(matches!(c.fault, frame::FrameFault::CrcMismatch { .. }));
        }
        other => panic!("expected corruption, got {other:?}"),
    }
    let entries = log.read_from(0, 10, usize::MAX).unwrap();
    assert_eq!(entries.len(), 5);
    assert!(entries[2].payload.is_err());
    assert!(
        entries
            .iter()
            .enumerate()
            .all(|(i, e)| i == 2 || e.payload.is_ok())
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn rotation_across_segment_sizes() {
    // 1 byte forces a rotation on every append; the others every few entries or never.
    for max in [1u64, 10, 100, 1_000, 1 << 20] {
        let tmp = tempfile::tempdir().unwrap();
        let log = open(tmp.path(), max).unwrap();
        fill(&log, 60).await;
        let segs = log.stats().segments;
        if max <= 10 {
            assert_eq!(segs, 60, "max {max}");
        }
        let all = read_all(&log);
        assert_eq!(all, (0..60).map(payload).collect::<Vec<_>>(), "max {max}");
        // Reads that start in the middle of a segment and span several.
        let mid = log.read_from(17, 20, usize::MAX).unwrap();
        assert_eq!(mid.first().unwrap().offset, 17);
        assert_eq!(mid.len(), 20);
        drop(log);

        let mut names: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names.len(), segs * 2);
        for n in &names {
            let (stem, ext) = n.split_once('.').unwrap();
            assert_eq!(stem.len(), 19, "{n}");
            assert!(stem.bytes().all(|b| b.is_ascii_digit()), "{n}");
            assert!(ext == "mmm" || ext == "idx");
        }
        if max == 1 {
            assert_eq!(names[2], segment_file_name(1, "idx"));
            assert_eq!(names[names.len() - 1], "0000000000000000059.mmm");
        }

        let log = open(tmp.path(), max).unwrap();
        assert_eq!(log.next_offset(), 60);
        assert_eq!(log.stats().segments, segs);
        assert_eq!(log.append(&payload(60)).await.unwrap(), 60);
        assert_eq!(read_all(&log).len(), 61, "max {max}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_rotation_leaves_an_empty_segment_that_recovery_removes() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 1 << 20).unwrap();
    fill(&log, 3).await;
    drop(log);
    // A rotation created segment 5 for a batch whose entries 3 and 4 never got their index.
    let orphan = SegmentFiles::new(tmp.path(), 5);
    std::fs::write(&orphan.data, frame::encode(b"lost")).unwrap();
    std::fs::write(&orphan.index, b"").unwrap();
    let log = open(tmp.path(), 1 << 20).unwrap();
    assert!(!orphan.data.exists() && !orphan.index.exists());
    assert_eq!(log.next_offset(), 3);
    assert_eq!(log.append(b"3").await.unwrap(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gap_between_non_empty_segments_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 1).unwrap();
    fill(&log, 4).await;
    drop(log);
    let gone = SegmentFiles::new(tmp.path(), 1);
    std::fs::remove_file(&gone.data).unwrap();
    std::fs::remove_file(&gone.index).unwrap();
    let msg = open(tmp.path(), 1).unwrap_err().to_string();
    assert!(
        msg.contains("0000000000000000002.idx") && msg.contains("ends at offset 1"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_appends_get_consecutive_offsets_while_readers_read() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 256 * 1024).unwrap();
    const TASKS: u64 = 8;
    const EACH: u64 = 10_000;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut readers = Vec::new();
    for _ in 0..2 {
        let log = log.clone();
        let done = done.clone();
        readers.push(tokio::task::spawn_blocking(move || {
            // Everything visible must be complete and intact, at every moment.
            let mut seen = 0u64;
            while !done.load(std::sync::atomic::Ordering::Acquire) || seen < log.next_offset() {
                for e in log.read_from(seen, 500, usize::MAX).unwrap() {
                    assert_eq!(e.offset, seen);
                    let p = e.payload.unwrap();
                    let v: serde_json::Value = serde_json::from_slice(&p).unwrap();
                    assert!(v["task"].is_u64() && v["i"].is_u64());
                    seen += 1;
                }
            }
            seen
        }));
    }
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            let mut offsets = Vec::new();
            for i in 0..EACH {
                let p = format!(r#"{{"task":{t},"i":{i}}}"#);
                offsets.push((log.append(p.as_bytes()).await.unwrap(), i));
            }
            offsets
        }));
    }
    let mut all = Vec::new();
    for (t, task) in tasks.into_iter().enumerate() {
        for (offset, i) in task.await.unwrap() {
            all.push((offset, t as u64, i));
        }
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    for r in readers {
        assert_eq!(r.await.unwrap(), TASKS * EACH);
    }
    all.sort();
    for (k, (offset, t, i)) in all.iter().enumerate() {
        assert_eq!(*offset, k as u64, "no gaps, no duplicates");
        let p = log.read(*offset).unwrap().unwrap();
        assert_eq!(p, format!(r#"{{"task":{t},"i":{i}}}"#).into_bytes());
    }
    // Each task's own appends keep their order.
    for t in 0..TASKS {
        let mine: Vec<u64> = all.iter().filter(|a| a.1 == t).map(|a| a.2).collect();
        assert_eq!(mine, (0..EACH).collect::<Vec<_>>());
    }
    assert!(log.stats().segments > 1, "rotation happened under load");
}

#[tokio::test(flavor = "multi_thread")]
async fn batches_get_consecutive_offsets() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 64).unwrap();
    assert_eq!(log.append(b"a").await.unwrap(), 0);
    let batch: Vec<Vec<u8>> = (0..10).map(payload).collect();
    assert_eq!(log.append_batch(&batch).await.unwrap(), 1);
    assert_eq!(log.append(b"z").await.unwrap(), 11);
    assert_eq!(read_all(&log)[1..11], batch[..]);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_flush_mode_stores_and_recovers() {
    for flush in [
        FlushMode::GroupCommit,
        FlushMode::PerAppend,
        FlushMode::NoSync,
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let config = LogConfig {
            flush,
            segment_max_bytes: 500,
            ..LogConfig::default()
        };
        let log = Log::open(tmp.path(), Arc::new(OsFs), config.clone()).unwrap();
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let log = log.clone();
                tokio::spawn(async move {
                    for i in 0..50 {
                        log.append(&payload(i)).await.unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        drop(log);
        let log = Log::open(tmp.path(), Arc::new(OsFs), config).unwrap();
        assert_eq!(log.next_offset(), 200, "{flush:?}");
        assert_eq!(read_all(&log).len(), 200);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn waiting_for_an_offset_wakes_on_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 1 << 20).unwrap();
    let waiter = {
        let log = log.clone();
        tokio::spawn(async move {
            log.wait_for(1).await;
            log.read(1).unwrap().unwrap()
        })
    };
    log.append(b"0").await.unwrap();
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());
    log.append(b"1").await.unwrap();
    assert_eq!(waiter.await.unwrap(), b"1");
    assert_eq!(log.read(2).unwrap(), None, "nothing past the commit point");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_write_error_fails_the_append_and_the_log_recovers_in_place_once_the_disk_does() {
    for (op, file) in [
        (Op::Sync, ".mmm"),
        (Op::Sync, ".idx"),
        (Op::Write, ".mmm"),
        (Op::Write, ".idx"),
    ] {
        for errno in [libc::EIO, libc::ENOSPC] {
            let tmp = tempfile::tempdir().unwrap();
            let fs = FaultyFs::new();
            let vfs: Arc<dyn Vfs> = Arc::new(fs.clone());
            let config = LogConfig {
                segment_max_bytes: 200,
                retry_after: std::time::Duration::ZERO,
                ..LogConfig::default()
            };
            let log = Log::open(tmp.path(), vfs.clone(), config.clone()).unwrap();
            fill(&log, 3).await;
            fs.fail(op, file, errno);
            let err = log.append(b"lost").await.unwrap_err();
            assert!(matches!(err, StorageError::Poisoned { .. }), "{err}");
            let os = std::io::Error::from_raw_os_error(errno).to_string();
            assert!(err.to_string().contains(&os), "{err}");
            // Still failing: the attempt to recover in place fails too, and nothing changes.
            assert!(log.append(b"lost too").await.is_err());
            assert!(log.poisoned().is_some());
            assert_eq!(read_all(&log), (0..3).map(payload).collect::<Vec<_>>());
            assert_eq!(
                log.read(3).unwrap(),
                None,
                "nothing half-written is visible"
            );
            fs.clear();
            // The disk is healthy again: appends resume, without a reopen, at the commit point.
            for i in 3..20 {
                assert_eq!(
                    log.append(&payload(i)).await.unwrap(),
                    i,
                    "{op:?} {file} {errno}"
                );
            }
            assert_eq!(log.poisoned(), None);
            assert_eq!(read_all(&log), (0..20).map(payload).collect::<Vec<_>>());
            drop(log);
            let log = Log::open(tmp.path(), vfs, config).unwrap();
            assert_eq!(read_all(&log), (0..20).map(payload).collect::<Vec<_>>());
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_log_refuses_appends_until_its_retry_time() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = FaultyFs::new();
    let config = LogConfig {
        retry_after: std::time::Duration::from_secs(3600),
        ..LogConfig::default()
    };
    let log = Log::open(tmp.path(), Arc::new(fs.clone()), config).unwrap();
    fill(&log, 2).await;
    fs.fail(Op::Sync, ".idx", libc::EIO);
    assert!(log.append(b"lost").await.is_err());
    fs.clear();
    let err = log.append(b"refused").await.unwrap_err();
    assert!(matches!(err, StorageError::Poisoned { .. }), "{err}");
    assert_eq!(read_all(&log).len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn checkpoints_write_reopen_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("checkpoints");
    let id = mmmq_core::ConsumerId::new("audit").unwrap();
    let other = mmmq_core::ConsumerId::new("billing-v2").unwrap();
    let cps = Checkpoints::new(&dir, Arc::new(OsFs));
    assert_eq!(cps.read(&id).unwrap(), None);
    cps.write(&id, 17).unwrap();
    cps.write(&other, 3).unwrap();
    cps.write(&id, 18).unwrap();
    let raw = std::fs::read(dir.join("audit.checkpoint")).unwrap();
    assert_eq!(raw, 18u64.to_be_bytes());
    let cps = Checkpoints::new(&dir, Arc::new(OsFs));
    assert_eq!(cps.read(&id).unwrap(), Some(18));
    assert_eq!(cps.read(&other).unwrap(), Some(3));
    assert_eq!(
        cps.list().unwrap(),
        vec![("audit".to_owned(), 18), ("billing-v2".to_owned(), 3)]
    );
    // A torn temp file from a crash mid-update changes nothing.
    std::fs::write(dir.join("audit.checkpoint.tmp"), [1, 2, 3]).unwrap();
    assert_eq!(cps.read(&id).unwrap(), Some(18));
    cps.write(&id, 19).unwrap();
    assert_eq!(cps.read(&id).unwrap(), Some(19));
    // A damaged checkpoint is an error that names the file, not a silent 0.
    std::fs::write(dir.join("audit.checkpoint"), [0; 7]).unwrap();
    let msg = cps.read(&id).unwrap_err().to_string();
    assert!(
        msg.contains("audit.checkpoint") && msg.contains("7"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_checkpoint_write_keeps_the_old_value() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = FaultyFs::new();
    let cps = Checkpoints::new(tmp.path().join("checkpoints"), Arc::new(fs.clone()));
    let id = mmmq_core::ConsumerId::new("c").unwrap();
    cps.write(&id, 5).unwrap();
    fs.fail(Op::Sync, ".tmp", libc::ENOSPC);
    assert!(cps.write(&id, 6).is_err());
    fs.clear();
    assert_eq!(cps.read(&id).unwrap(), Some(5));
}

/// Found by fuzzing: index positions near `u64::MAX` overflowed the recovery checks. (A lone
/// first entry near `u64::MAX` over a valid frame at byte 0 is repaired from the frame: see
/// `a_flipped_bit_in_the_tail_index_is_repaired_from_the_frames`.)
#[tokio::test(flavor = "multi_thread")]
async fn an_index_entry_near_the_end_of_u64_is_refused_not_overflowed() {
    for positions in [
        vec![0, u64::MAX],
        vec![0, u64::MAX - 3],
        vec![0, u64::MAX - 8],
    ] {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join(segment_file_name(0, "mmm")),
            frame::encode(b"{}"),
        )
        .unwrap();
        let index: Vec<u8> = positions.iter().flat_map(|p| p.to_be_bytes()).collect();
        std::fs::write(tmp.path().join(segment_file_name(0, "idx")), index).unwrap();
        let err = open(tmp.path(), 1 << 20).unwrap_err();
        assert!(
            matches!(err, StorageError::Inconsistent { .. }),
            "{positions:?}: {err}"
        );
    }
}

/// An empty tail segment left behind a segment sealed before this process started (a crash after
/// a rotation, then a restart with bigger segments): after a write error, recovery in place keeps
/// the empty tail instead of falling back to the sealed segment, which takes no appends.
#[tokio::test(flavor = "multi_thread")]
async fn recovery_in_place_keeps_an_empty_tail_after_a_sealed_segment() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 100).unwrap();
    fill(&log, 3).await;
    let next = log.next_offset();
    drop(log);
    // A crash right after a rotation leaves an empty tail where the log ends.
    for ext in ["mmm", "idx"] {
        std::fs::write(tmp.path().join(segment_file_name(next, ext)), b"").unwrap();
    }
    let fs = FaultyFs::new();
    let config = LogConfig {
        segment_max_bytes: 1 << 20,
        retry_after: std::time::Duration::ZERO,
        ..LogConfig::default()
    };
    let log = Log::open(tmp.path(), Arc::new(fs.clone()), config).unwrap();
    fs.fail(Op::Write, ".mmm", libc::EIO);
    assert!(log.append(b"lost").await.is_err());
    fs.clear();
    assert_eq!(log.append(&payload(next)).await.unwrap(), next);
    assert_eq!(log.append(&payload(next + 1)).await.unwrap(), next + 1);
    assert_eq!(
        read_all(&log),
        (0..next + 2).map(payload).collect::<Vec<_>>()
    );
}

/// Many logs over a cache of four open files: every append and read still works (files are
/// closed and reopened under them, rotations included), no more than four stay open, and a
/// reopen after all that finds everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_logs_share_a_small_open_file_cache() {
    let dir = tempfile::tempdir().unwrap();
    let files = FileCache::new(4);
    let config = LogConfig {
        segment_max_bytes: 256,
        files: files.clone(),
        ..LogConfig::default()
    };
    let mut logs = Vec::new();
    for t in 0..20 {
        let path = dir.path().join(format!("t{t}"));
        let config = config.clone();
        logs.push(
            tokio::task::spawn_blocking(move || Log::open(&path, Arc::new(OsFs), config))
                .await
                .unwrap()
                .unwrap(),
        );
    }
    for round in 0..30u64 {
        let appends = logs.iter().map(|log| {
            let log = log.clone();
            async move { log.append(&payload(round)).await.unwrap() }
        });
        let offsets = futures_util::future::join_all(appends).await;
        assert!(offsets.iter().all(|&o| o == round));
        assert!(files.open_files() <= 4, "{} open", files.open_files());
    }
    for log in &logs {
        let all = log.read_from(0, usize::MAX, usize::MAX).unwrap();
        let got: Vec<Vec<u8>> = all.into_iter().map(|e| e.payload.unwrap()).collect();
        assert_eq!(got, (0..30).map(payload).collect::<Vec<_>>());
        assert!(log.stats().segments > 1, "rotations happened");
    }
    drop(logs);
    for t in 0..20 {
        let log = open(&dir.path().join(format!("t{t}")), 256).unwrap();
        assert_eq!(log.next_offset(), 30);
        assert_eq!(log.read(29).unwrap(), Some(payload(29)));
    }
}

/// Out of descriptors while segment files must be reopened (`EMFILE`): an append to a log whose
/// files the cache closed fails cleanly and poisons that log, a read fails with the error, other
/// logs whose files are open keep working, and once descriptors are back the log recovers in place
/// and nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_descriptors_fails_cleanly_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let fs = FaultyFs::new();
    let vfs: Arc<dyn Vfs> = Arc::new(fs.clone());
    let config = LogConfig {
        retry_after: std::time::Duration::ZERO,
        files: FileCache::new(2),
        ..LogConfig::default()
    };
    let cold = Log::open(&dir.path().join("cold"), vfs.clone(), config.clone()).unwrap();
    fill(&cold, 3).await;
    // A second log takes both slots of the cache: the first log's files are closed.
    let hot = Log::open(&dir.path().join("hot"), vfs.clone(), config.clone()).unwrap();
    fill(&hot, 3).await;
    fs.fail(Op::Open, "", libc::EMFILE);
    let err = cold.append(b"lost").await.unwrap_err();
    let os = std::io::Error::from_raw_os_error(libc::EMFILE).to_string();
    assert!(err.to_string().contains(&os), "{err}");
    assert!(cold.read(0).unwrap_err().to_string().contains(&os));
    // The log whose files are open is not affected.
    assert_eq!(hot.append(&payload(3)).await.unwrap(), 3);
    fs.clear();
    assert_eq!(cold.append(&payload(3)).await.unwrap(), 3);
    assert_eq!(read_all(&cold), (0..4).map(payload).collect::<Vec<_>>());
    assert_eq!(read_all(&hot), (0..4).map(payload).collect::<Vec<_>>());
}

/// A flipped bit in the synced (acknowledged) part of the tail index: recovery used to cut the
/// index at the first entry that did not follow the one before it, and the data with it, deleting
/// every later acknowledged message with only a warning. The frames say where each entry is, so
/// the entry is rewritten from them and nothing is lost, whichever entry and bit it is.
#[tokio::test(flavor = "multi_thread")]
async fn a_flipped_bit_in_the_tail_index_is_repaired_from_the_frames() {
    let tmp = tempfile::tempdir().unwrap();
    let pristine = tmp.path().join("pristine");
    let log = open(&pristine, 1 << 20).unwrap();
    fill(&log, 40).await;
    drop(log);
    let files = seg0(&pristine);
    let index = std::fs::read(&files.index).unwrap();
    let mut cases = 0;
    for entry in [0usize, 1, 7, 20, 38, 39] {
        for bit in [0u32, 3, 5, 9, 30, 62] {
            let dir = tmp.path().join(format!("flip-{entry}-{bit}"));
            std::fs::create_dir(&dir).unwrap();
            std::fs::copy(&files.data, seg0(&dir).data).unwrap();
            let mut flipped = index.clone();
            flipped[entry * 8 + 7 - (bit / 8) as usize] ^= 1 << (bit % 8);
            std::fs::write(seg0(&dir).index, &flipped).unwrap();
            let what = format!("entry {entry} bit {bit}");
            let log = open(&dir, 1 << 20).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(log.next_offset(), 40, "{what}");
            assert_eq!(
                read_all(&log),
                (0..40).map(payload).collect::<Vec<_>>(),
                "{what}"
            );
            drop(log);
            // The repair is on disk: the index is byte for byte the original again.
            assert_eq!(std::fs::read(seg0(&dir).index).unwrap(), index, "{what}");
            cases += 1;
        }
    }
    assert_eq!(cases, 36);
}

/// Zeros in the tail index (sectors of a never-synced write that were lost) past the frames that
/// made it to disk are cut, as before; the entries before them stay.
#[tokio::test(flavor = "multi_thread")]
async fn zeros_in_the_tail_index_past_the_valid_frames_are_cut() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 1 << 20).unwrap();
    fill(&log, 10).await;
    drop(log);
    let files = seg0(tmp.path());
    // Two more entries whose index slots were lost (zeros) and whose data is torn.
    let mut extra = frame::encode(&payload(10));
    extra.truncate(extra.len() - 2);
    append_bytes(&files.data, &extra);
    append_bytes(&files.index, &[0u8; 16]);
    let log = open(tmp.path(), 1 << 20).unwrap();
    assert_eq!(log.next_offset(), 10);
    assert_eq!(len(&files.index), 80);
    assert_eq!(log.append(&payload(10)).await.unwrap(), 10);
    assert_eq!(read_all(&log), (0..11).map(payload).collect::<Vec<_>>());
}
