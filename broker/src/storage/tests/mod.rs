//! Storage tests at the byte level: recovery of every damaged shape the docs/storage.md, "Storage" names
//! (`recovery`), rotation, concurrency and flush modes (`appends`), I/O faults, checkpoints and
//! the open-file cache (`faults`); this module holds the layout tests and the shared helpers.

mod appends;
mod clustered;
mod faults;
mod recovery;

use std::path::Path;
use std::sync::Arc;

use super::scan::SegmentFiles;
use super::*;

pub(super) fn open(dir: &Path, segment_max_bytes: u64) -> Result<Log, StorageError> {
    Log::open(
        dir,
        Arc::new(OsFs),
        LogConfig {
            segment_max_bytes,
            ..LogConfig::default()
        },
    )
}

/// Closes the log as a clean shutdown does, leaving the exact layout (no preallocated zeros, the
/// index complete) for a test to read or damage.
pub(super) async fn close(log: Log) {
    log.close().await.unwrap();
}

pub(super) fn payload(i: u64) -> Vec<u8> {
    // Varied lengths so that positions are not a multiple of anything.
    format!(r#"{{"n":{i},"pad":"{}"}}"#, "x".repeat((i % 37) as usize)).into_bytes()
}

pub(super) async fn fill(log: &Log, n: u64) {
    for i in 0..n {
        assert_eq!(log.append(&payload(i)).await.unwrap(), i);
    }
}

pub(super) fn read_all(log: &Log) -> Vec<Vec<u8>> {
    log.read_from(0, usize::MAX, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|e| e.payload.unwrap())
        .collect()
}

pub(super) fn seg0(dir: &Path) -> SegmentFiles {
    SegmentFiles::new(dir, 0)
}

/// A fresh copy of the first segment's two files of the log in `from`, in a new directory `to`,
/// for a test to damage.
pub(super) fn copy_segment(from: &Path, to: &Path) {
    std::fs::create_dir(to).unwrap();
    let (from, to) = (seg0(from), seg0(to));
    std::fs::copy(from.data, to.data).unwrap();
    std::fs::copy(from.index, to.index).unwrap();
}

pub(super) fn len(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

pub(super) fn truncate(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

pub(super) fn append_bytes(path: &Path, bytes: &[u8]) {
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
    let mut expected = frame::encode(b"{\"a\":1}");
    expected.extend(frame::encode(b"[]"));
    // While it runs, the tail is preallocated with zeros past its entries.
    let running = std::fs::read(&files.data).unwrap();
    assert_eq!(running[..expected.len()], expected);
    assert!(running.len() > expected.len());
    assert!(running[expected.len()..].iter().all(|&b| b == 0));
    // A clean close leaves the exact layout.
    close(log).await;
    let data = std::fs::read(&files.data).unwrap();
    assert_eq!(data, expected);
    let index = std::fs::read(&files.index).unwrap();
    assert_eq!(index, [0u64.to_be_bytes(), 15u64.to_be_bytes()].concat());
}

/// The zeros ahead of a running tail follow what it received (issue 28: a topic of 1,024
/// partitions of one message each took 1 GiB when every tail got the whole 1 MiB cap at once): a
/// tail of one small message holds one 4 KiB run of zeros; as it fills, the zeros stay between
/// half and all of as many as it holds data; a busy tail gets the whole cap.
#[tokio::test(flavor = "multi_thread")]
async fn preallocation_grows_with_what_the_tail_received() {
    use super::segment::{MIN_PREALLOCATION, preallocation};
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 64 << 20).unwrap();
    let data = seg0(tmp.path()).data;
    let max = LogConfig::default().preallocate_bytes;
    assert_eq!(max, 1 << 20);
    log.append(b"{}").await.unwrap();
    let end = frame::encode(b"{}").len() as u64;
    assert_eq!(len(&data), end + MIN_PREALLOCATION);
    let mut size = 100;
    let mut saw_the_cap = false;
    while log.stats().bytes < 4 * max {
        log.append(&vec![b'x'; size]).await.unwrap();
        let end = log.stats().bytes;
        let (zeros, ahead) = (len(&data) - end, preallocation(end, max));
        assert!(
            ahead / 2 <= zeros && zeros <= ahead,
            "{zeros} zeros past {end} bytes, not within half of {ahead} and all of it"
        );
        saw_the_cap |= zeros == max;
        size = size * 3 / 2;
    }
    assert!(saw_the_cap, "a tail past the cap gets all of it");
}

#[tokio::test(flavor = "multi_thread")]
async fn reopen_keeps_everything_and_continues_the_offsets() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 1 << 20).unwrap();
    fill(&log, 50).await;
    close(log).await;
    let log = open(tmp.path(), 1 << 20).unwrap();
    assert_eq!(log.next_offset(), 50);
    assert_eq!(log.append(&payload(50)).await.unwrap(), 50);
    let all = read_all(&log);
    assert_eq!(all.len(), 51);
    for (i, p) in all.iter().enumerate() {
        assert_eq!(p, &payload(i as u64));
    }
}
