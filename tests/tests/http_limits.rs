//! HTTP limits and abuse against the real `mmmq` binary: slow headers (slowloris), idle
//! connections, trickling bodies, oversized headers, the connection cap, the topic cap, the open
//! file cap, and a load past the connection cap that must slow the broker down, not lose or refuse
//! acknowledged data.

use std::time::{Duration, Instant};

use mmmq_tests::{
    Broker, Consumer, connect_from, host_dispatcher, read_to_close, write_dispatchers,
};
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_are_cut_off_while_normal_requests_are_served() {
    // 1,000 slowloris connections need more descriptors than the usual soft limit of 1,024.
    let _ = rlimit::increase_nofile_limit(8192);
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start_with(tmp.path(), &["--header-timeout-ms", "1500"]).await;
    let addr = broker.addr();
    let mut slow = Vec::new();
    // From four client addresses, each under the default --max-connections-per-ip (256).
    for n in 0..1000 {
        let mut s = connect_from(&format!("127.0.0.{}", 2 + n % 4), addr).await;
        s.write_all(b"POST /mmmq/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .await
            .unwrap();
        slow.push(s);
    }
    let started = Instant::now();
    // While they trickle a header byte at a time, ordinary produces are answered.
    let mut served = 0;
    let trickle = async {
        for round in 0..30u8 {
            for s in slow.iter_mut() {
                // Errors are expected once the broker has cut a connection.
                let _ = s.write_all(&[b'a' + round % 26]).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let normal = async {
        for n in 0..20 {
            let t = Instant::now();
            broker.produce("orders", json!({"n": n})).await;
            assert!(
                t.elapsed() < Duration::from_secs(2),
                "a normal produce took {:?}",
                t.elapsed()
            );
            served += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::join!(trickle, normal);
    assert_eq!(served, 20);
    // Every slow connection was closed by the broker, none was answered with a request's result.
    let mut closed = 0;
    for s in slow.iter_mut() {
        let (got, was_closed) = read_to_close(s, Duration::from_secs(5)).await;
        assert!(
            !String::from_utf8_lossy(&got).contains("\"ack\""),
            "a slow request was served"
        );
        closed += usize::from(was_closed);
    }
    assert_eq!(closed, 1000, "slow connections left open");
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(broker.pull_all("orders").await.len(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_and_trickling_bodies_time_out() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start_with(
        tmp.path(),
        // The request deadline before the header timeout, which also cuts off a stalled body.
        &["--header-timeout-ms", "1000", "--request-timeout-ms", "700"],
    )
    .await;
    let addr = broker.addr();
    // A connection that never sends anything.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    // A kept-alive connection that sends one request and then nothing.
    let mut kept = TcpStream::connect(addr).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    // A body that never completes.
    let mut trickle = TcpStream::connect(addr).await.unwrap();
    trickle
        .write_all(
            b"POST /mmmq/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"topic\":",
        )
        .await
        .unwrap();
    let (_, idle_closed) = read_to_close(&mut idle, Duration::from_secs(5)).await;
    assert!(idle_closed, "an idle connection stayed open");
    let (got, kept_closed) = read_to_close(&mut kept, Duration::from_secs(5)).await;
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    assert!(kept_closed, "an idle kept-alive connection stayed open");
    let (got, _) = read_to_close(&mut trickle, Duration::from_secs(5)).await;
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("not completed within"), "{got}");
    // Nothing of the incomplete request was stored.
    assert_eq!(broker.get("/mmmq/topics").await.1, json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_headers_get_431() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    // A request head just over the 64 KiB limit, sent whole before the answer is read: the
    // client always gets the 431 (a dropped connection is a failure).
    for attempt in 0..10 {
        let mut s = TcpStream::connect(broker.addr()).await.unwrap();
        let head = format!(
            "GET /mmmq/topics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: {}\r\n\r\n",
            "a".repeat(65 * 1024)
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let (got, _) = read_to_close(&mut s, Duration::from_secs(10)).await;
        let text = String::from_utf8_lossy(&got);
        assert!(
            text.starts_with("HTTP/1.1 431"),
            "attempt {attempt}: {text:?}"
        );
    }
    assert_eq!(broker.get("/healthz").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_connection_cap_clients_wait_and_nothing_is_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start_with(
        tmp.path(),
        &["--max-connections", "8", "--header-timeout-ms", "1000"],
    )
    .await;
    let addr = broker.addr();
    // Eight idle connections take every slot; a request waits until the broker closes them.
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    let t = Instant::now();
    let fresh = reqwest::Client::new();
    let r = fresh
        .post(format!("{}/mmmq/messages", broker.url))
        .json(&json!({"topic": "t", "content": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        t.elapsed() >= Duration::from_millis(500),
        "the request was not held back by the cap ({:?})",
        t.elapsed()
    );
    drop(idle);
    // 128 producers, each on its own connection, through 8 slots: all acknowledged, all stored.
    let mut tasks = Vec::new();
    for p in 0..128u64 {
        let url = broker.url.clone();
        tasks.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut offsets = Vec::new();
            for i in 0..10u64 {
                let r = http
                    .post(format!("{url}/mmmq/messages"))
                    .json(&json!({"topic": "load", "content": {"p": p, "i": i}}))
                    .send()
                    .await
                    .expect("no connection is refused");
                assert_eq!(r.status(), 200);
                let body: serde_json::Value = r.json().await.unwrap();
                offsets.push(body["offset"].as_u64().unwrap());
            }
            offsets
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_unstable();
    assert_eq!(all, (0..1280).collect::<Vec<_>>());
    let stored = broker.pull_all("load").await;
    assert_eq!(stored.len(), 1280);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_topic_cap_refuses_new_topics_with_403_and_keeps_existing_ones_working() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start_with(tmp.path(), &["--max-topics", "3"]).await;
    for t in ["a", "b"] {
        broker.produce(t, json!(1)).await;
    }
    // A batch that would create two topics with room for one is refused whole: the first new
    // topic is not created either, and nothing reaches the existing topic.
    let (status, body) = broker
        .post(
            "/mmmq/messages/batch",
            &json!([{"topic": "x", "content": 2}, {"topic": "a", "content": 2},
                    {"topic": "y", "content": 2}]),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert!(body["error"].as_str().unwrap().contains("\"y\""), "{body}");
    let (_, topics) = broker.get("/mmmq/topics").await;
    assert_eq!(topics.as_array().unwrap().len(), 2, "{topics}");
    assert_eq!(broker.pull_all("a").await.len(), 1);
    broker.produce("c", json!(1)).await;
    let (status, body) = broker
        .post("/mmmq/messages", &json!({"topic": "d", "content": 1}))
        .await;
    assert_eq!(status, 403, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.contains("topic limit") && error.contains("3") && error.contains("--max-topics"),
        "{error}"
    );
    broker.produce("a", json!(3)).await;
    let (_, topics) = broker.get("/mmmq/topics").await;
    assert_eq!(topics.as_array().unwrap().len(), 3, "{topics}");
    // Topics found on disk at boot count towards the cap.
    assert!(broker.terminate().success());
    let broker = Broker::start_with(tmp.path(), &["--max-topics", "3"]).await;
    let (status, body) = broker
        .post("/mmmq/messages", &json!({"topic": "d", "content": 1}))
        .await;
    assert_eq!(status, 403, "after a restart: {body}");
    broker.produce("c", json!(2)).await;
}

/// Segment files held open by the broker: what `/proc/PID/fd` points at.
fn open_segment_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|p| p.extension().is_some_and(|x| x == "mmm" || x == "idx"))
        .count()
}

/// `--max-open-files 4` with 30 topics that rotate segments and are delivered to a consumer:
/// never more than 4 segment files open, yet every produce, pull and delivery works (files are
/// closed and reopened under them), in order, and a restart finds everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_topics_work_through_four_open_files() {
    let tmp = tempfile::tempdir().unwrap();
    let consumer = Consumer::start().await;
    write_dispatchers(
        tmp.path(),
        &json!([host_dispatcher("sink", "fd.*", consumer.port)]),
    );
    let args = ["--max-open-files", "4", "--segment-max-bytes", "300"];
    let broker = Broker::start_with(tmp.path(), &args).await;
    let topics: Vec<String> = (0..30).map(|t| format!("fd.t{t}")).collect();
    let mut most = 0;
    for round in 0..5 {
        for t in &topics {
            assert_eq!(broker.produce(t, json!({"round": round})).await, round);
        }
        most = most.max(open_segment_files(broker.pid()));
    }
    consumer.wait_for(150, Duration::from_secs(30)).await;
    most = most.max(open_segment_files(broker.pid()));
    assert!(most <= 4, "{most} segment files open");
    // The metrics show the cap and what is open.
    let metrics = broker.get_text("/metrics").await;
    assert!(
        metrics.contains("mmmq_max_open_segment_files 4"),
        "{metrics}"
    );
    let open: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("mmmq_open_segment_files "))
        .expect("the open-file gauge")
        .parse()
        .unwrap();
    assert!((1..=4).contains(&open), "{open}");
    for t in &topics {
        let rounds: Vec<u64> = consumer
            .of_topic(t)
            .iter()
            .map(|e| e["content"]["round"].as_u64().unwrap())
            .collect();
        assert_eq!(rounds, (0..5).collect::<Vec<_>>(), "{t}");
        assert_eq!(broker.pull_all(t).await.len(), 5, "{t}");
    }
    assert!(broker.terminate().success());
    let broker = Broker::start_with(tmp.path(), &args).await;
    for t in &topics {
        assert_eq!(broker.produce(t, json!({"round": 5})).await, 5, "{t}");
    }
    assert!(open_segment_files(broker.pid()) <= 4);
}

/// A consumer that stays down while 50 MiB of messages pile up: the backlog lives in the log, not
/// in the broker's memory, and delivery resumes in order once the consumer is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_consumer_outage_costs_disk_not_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let port = mmmq_tests::free_port();
    mmmq_tests::write_dispatchers(
        tmp.path(),
        &json!([mmmq_tests::host_dispatcher("down", "backlog", port)]),
    );
    let broker = Broker::start(tmp.path()).await;
    broker.produce("backlog", json!("warm-up")).await;
    let before = broker.rss_bytes();
    let pad = "x".repeat(1000);
    for b in 0..500 {
        let batch: Vec<_> = (0..100)
            .map(|i| json!({"topic": "backlog", "content": {"b": b, "i": i, "pad": pad}}))
            .collect();
        let (status, body) = broker.post("/mmmq/messages/batch", &json!(batch)).await;
        assert_eq!(status, 200, "{body}");
    }
    let after = broker.rss_bytes();
    let grown = after.saturating_sub(before);
    eprintln!(
        "50,000 messages (~52 MB) behind a dead consumer: RSS {} -> {} MiB",
        before >> 20,
        after >> 20
    );
    assert!(
        grown < 32 << 20,
        "RSS grew by {} MiB for a 52 MB backlog",
        grown >> 20
    );
    let consumer = mmmq_tests::Consumer::start_on(
        port,
        std::sync::Arc::new(|_: &serde_json::Value| mmmq_tests::Answer::Ack),
    )
    .await;
    // Delivery picks up where it stopped, in order (all of it would take a debug build a while).
    let got = consumer.wait_for(1000, Duration::from_secs(60)).await;
    for (i, e) in got.iter().take(1000).enumerate() {
        assert_eq!(e["offset"], i as u64);
    }
}
