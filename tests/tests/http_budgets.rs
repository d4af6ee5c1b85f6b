//! The budgets an HTTP client cannot pass (docs/guarantees.md, "Security"), against the real
//! binary: request bodies in flight (counted as they arrive), plugin uploads (staged on disk, not
//! in memory), connections per address and a connection that never sends a byte.

use std::time::Duration;

use mmmq_tests::{Broker, connect_from, error_of, eventually_async, read_to_close};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

const MESSAGE: &str = r#"{"topic":"t","content":1}"#;

/// Request bodies share one budget (`--max-inflight-body-bytes`): past it a request is refused
/// with `503` and `Retry-After` before its body is read, and others that fit go on. A plugin upload
/// is staged on disk, not held in memory, while it counts against the budget; an oversized one is
/// `413`, as is every body or batch element over its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_share_a_budget_and_plugin_uploads_are_staged_on_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let args = [
        "--max-inflight-body-bytes",
        "67108864",
        "--max-body-bytes",
        "100000",
    ];
    let broker = Broker::start_with(tmp.path(), &args).await;
    broker.produce("t", json!("warm-up")).await;
    let rss_before = broker.rss_bytes();
    // An upload of 64 MiB that stops 1 MiB short.
    let declared = 64usize << 20;
    let mut upload = tokio::net::TcpStream::connect(broker.addr()).await.unwrap();
    let head = format!(
        "PUT /mmmq/plugins/big HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/wasm\r\nContent-Length: {declared}\r\nConnection: close\r\n\r\n"
    );
    upload.write_all(head.as_bytes()).await.unwrap();
    let mib = vec![0u8; 1 << 20];
    for _ in 0..63 {
        upload.write_all(&mib).await.unwrap();
    }
    let pid = broker.pid();
    let staged = eventually_async(
        Duration::from_secs(30),
        "the upload staged on disk",
        || async { staged_upload_bytes(pid).filter(|&n| n >= 62 << 20) },
    )
    .await;
    assert!(staged <= 63 << 20, "{staged}");
    // Not held in memory: what RSS grew by is the buffers the upload passed through, which the
    // allocator may keep for reuse, far below the 63 MiB received.
    let grown = broker.rss_bytes().saturating_sub(rss_before);
    assert!(
        grown < 16 << 20,
        "RSS grew by {} MiB for a 63 MiB upload",
        grown >> 20
    );
    // What has arrived is counted, not what is declared.
    eventually_async(Duration::from_secs(10), "63 MiB counted", || async {
        (broker.metric("mmmq_http_inflight_body_bytes").await == (63 << 20) as f64).then_some(())
    })
    .await;
    // 1 MiB of the budget is left: a 2 MiB batch is refused before its body is read, a small
    // produce goes through.
    let batch: Vec<Value> = (0..22)
        .map(|i| json!({"topic": "t", "content": {"i": i, "pad": "p".repeat(95_000)}}))
        .collect();
    let text = Value::from(batch.clone()).to_string();
    let json = Some("application/json");
    let (status, headers, body) = broker
        .send("POST", "/mmmq/messages/batch", &[], Some((&text, json)))
        .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(headers["retry-after"], "1");
    assert!(
        error_of(&body).contains("--max-inflight-body-bytes"),
        "{body}"
    );
    assert_eq!(
        broker.metric("mmmq_http_body_budget_refusals_total").await,
        1.0
    );
    broker.produce("t", json!("fits")).await;
    // The upload completes: read back from disk and refused as not a component; the budget is free.
    upload.write_all(&mib).await.unwrap();
    let (answer, _) = read_to_close(&mut upload, Duration::from_secs(30)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert_eq!(broker.metric("mmmq_http_inflight_body_bytes").await, 0.0);
    let (status, body) = broker.post("/mmmq/messages/batch", &json!(batch)).await;
    assert_eq!(status, 200, "{body}");
    // Too large is 413, for a component and for one element of a batch.
    let (status, body) = broker.deploy_wasm("big", vec![0u8; (64 << 20) + 1]).await;
    assert_eq!(status, 413, "{body}");
    let big = json!([{"topic": "t", "content": "x".repeat(100_001)}]);
    let (status, body) = broker.post("/mmmq/messages/batch", &big).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(
        broker.pull_all("t").await.len(),
        24,
        "warm-up, fits, the batch"
    );
}

/// Bytes of the broker's plugin uploads being staged: the size of an open file under
/// `plugins/.uploads/` (`/proc/PID/fd`).
fn staged_upload_bytes(pid: u32) -> Option<u64> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .filter_map(|e| {
            let path = e.ok()?.path();
            let target = std::fs::read_link(&path).ok()?;
            target
                .to_string_lossy()
                .contains("/plugins/.uploads/")
                .then(|| std::fs::metadata(&path).ok().map(|m| m.len()))
                .flatten()
        })
        .max()
}

/// A connection that sends nothing is closed after `--first-byte-timeout-ms`, not the header
/// timeout; one client address holds at most `--max-connections-per-ip` connections, past which
/// it gets a `503` naming the limit, while other addresses are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_close_quickly_and_one_address_cannot_take_every_slot() {
    let tmp = tempfile::tempdir().unwrap();
    let args = [
        "--max-connections-per-ip",
        "3",
        "--first-byte-timeout-ms",
        "300",
    ];
    let broker = Broker::start_with(tmp.path(), &args).await;
    let addr = broker.addr();
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(connect_from("127.0.0.2", addr).await);
    }
    for s in &mut silent {
        // The header timeout (10 s) is well past this wait.
        let (got, closed) = read_to_close(s, Duration::from_secs(5)).await;
        assert!(closed && got.is_empty(), "{got:?}");
    }
    assert_eq!(
        broker
            .metric("mmmq_http_connections_silent_closed_total")
            .await,
        3.0
    );
    // Three requests from 127.0.0.3 under way take its share; a fourth is refused.
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut s = connect_from("127.0.0.3", addr).await;
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .await
            .unwrap();
        held.push(s);
    }
    let mut fourth = connect_from("127.0.0.3", addr).await;
    fourth
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let (got, closed) = read_to_close(&mut fourth, Duration::from_secs(5)).await;
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 503"), "{got}");
    assert!(got.contains("--max-connections-per-ip"), "{got}");
    assert!(closed);
    assert_eq!(
        broker.get("/healthz").await.0,
        200,
        "another address is served"
    );
    assert_eq!(
        broker.metric("mmmq_http_connections_refused_total").await,
        1.0
    );
    // One of the three finishes and leaves: the address gets its slot back.
    let mut first = held.remove(0);
    first.write_all(b"Connection: close\r\n\r\n").await.unwrap();
    let (got, _) = read_to_close(&mut first, Duration::from_secs(5)).await;
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    eventually_async(
        Duration::from_secs(10),
        "a slot for 127.0.0.3 again",
        || async {
            let mut s = connect_from("127.0.0.3", addr).await;
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .await
                .ok()?;
            let (got, _) = read_to_close(&mut s, Duration::from_secs(5)).await;
            String::from_utf8_lossy(&got)
                .starts_with("HTTP/1.1 200")
                .then_some(())
        },
    )
    .await;
}

/// A connection past `--max-connections-per-ip` is answered `503` at once, before it sends a byte,
/// and holds none of the `--max-connections` slots: one address that keeps its share busy with
/// connections that sent one byte and went silent, and opens more than the broker's whole cap of
/// connections on top, leaves another address served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_answered_at_once_and_holds_no_slot() {
    let tmp = tempfile::tempdir().unwrap();
    let args = ["--max-connections", "5", "--max-connections-per-ip", "2"];
    let broker = Broker::start_with(tmp.path(), &args).await;
    let addr = broker.addr();
    let mut share = Vec::new();
    for _ in 0..2 {
        let mut s = connect_from("127.0.0.2", addr).await;
        s.write_all(b"G").await.unwrap();
        share.push(s);
    }
    // More refused connections than the broker has slots, all kept open by the client.
    let mut refused = Vec::new();
    for _ in 0..6 {
        let mut s = connect_from("127.0.0.2", addr).await;
        // Well under the first-byte (2 s) and header (10 s) timeouts.
        let (got, closed) = read_to_close(&mut s, Duration::from_secs(1)).await;
        let got = String::from_utf8_lossy(&got);
        assert!(closed, "{got}");
        let (head, body) = got.split_once("\r\n\r\n").expect("a whole response");
        assert!(
            head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{head}"
        );
        let head = format!("{}\r\n", head.to_ascii_lowercase());
        assert!(head.contains("\r\nconnection: close\r\n"), "{head}");
        assert!(head.contains("\r\nretry-after: 1\r\n"), "{head}");
        assert!(
            head.contains("\r\ncontent-type: application/json\r\n"),
            "{head}"
        );
        let body: Value = serde_json::from_str(body).unwrap();
        assert!(
            error_of(&body).contains("--max-connections-per-ip"),
            "{body}"
        );
        refused.push(s);
    }
    assert_eq!(
        broker.metric("mmmq_http_connections_refused_total").await,
        6.0
    );
    // Two requests from another address under way at once, while 127.0.0.2 holds its two.
    let mut other = Vec::new();
    for _ in 0..2 {
        let mut s = connect_from("127.0.0.3", addr).await;
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .await
            .unwrap();
        other.push(s);
    }
    for s in &mut other {
        s.write_all(b"Connection: close\r\n\r\n").await.unwrap();
        let (got, closed) = read_to_close(s, Duration::from_secs(5)).await;
        let got = String::from_utf8_lossy(&got);
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        assert!(closed);
    }
    drop(share);
}

/// The body budget is taken as bytes arrive, not on the declared `Content-Length`: a request that
/// declares the whole budget and sends nothing holds none of it, so others' bodies go through;
/// what it sends is counted, and given back when the body stalls for the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_body_that_does_not_arrive_holds_no_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let args = [
        "--max-inflight-body-bytes",
        "67108864",
        "--header-timeout-ms",
        "2000",
    ];
    let broker = Broker::start_with(tmp.path(), &args).await;
    let mut upload = tokio::net::TcpStream::connect(broker.addr()).await.unwrap();
    upload
        .write_all(
            b"PUT /mmmq/plugins/x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/wasm\r\nContent-Length: 67108864\r\n\r\n",
        )
        .await
        .unwrap();
    // The handler has the request once its staging file is open.
    let pid = broker.pid();
    eventually_async(
        Duration::from_secs(10),
        "the upload's staging file",
        || async { staged_upload_bytes(pid) },
    )
    .await;
    let (status, _, body) = broker
        .send(
            "POST",
            "/mmmq/messages",
            &[],
            Some((MESSAGE, Some("application/json"))),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(broker.metric("mmmq_http_inflight_body_bytes").await, 0.0);
    upload.write_all(&vec![0u8; 1 << 20]).await.unwrap();
    eventually_async(
        Duration::from_secs(10),
        "the upload's first MiB counted",
        || async {
            (broker.metric("mmmq_http_inflight_body_bytes").await == (1 << 20) as f64).then_some(())
        },
    )
    .await;
    // Then it stops: cut off after the header timeout, not the request deadline.
    let (got, _) = read_to_close(&mut upload, Duration::from_secs(10)).await;
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("--header-timeout-ms"), "{got}");
    eventually_async(Duration::from_secs(10), "the budget given back", || async {
        (broker.metric("mmmq_http_inflight_body_bytes").await == 0.0).then_some(())
    })
    .await;
}
