//! Appends: rotation over segment sizes, concurrency, batches, flush modes, waiting for offsets.

use std::sync::Arc;

use super::super::scan::segment_file_name;
use super::super::*;
use super::*;

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
        close(log).await;

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
        close(log).await;
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

/// Retention deleting segments under readers (docs/topics-and-groups.md, "Retention"): a read that had found
/// entries before a segment went away answers them (consecutive, from where it was asked); one
/// that found nothing fails, and only when the log's first offset has moved past it, so its
/// caller goes on from there (as pulls, group polls and dispatchers do). A read never answers a
/// gap or entries from after a jump.
#[tokio::test(flavor = "multi_thread")]
async fn a_read_racing_retention_goes_on_from_the_first_offset() {
    let tmp = tempfile::tempdir().unwrap();
    // One entry per segment, and a cache of two open files: each read opens the files of
    // segments that retention may be deleting at that moment.
    let log = Arc::new(
        Log::open(
            tmp.path(),
            Arc::new(OsFs),
            LogConfig {
                segment_max_bytes: 1,
                files: FileCache::new(2),
                ..LogConfig::default()
            },
        )
        .unwrap(),
    );
    const N: u64 = 600;
    fill(&log, N).await;
    let reader = {
        let log = log.clone();
        std::thread::spawn(move || {
            let mut reads = 0u64;
            let mut failed = 0u64;
            while log.first_offset() < N - 1 {
                let from = log.first_offset();
                let got = match log.read_from(from, 8, usize::MAX) {
                    Ok(got) => got,
                    Err(e) => {
                        assert!(log.first_offset() > from, "read from {from} failed: {e}");
                        failed += 1;
                        continue;
                    }
                };
                let offsets: Vec<u64> = got.iter().map(|e| e.offset).collect();
                assert_eq!(
                    offsets,
                    (from..from + offsets.len() as u64).collect::<Vec<_>>()
                );
                reads += 1;
            }
            (reads, failed)
        })
    };
    for upto in 1..N {
        log.remove_segments_before(upto).unwrap();
        std::thread::yield_now();
    }
    let (reads, failed) = reader.join().unwrap();
    assert!(reads > 0);
    eprintln!("{reads} reads, {failed} found their segment gone");
}

/// Appends `payload(i)` as a produce does (the only append that may lead its commit).
async fn append_with(log: &Log, i: u64) -> u64 {
    let p = payload(i);
    log.append_with(p.len(), |out| out.extend_from_slice(&p), None)
        .await
        .unwrap()
}

/// [`Log::append`] never leads: its caller may be a task that drives other futures beside it.
#[tokio::test(flavor = "multi_thread")]
async fn a_plain_append_never_commits_on_its_callers_thread() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, threads) = observed_log(tmp.path());
    let mut callers = Vec::new();
    for i in 0..10 {
        callers.push(std::thread::current().id());
        assert_eq!(log.append(&payload(i)).await.unwrap(), i);
    }
    assert!(threads.lock().iter().zip(&callers).all(|(t, c)| t != c));
    close(log).await;
}

/// The thread each commit ran on, and the log that reports it.
fn observed_log(
    dir: &std::path::Path,
) -> (Log, Arc<parking_lot::Mutex<Vec<std::thread::ThreadId>>>) {
    let threads = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let seen = threads.clone();
    let log = Log::open(
        dir,
        Arc::new(OsFs),
        LogConfig {
            on_commit: Some(Arc::new(move |_| {
                seen.lock().push(std::thread::current().id())
            })),
            ..LogConfig::default()
        },
    )
    .unwrap();
    (log, threads)
}

/// docs/storage.md, "Storage" (group commit): one appender at a time on a multi-threaded runtime
/// commits on its own thread — no hand-off to a writer thread and back.
#[tokio::test(flavor = "multi_thread")]
async fn a_lone_appender_commits_on_its_own_thread() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, threads) = observed_log(tmp.path());
    let mut callers = Vec::new();
    for i in 0..20 {
        // No await between this and the append's submit: the poll that submits runs here.
        callers.push(std::thread::current().id());
        assert_eq!(append_with(&log, i).await, i);
    }
    assert_eq!(*threads.lock(), callers);
    close(log).await;
}

/// On a current-thread runtime blocking its one thread would stall every task: a blocking thread
/// commits instead.
#[tokio::test(flavor = "current_thread")]
async fn on_a_current_thread_runtime_a_blocking_thread_commits() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, threads) = observed_log(tmp.path());
    for i in 0..5 {
        assert_eq!(append_with(&log, i).await, i);
    }
    let me = std::thread::current().id();
    assert_eq!(threads.lock().len(), 5);
    assert!(threads.lock().iter().all(|t| *t != me));
    close(log).await;
}

/// Under concurrency (commits of many appends) a blocking writer commits, so that a request
/// waiting on a worker does not move that worker's other tasks to another thread for every
/// commit; once appends come one at a time again, they lead again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appenders_leave_the_commit_to_a_writer_thread_then_lead_again() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, threads) = observed_log(tmp.path());
    let mut tasks = Vec::new();
    for t in 0..64u64 {
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..50 {
                append_with(&log, t * 1000 + i).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (commits, led) = (threads.lock().len() as u64, log.led_commits());
    assert!(led * 4 < commits, "{led} of {commits} commits led");
    threads.lock().clear();
    let mut callers = Vec::new();
    for i in 0..80 {
        callers.push(std::thread::current().id());
        append_with(&log, 100_000 + i).await;
    }
    // The moving average of batch sizes (an eighth per commit) comes down from 64 within about
    // 30 commits of one append.
    assert_eq!(threads.lock()[50..], callers[50..]);
    close(log).await;
}

/// An append's settle hook hears the outcome even when the append's future was dropped after it
/// was submitted (a produce with an id resolves its claim through it: docs/delivery.md,
/// "Idempotent produce"), and hears a refusal too.
#[tokio::test(flavor = "current_thread")]
async fn a_settle_hook_hears_the_outcome_of_a_dropped_append() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 1 << 20).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let settle: Settle = Box::new(move |outcome| {
        tx.send(outcome.map(|(first, _)| first).map_err(|e| e.to_string()))
            .unwrap()
    });
    let append = log.append_with(8, |out| out.extend_from_slice(b"{\"a\":1}"), Some(settle));
    // One poll submits it; then the caller goes away.
    let mut append = Box::pin(append);
    let _ = futures_util::poll!(&mut append);
    drop(append);
    let outcome = tokio::task::spawn_blocking(move || rx.recv().unwrap())
        .await
        .unwrap();
    assert_eq!(outcome, Ok(0));
    log.wait_for(0).await;
    assert_eq!(log.read(0).unwrap().unwrap(), b"{\"a\":1}");

    close(log.clone()).await;
    let (tx, rx) = std::sync::mpsc::channel();
    let settle: Settle = Box::new(move |outcome| tx.send(outcome.is_err()).unwrap());
    assert!(
        log.append_with(1, |out| out.push(b'1'), Some(settle))
            .await
            .is_err()
    );
    assert!(rx.recv().unwrap(), "a closed log's refusal is settled");
}
