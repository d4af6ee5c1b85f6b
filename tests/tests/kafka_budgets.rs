//! The Kafka listener within the budgets HTTP has (docs/kafka.md, "Connections"): connections
//! per address, time to the first request and to a login, ApiVersions not counted as activity,
//! frame bytes in flight, and SASL as Kafka's broker does it (a handshake first, a failed login
//! answered late). A real `mmmq serve`, raw Kafka frames from the `kafka-protocol` crate.

use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse,
    SaslAuthenticateRequest, SaslAuthenticateResponse,
};
use mmmq_tests::Broker;
use mmmq_tests::kafka_wire::{Conn, request_frame};
use tokio::io::AsyncWriteExt;

async fn kafka_broker(root: &std::path::Path, args: &[&str]) -> (Broker, String) {
    let kafka = format!("127.0.0.1:{}", mmmq_tests::free_port());
    let mut all = vec!["--kafka-listen", kafka.as_str()];
    all.extend_from_slice(args);
    (Broker::start_with(root, &all).await, kafka)
}

async fn api_versions(c: &mut Conn) {
    let a: ApiVersionsResponse = c
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    assert_eq!(a.error_code, 0);
}

/// A Metadata request's frame (without its size).
fn metadata_frame() -> BytesMut {
    request_frame(ApiKey::Metadata, 9, &MetadataRequest::default())
}

/// An ApiVersions request with its size, as sent.
fn api_versions_sized() -> BytesMut {
    let f = request_frame(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default());
    let mut out = BytesMut::new();
    out.put_i32(f.len() as i32);
    out.put_slice(&f);
    out
}

/// A connection without a whole request for `--kafka-idle-ms` is closed, as Kafka closes it
/// (`connections.max.idle.ms`): one that never sends, one that starts a frame and stalls, and
/// one that only asks ApiVersions (before, each ApiVersions reset the limit: a client could hold
/// a connection forever on the one request that does nothing); one that keeps asking Metadata
/// stays open however long it lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_stalled_and_api_versions_only_connections_are_closed() {
    let tmp = tempfile::tempdir().unwrap();
    let (_broker, kafka) = kafka_broker(tmp.path(), &["--kafka-idle-ms", "400"]).await;
    let started = Instant::now();
    let mut silent = Conn::open(&kafka).await;
    api_versions(&mut silent).await;
    let mut stalled = Conn::open(&kafka).await;
    api_versions(&mut stalled).await;
    stalled
        .stream
        .write_all(&100i32.to_be_bytes())
        .await
        .unwrap();
    stalled.stream.write_all(&[0u8; 10]).await.unwrap();
    let mut versions_only = Conn::open(&kafka).await;
    let mut busy = Conn::open(&kafka).await;
    // Busy for three idle limits: a Metadata every 100 ms keeps it open.
    let mut versions_closed = None;
    while started.elapsed() < Duration::from_millis(1200) {
        let _: MetadataResponse = busy
            .call(ApiKey::Metadata, 9, &MetadataRequest::default())
            .await;
        if versions_closed.is_none() {
            let sent = versions_only.stream.write_all(&api_versions_sized()).await;
            if sent.is_err() || versions_only.read_frame().await.is_none() {
                versions_closed = Some(started.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(silent.read_frame().await.is_none(), "a silent connection");
    assert!(stalled.read_frame().await.is_none(), "a stalled frame");
    let closed = versions_closed.expect("a connection asking only ApiVersions is closed");
    assert!(
        closed < Duration::from_millis(1000),
        "closed after {closed:?}"
    );
    let _: MetadataResponse = busy
        .call(ApiKey::Metadata, 9, &MetadataRequest::default())
        .await;
}

/// At most `--max-connections-per-ip` connections from one address, as over HTTP: the next is
/// closed at once and counted; a place freed is taken again. A new connection has
/// `--first-byte-timeout-ms` for its first request (Kafka's idle limit is 10 minutes: a socket
/// opened and left silent held a slot that long).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_address_and_the_first_request_are_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let (broker, kafka) = kafka_broker(
        tmp.path(),
        &[
            "--max-connections-per-ip",
            "2",
            "--first-byte-timeout-ms",
            "300",
        ],
    )
    .await;
    let mut one = Conn::open(&kafka).await;
    api_versions(&mut one).await;
    let mut two = Conn::open(&kafka).await;
    api_versions(&mut two).await;
    let mut three = Conn::open(&kafka).await;
    assert!(three.read_frame().await.is_none(), "closed at once");
    assert_eq!(
        broker.metric("mmmq_kafka_connections_refused_total").await,
        1.0
    );
    drop(one);
    let mut again = None;
    for _ in 0..100 {
        let mut c = Conn::open(&kafka).await;
        c.send_raw(&metadata_frame()).await;
        if c.read_frame().await.is_some() {
            again = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(again.is_some(), "the freed place is taken again");
    drop(again);
    drop(two);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let opened = Instant::now();
    let mut silent = Conn::open(&kafka).await;
    assert!(silent.read_frame().await.is_none());
    let waited = opened.elapsed();
    assert!(
        (Duration::from_millis(250)..Duration::from_secs(3)).contains(&waited),
        "a silent connection closed after {waited:?}"
    );
    assert!(
        broker
            .get_text("/metrics")
            .await
            .contains("mmmq_kafka_connections_closed_total{reason=\"timeout\"} 1"),
        "counted"
    );
}

/// Frame bytes in flight share one budget (`--max-inflight-body-bytes`): a frame waits for room,
/// unread, while another holds it (a frame's size that arrived with nothing after it holds its
/// share until it stalls out), then is answered. Before, every frame was given its whole buffer
/// when its size arrived, however many did so at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_in_flight_share_one_budget() {
    let tmp = tempfile::tempdir().unwrap();
    // A 64 MiB budget, the least it may be, and a produce may be as large (32 × 2 MiB).
    let budget: i32 = 64 << 20;
    let (_broker, kafka) = kafka_broker(
        tmp.path(),
        &[
            "--max-inflight-body-bytes",
            &budget.to_string(),
            "--max-body-bytes",
            &(2 << 20).to_string(),
            "--header-timeout-ms",
            "1500",
        ],
    )
    .await;
    // The whole budget, claimed by a produce's frame that never comes.
    let mut hog = Conn::open(&kafka).await;
    api_versions(&mut hog).await;
    hog.stream.write_all(&budget.to_be_bytes()).await.unwrap();
    hog.stream
        .write_all(&(ApiKey::Produce as i16).to_be_bytes())
        .await
        .unwrap();
    hog.stream.write_all(&[0u8; 4]).await.unwrap();
    // The waiting frame must come after the hog's last byte: its own wait for room is as long
    // as the hog's stall.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let asked = Instant::now();
    let mut waiting = Conn::open(&kafka).await;
    waiting.send_raw(&metadata_frame()).await;
    let answer = waiting.read_frame().await;
    let waited = asked.elapsed();
    assert!(answer.is_some(), "answered once the budget has room");
    assert!(
        waited > Duration::from_millis(600),
        "it waited for the stalled frame's share: {waited:?}"
    );
    assert!(hog.read_frame().await.is_none(), "the stalled frame closed");
}

/// With `--auth-token`: a login within `--header-timeout-ms` of the connect, however many
/// ApiVersions come meanwhile (before, ApiVersions kept an unauthenticated connection open
/// forever); SaslAuthenticate without a SaslHandshake is `ILLEGAL_SASL_STATE` and closed, as
/// Kafka's broker answers; a wrong password is answered after a second, and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_comes_in_time_after_a_handshake_and_a_failure_is_slow() {
    let tmp = tempfile::tempdir().unwrap();
    let (broker, kafka) = kafka_broker(
        tmp.path(),
        &["--auth-token", "s3cret", "--header-timeout-ms", "700"],
    )
    .await;
    let mut lingering = Conn::open(&kafka).await;
    let opened = Instant::now();
    let mut closed = false;
    while opened.elapsed() < Duration::from_secs(3) {
        let out = api_versions_sized();
        if lingering.stream.write_all(&out).await.is_err() || lingering.read_frame().await.is_none()
        {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(closed, "an unauthenticated connection lived on ApiVersions");
    assert!(opened.elapsed() < Duration::from_millis(2000));

    // Nor on a frame that trickles in a byte at a time, each within the stall limit.
    let mut trickling = Conn::open(&kafka).await;
    let opened = Instant::now();
    trickling
        .stream
        .write_all(&1000i32.to_be_bytes())
        .await
        .unwrap();
    let mut cut = false;
    while opened.elapsed() < Duration::from_secs(4) {
        if trickling.stream.write_all(&[0]).await.is_err() {
            cut = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(cut || trickling.read_frame().await.is_none());
    assert!(
        cut && opened.elapsed() < Duration::from_millis(2500),
        "a trickling frame before a login lived {:?}",
        opened.elapsed()
    );

    let mut no_handshake = Conn::open(&kafka).await;
    let a: SaslAuthenticateResponse = no_handshake
        .call(
            ApiKey::SaslAuthenticate,
            2,
            &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from("\0u\0s3cret")),
        )
        .await;
    assert_eq!(a.error_code, 34, "ILLEGAL_SASL_STATE");
    assert!(no_handshake.read_frame().await.is_none(), "then closed");

    let login = |password: &'static str| {
        let kafka = kafka.clone();
        async move { mmmq_tests::kafka_wire::sasl_plain(&kafka, password).await }
    };
    let (mut c, code, took) = login("wrong").await;
    assert_eq!(code, 58);
    assert!(
        took >= Duration::from_millis(950),
        "answered after {took:?}"
    );
    assert!(c.read_frame().await.is_none());
    let metrics = broker
        .http
        .get(format!("{}/metrics", broker.url))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("mmmq_auth_failures_total{listener=\"kafka\",mechanism=\"PLAIN\"} 1"),
        "counted: {metrics}"
    );
    let (mut c, code, took) = login("s3cret").await;
    assert_eq!(code, 0);
    assert!(
        took < Duration::from_millis(500),
        "a right one at once: {took:?}"
    );
    let m: MetadataResponse = c
        .call(ApiKey::Metadata, 9, &MetadataRequest::default())
        .await;
    assert_eq!(m.brokers.len(), 1);
}
