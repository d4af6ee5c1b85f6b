//! I/O faults and recovery in place, checkpoints, and the shared open-file cache.

use std::sync::Arc;

use super::super::vfs::fault::{FaultyFs, Op};
use super::super::*;
use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_write_error_fails_the_append_and_the_log_recovers_in_place_once_the_disk_does() {
    for (op, file) in [(Op::Sync, ".mmm"), (Op::Write, ".mmm")] {
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
            close(log).await;
            let log = Log::open(tmp.path(), vfs, config).unwrap();
            assert_eq!(read_all(&log), (0..20).map(payload).collect::<Vec<_>>());
        }
    }
}

/// The data fsync is the commit point: an index that fails to write or sync after it does not
/// take back the acknowledgement, but poisons the log until the index is rewritten in place.
#[tokio::test(flavor = "multi_thread")]
async fn an_index_failure_after_the_commit_keeps_the_append_and_the_index_heals() {
    for op in [Op::Sync, Op::Write] {
        for errno in [libc::EIO, libc::ENOSPC] {
            let tmp = tempfile::tempdir().unwrap();
            let fs = FaultyFs::new();
            let vfs: Arc<dyn Vfs> = Arc::new(fs.clone());
            let config = LogConfig {
                segment_max_bytes: 200,
                retry_after: std::time::Duration::ZERO,
                // Every commit syncs the index, so that a failing index sync shows at once.
                index_sync_interval: std::time::Duration::ZERO,
                ..LogConfig::default()
            };
            let log = Log::open(tmp.path(), vfs.clone(), config.clone()).unwrap();
            fill(&log, 3).await;
            fs.fail(op, ".idx", errno);
            // The index of the last append is written after its answer, so the failure may hit
            // that one's index or this one's: whichever append was acknowledged stays.
            let acked = match log.append(&payload(3)).await {
                Ok(offset) => offset + 1,
                Err(e) => {
                    assert!(matches!(e, StorageError::Poisoned { .. }), "{e}");
                    3
                }
            };
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while log.poisoned().is_none() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{op:?} {errno}: never poisoned"
                );
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            // Still failing: recovery in place cannot rewrite the index, so appends are refused.
            assert!(log.append(b"refused").await.is_err());
            assert_eq!(read_all(&log), (0..acked).map(payload).collect::<Vec<_>>());
            fs.clear();
            for i in acked..20 {
                assert_eq!(log.append(&payload(i)).await.unwrap(), i);
            }
            assert_eq!(log.poisoned(), None);
            close(log).await;
            let files = seg0(tmp.path());
            let log = Log::open(tmp.path(), vfs, config).unwrap();
            assert_eq!(read_all(&log), (0..20).map(payload).collect::<Vec<_>>());
            assert!(len(&files.index) > 0);
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
    fs.fail(Op::Sync, ".mmm", libc::EIO);
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
