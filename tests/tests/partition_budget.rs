//! What partitions may cost (issue 28): the disk a barely used partition takes while the broker
//! runs, and the cap on partitions over all topics (`serve --max-partitions`, docs/operations.md,
//! "`mmmq serve`"), against the real binary.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use mmmq_tests::Broker;
use serde_json::{Value, json};

/// Every regular file under `dir`: (apparent bytes, allocated bytes, data files).
fn disk_use(dir: &Path) -> (u64, u64, Vec<(std::path::PathBuf, u64)>) {
    let (mut len, mut allocated, mut data) = (0, 0, Vec::new());
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file() {
                len += meta.len();
                allocated += meta.blocks() * 512;
                if path.extension().is_some_and(|x| x == "mmm") {
                    data.push((path, meta.len()));
                }
            }
        }
    }
    (len, allocated, data)
}

/// A topic of 1,024 partitions with one message each, while the broker runs (tails preallocated):
/// each data file is its one entry and 4 KiB of zeros, the whole root a few MiB. Each tail used to
/// get 1 MiB of zeros on its first write, 1 GiB in all until shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_of_1024_barely_used_partitions_takes_little_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    let (status, body) = broker
        .put("/mmmq/topics/wide", &json!({"partitions": 1024}))
        .await;
    assert_eq!(status, 200, "{body}");
    let batch: Vec<Value> = (0..1024)
        .map(|p| json!({"topic": "wide", "partition": p, "content": {"p": p}}))
        .collect();
    let (status, body) = broker.post("/mmmq/messages/batch", &json!(batch)).await;
    assert_eq!(status, 200, "{body}");
    let (len, allocated, data) = disk_use(tmp.path());
    assert_eq!(data.len(), 1024);
    for (path, bytes) in &data {
        assert!(
            (4096..8192).contains(bytes),
            "{}: {bytes} bytes for one entry and its zeros",
            path.display()
        );
    }
    assert!(len < 9 << 20, "{len} bytes in all");
    // Blocks, as `du` counts them: files, not directories (1 GiB before).
    assert!(allocated < 64 << 20, "{allocated} bytes allocated");
    assert_eq!(broker.metric("mmmq_partitions").await, 1024.0);
}

/// The error of a `403` answer, checking that the gauge still shows the cap's 8 partitions.
async fn refused(broker: &Broker, status_and_body: (u16, Value)) -> String {
    let (status, body) = status_and_body;
    assert_eq!(status, 403, "{body}");
    assert_eq!(broker.metric("mmmq_partitions").await, 8.0);
    body["error"].as_str().unwrap().to_owned()
}

/// `--max-partitions 8`: creating a topic (by the topic API or a first produce) or growing one
/// past it is refused with 403 naming the cap, before anything of it is created; the
/// `mmmq_partitions` gauge shows the count; a delete frees its partitions; partitions found at
/// boot are kept even past a lower cap, and count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_partitions_refuses_topics_and_growth_past_it_with_403() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start_with(tmp.path(), &["--max-partitions", "8"]).await;
    assert_eq!(broker.metric("mmmq_max_partitions").await, 8.0);
    assert_eq!(broker.metric("mmmq_partitions").await, 0.0);
    let (status, body) = broker
        .put("/mmmq/topics/a", &json!({"partitions": 6}))
        .await;
    assert_eq!(status, 200, "{body}");
    broker.produce("c", json!(1)).await;
    broker.produce("d", json!(1)).await;

    let error = refused(
        &broker,
        broker
            .put("/mmmq/topics/b", &json!({"partitions": 3}))
            .await,
    )
    .await;
    assert_eq!(
        error,
        "partition limit reached: this broker holds 8 partitions over all topics, and 3 more \
         would pass its maximum of 8 (mmmq serve --max-partitions); \"b\" was not created"
    );
    assert_eq!(broker.get("/mmmq/topics/b").await.0, 404);
    let error = refused(
        &broker,
        broker
            .put("/mmmq/topics/a", &json!({"partitions": 7}))
            .await,
    )
    .await;
    assert_eq!(
        error,
        "partition limit reached: this broker holds 8 partitions over all topics, and 1 more \
         would pass its maximum of 8 (mmmq serve --max-partitions); \"a\" was not grown"
    );
    let (_, a) = broker.get("/mmmq/topics/a").await;
    assert_eq!(a["partitions"].as_array().unwrap().len(), 6, "{a}");
    let produce_e = json!({"topic": "e", "content": 1});
    let error = refused(&broker, broker.post("/mmmq/messages", &produce_e).await).await;
    assert!(
        error.ends_with("(mmmq serve --max-partitions); \"e\" was not created"),
        "{error}"
    );
    broker.produce("a", json!(2)).await;

    assert_eq!(broker.delete("/mmmq/topics/d").await.0, 200);
    assert_eq!(broker.metric("mmmq_partitions").await, 7.0);
    broker.produce("e", json!(1)).await;
    assert_eq!(broker.metric("mmmq_partitions").await, 8.0);

    assert!(broker.terminate().success());
    let broker = Broker::start_with(tmp.path(), &["--max-partitions", "4"]).await;
    assert_eq!(broker.metric("mmmq_partitions").await, 8.0);
    broker.produce("a", json!(3)).await;
    let (status, body) = broker
        .post("/mmmq/messages", &json!({"topic": "f", "content": 1}))
        .await;
    assert_eq!(status, 403, "after a restart: {body}");
}
