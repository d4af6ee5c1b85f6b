//! `mmmq inspect` as a user runs it: the real binary over real directories.

use std::process::Command;
use std::sync::Arc;

use mmmq::storage::{Log, LogConfig, OsFs};

fn inspect(args: &[&std::ffi::OsStr]) -> (i32, String) {
    let out = Command::new(mmmq_tests::mmmq_bin())
        .arg("inspect")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

async fn open_log(dir: &std::path::Path, config: LogConfig) -> Log {
    let d = dir.to_owned();
    tokio::task::spawn_blocking(move || Log::open(&d, Arc::new(OsFs), config))
        .await
        .unwrap()
        .unwrap()
}

async fn make_topic(dir: &std::path::Path, n: u64) {
    let config = LogConfig {
        segment_max_bytes: 200,
        ..LogConfig::default()
    };
    let log = open_log(dir, config).await;
    for i in 0..n {
        let p = format!(r#"{{"timestamp":1,"key":null,"content":{{"n":{i}}}}}"#);
        log.append(p.as_bytes()).await.unwrap();
    }
    // A clean close, so that the files have the exact layout (no preallocated zeros).
    log.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sound_topic_is_listed_entry_by_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let topic = tmp.path().join("topics").join("order.created");
    make_topic(&topic, 6).await;
    let (code, out) = inspect(&[topic.as_os_str()]);
    assert_eq!(code, 0, "{out}");
    for n in 0..6 {
        assert!(out.contains(&format!(r#""content":{{"n":{n}}}"#)), "{out}");
    }
    assert!(out.contains("6 entries, 0 corrupt"), "{out}");
    assert!(out.contains("status: OK"), "{out}");
    // A root dir inspects every topic under it.
    make_topic(&tmp.path().join("topics").join("b"), 2).await;
    let (code, out) = inspect(&[tmp.path().as_os_str()]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("2 topic(s)") && out.contains("8 entries"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn corruption_is_reported_and_the_exit_code_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let topic = tmp.path().join("t");
    make_topic(&topic, 3).await;
    let data = topic.join("0000000000000000000.mmm");
    let mut bytes = std::fs::read(&data).unwrap();
    let last = bytes.len() - 3;
    bytes[last] ^= 0x01;
    std::fs::write(&data, &bytes).unwrap();
    let before = std::fs::read(&data).unwrap();
    let (code, out) = inspect(&[topic.as_os_str()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("MISMATCH"), "{out}");
    assert!(out.contains("1 corrupt"), "{out}");
    assert!(out.contains("status: DAMAGED"), "{out}");
    assert_eq!(
        std::fs::read(&data).unwrap(),
        before,
        "inspect never writes"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_index_past_the_data_is_an_inconsistency() {
    let tmp = tempfile::tempdir().unwrap();
    let topic = tmp.path().join("t");
    make_topic(&topic, 1).await;
    let data = topic.join("0000000000000000000.mmm");
    let len = std::fs::metadata(&data).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&data)
        .unwrap()
        .set_len(len - 5)
        .unwrap();
    let (code, out) = inspect(&[topic.as_os_str(), "--no-payload".as_ref()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("0000000000000000000.idx"), "{out}");
    assert!(out.contains("past the end of the data file"), "{out}");
}

#[test]
fn a_missing_directory_is_a_clear_error() {
    let (code, out) = inspect(&["/nonexistent/mmmq".as_ref()]);
    assert_ne!(code, 0);
    assert!(
        out.contains("/nonexistent/mmmq") && out.contains("no such directory"),
        "{out}"
    );
}

/// A tail as a running or crashed broker leaves it: preallocated zeros past the last entry and an
/// index that lags the data. `inspect` lists every committed entry, calls the zeros preallocation
/// and the lag what it is, and finds no damage.
#[tokio::test(flavor = "multi_thread")]
async fn a_running_tail_with_preallocation_and_a_lagging_index_is_sound() {
    let tmp = tempfile::tempdir().unwrap();
    let topic = tmp.path().join("t");
    let d = topic.clone();
    let log =
        tokio::task::spawn_blocking(move || Log::open(&d, Arc::new(OsFs), LogConfig::default()))
            .await
            .unwrap()
            .unwrap();
    for i in 0..5 {
        let p = format!(r#"{{"timestamp":1,"key":null,"content":{{"n":{i}}}}}"#);
        log.append(p.as_bytes()).await.unwrap();
    }
    drop(log);
    let index = topic.join("0000000000000000000.idx");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&index)
        .unwrap()
        .set_len(16)
        .unwrap();
    let (code, out) = inspect(&[topic.as_os_str(), "--no-payload".as_ref()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("5 entries"), "{out}");
    assert!(out.contains("3 complete entr"), "{out}");
    assert!(out.contains("preallocated"), "{out}");
    assert!(out.contains("status: OK"), "{out}");
}

/// A clustered partition (docs/cluster.md, "Clustered partitions on disk"): each entry shows its
/// Raft term and index before the message, which reads as it would in a single-node log.
#[tokio::test(flavor = "multi_thread")]
async fn a_clustered_partition_shows_each_entrys_term_and_index() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    let config = LogConfig {
        raft_header: true,
        ..LogConfig::default()
    };
    let log = open_log(&dir, config).await;
    let entries: Vec<(u64, u64, String)> = (0..3)
        .map(|i| {
            let p = format!(r#"{{"timestamp":1,"key":null,"content":{{"n":{i}}}}}"#);
            (7, 40 + 2 * i, p)
        })
        .collect();
    log.append_raft(&entries).unwrap().await.unwrap();
    log.close().await.unwrap();
    std::fs::create_dir(dir.join("raft")).unwrap();
    let (code, out) = inspect(&[dir.as_os_str()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("TERM        INDEX PAYLOAD"), "{out}");
    for (term, index, payload) in &entries {
        let row = format!("{term:>8} {index:>12} {payload}");
        assert!(out.contains(&row), "{row:?} in\n{out}");
    }
    assert!(out.contains("raft/ (a clustered partition"), "{out}");
    assert!(out.contains("status: OK"), "{out}");
}
