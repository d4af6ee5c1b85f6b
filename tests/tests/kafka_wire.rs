//! Kafka's protocol byte by byte (docs/kafka.md): a client made of the `kafka-protocol` crate
//! sends what a real client's retry or a broken client sends, exactly when the test says.
//! - An idempotent producer's batch sent again after a SIGKILL and restart of the broker is
//!   answered with its first copy's offset and stored once; a gap in sequences is refused.
//! - Bad input: malformed frames, wrong sizes, unknown APIs and versions close that connection
//!   only; nothing is stored and the broker serves on.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, InitProducerIdRequest, InitProducerIdResponse,
    ProduceRequest, ProduceResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use mmmq_tests::Broker;
use mmmq_tests::kafka_wire::Conn;
use serde_json::json;
use tokio::io::AsyncWriteExt;

/// One record batch of `values` from producer `(id, epoch)` starting at `sequence`.
fn batch(id: i64, epoch: i16, sequence: i32, values: &[&str]) -> Bytes {
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: id,
            producer_epoch: epoch,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: sequence + i as i32,
            timestamp: 1_700_000_000_000,
            key: None,
            value: Some(Bytes::copy_from_slice(v.as_bytes())),
            headers: Default::default(),
        })
        .collect();
    let mut out = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut out,
        records.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .unwrap();
    out.freeze()
}

fn produce(topic: &str, records: Bytes) -> ProduceRequest {
    ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
                .with_partition_data(vec![
                    PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(records)),
                ]),
        ])
}

/// `(error code, base offset)` of the one partition a produce named.
fn outcome(r: &ProduceResponse) -> (i16, i64) {
    let p = &r.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

async fn kafka_broker(root: &std::path::Path, kafka: &str) -> Broker {
    Broker::start_with(root, &["--kafka-listen", kafka]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_idempotent_batch_is_stored_once_across_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", mmmq_tests::free_port());
    let broker = kafka_broker(tmp.path(), &kafka).await;
    broker.produce("idem", json!("before")).await;
    let mut c = Conn::open(&kafka).await;
    let init: InitProducerIdResponse = c
        .call(
            ApiKey::InitProducerId,
            4,
            &InitProducerIdRequest::default()
                .with_transactional_id(None)
                .with_transaction_timeout_ms(60_000)
                .with_producer_id((-1).into())
                .with_producer_epoch(-1),
        )
        .await;
    assert_eq!(init.error_code, 0);
    let (id, epoch) = (init.producer_id.0, init.producer_epoch);
    let first = batch(id, epoch, 0, &["a", "b", "c"]);
    let r: ProduceResponse = c
        .call(ApiKey::Produce, 9, &produce("idem", first.clone()))
        .await;
    assert_eq!(outcome(&r), (0, 1));
    // Sent again on the same broker: its first copy's offset, nothing stored.
    let r: ProduceResponse = c
        .call(ApiKey::Produce, 9, &produce("idem", first.clone()))
        .await;
    assert_eq!(outcome(&r), (0, 1));
    broker.produce("idem", json!("between")).await;
    // The broker dies; the retry comes to the new one, whose state is read back from the log.
    broker.kill();
    let broker = kafka_broker(tmp.path(), &kafka).await;
    let mut c = Conn::open(&kafka).await;
    let r: ProduceResponse = c.call(ApiKey::Produce, 9, &produce("idem", first)).await;
    assert_eq!(outcome(&r), (0, 1), "a retry after the restart");
    // The next batch is stored; a gap is refused (OUT_OF_ORDER_SEQUENCE_NUMBER, 45).
    let r: ProduceResponse = c
        .call(
            ApiKey::Produce,
            9,
            &produce("idem", batch(id, epoch, 3, &["d"])),
        )
        .await;
    assert_eq!(outcome(&r), (0, 5));
    let r: ProduceResponse = c
        .call(
            ApiKey::Produce,
            9,
            &produce("idem", batch(id, epoch, 7, &["x"])),
        )
        .await;
    assert_eq!(outcome(&r).0, 45);
    let stored: Vec<String> = broker
        .pull_all("idem")
        .await
        .iter()
        .map(|m| {
            m.get("contentBase64")
                .map_or_else(|| m["content"].to_string(), |b| b.to_string())
        })
        .collect();
    assert_eq!(
        stored,
        [
            "\"before\"",
            "\"YQ==\"",
            "\"Yg==\"",
            "\"Yw==\"",
            "\"between\"",
            "\"ZA==\""
        ],
    );
}

/// Each broken frame closes its connection, stores nothing, and the broker answers the next
/// client as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_frames_close_their_connection_only() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", mmmq_tests::free_port());
    let broker = kafka_broker(tmp.path(), &kafka).await;
    broker.produce("safe", json!(1)).await;
    let good_produce = {
        let mut frame = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(ApiKey::Produce as i16)
            .with_request_api_version(9)
            .with_correlation_id(1)
            .encode(&mut frame, ApiKey::Produce.request_header_version(9))
            .unwrap();
        produce("safe", batch(-1, -1, -1, &["x", "y"]))
            .encode(&mut frame, 9)
            .unwrap();
        frame.freeze()
    };
    let mut flipped = good_produce.to_vec();
    // The last record's value `y`: the batch's CRC no longer matches.
    let at = flipped.iter().rposition(|b| *b == b'y').unwrap();
    flipped[at] ^= 0x40;
    let broken: Vec<(&str, Vec<u8>)> = vec![
        ("a frame shorter than a header", vec![0, 18]),
        (
            "an unknown API key",
            vec![0x7f, 0x7f, 0, 0, 0, 0, 0, 1, 0, 0],
        ),
        ("a version not spoken", {
            let mut f = good_produce.to_vec();
            f[2..4].copy_from_slice(&42i16.to_be_bytes());
            f
        }),
        (
            "a body cut short",
            good_produce[..good_produce.len() - 7].to_vec(),
        ),
        (
            "bytes after a produce's body",
            [&good_produce[..], b"junk"].concat(),
        ),
    ];
    for (what, frame) in broken {
        let mut c = Conn::open(&kafka).await;
        c.send_raw(&frame).await;
        assert!(
            c.read_frame().await.is_none(),
            "{what}: the connection closes"
        );
    }
    // A frame larger than the limit (32 × --max-body-bytes): closed before it is read.
    let mut c = Conn::open(&kafka).await;
    c.stream
        .write_all(&(1i32 << 30).to_be_bytes())
        .await
        .unwrap();
    assert!(c.read_frame().await.is_none(), "an oversized frame");
    // A negative size.
    let mut c = Conn::open(&kafka).await;
    c.stream.write_all(&(-5i32).to_be_bytes()).await.unwrap();
    assert!(c.read_frame().await.is_none(), "a negative size");
    // A batch that fails its CRC, and one whose CRC is right but whose record count says two
    // billion (decoding must not reserve room for them: the broker would abort), are refused
    // with CORRUPT_MESSAGE (2) on a live connection.
    let huge_count = {
        let mut f = good_produce.to_vec();
        let batch_at = f.len() - batch(-1, -1, -1, &["x", "y"]).len();
        f[batch_at + 57..batch_at + 61].copy_from_slice(&i32::MAX.to_be_bytes());
        let crc = crc32c::crc32c(&f[batch_at + 21..]);
        f[batch_at + 17..batch_at + 21].copy_from_slice(&crc.to_be_bytes());
        f
    };
    for frame in [flipped, huge_count] {
        let mut c = Conn::open(&kafka).await;
        c.send_raw(&frame).await;
        let mut answer = c.read_frame().await.expect("an answer");
        ResponseHeader::decode(&mut answer, ApiKey::Produce.response_header_version(9)).unwrap();
        let r = ProduceResponse::decode(&mut answer, 9).unwrap();
        assert_eq!(outcome(&r).0, 2);
        assert!(!answer.has_remaining());
    }
    // Nothing was stored, and the broker answers as before.
    assert_eq!(broker.pull_all("safe").await.len(), 1);
    let mut c = Conn::open(&kafka).await;
    let v: ApiVersionsResponse = c
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    assert_eq!(v.error_code, 0);
    assert!(
        v.api_keys
            .iter()
            .any(|k| k.api_key == ApiKey::Produce as i16)
    );
    let r: ProduceResponse = c
        .call(
            ApiKey::Produce,
            9,
            &produce("safe", batch(-1, -1, -1, &["z"])),
        )
        .await;
    assert_eq!(outcome(&r), (0, 1));
    // Only a produce may be larger than --max-body-bytes (1 MiB here): a 2 MiB Metadata
    // request is closed at its API key, before its body is read; a 1.4 MB produce is taken.
    let mut c = Conn::open(&kafka).await;
    let mut head = BytesMut::new();
    head.put_i32(2 << 20);
    head.put_i16(ApiKey::Metadata as i16);
    c.stream.write_all(&head).await.unwrap();
    assert!(c.read_frame().await.is_none(), "a 2 MiB metadata request");
    let (status, _) = broker.put("/mmmq/topics/big", &json!({})).await;
    assert_eq!(status, 200);
    let (a, b) = ("a".repeat(700_000), "b".repeat(700_000));
    let mut c = Conn::open(&kafka).await;
    let r: ProduceResponse = c
        .call(
            ApiKey::Produce,
            9,
            &produce("big", batch(-1, -1, -1, &[&a, &b])),
        )
        .await;
    assert_eq!(outcome(&r), (0, 0));
}

/// ApiVersions at a version the broker does not speak is answered at v0 with
/// UNSUPPORTED_VERSION and its own range (KIP-511), so a newer client can retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_api_versions_is_told_the_range() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", mmmq_tests::free_port());
    let _broker = kafka_broker(tmp.path(), &kafka).await;
    let mut c = Conn::open(&kafka).await;
    let mut frame = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(ApiKey::ApiVersions as i16)
        .with_request_api_version(99)
        .with_correlation_id(7)
        .encode(&mut frame, 2)
        .unwrap();
    frame.put_slice(&[0, 0, 0]); // a flexible body the broker need not read
    c.send_raw(&frame).await;
    let mut answer = c.read_frame().await.expect("an answer");
    let header = ResponseHeader::decode(&mut answer, 0).unwrap();
    assert_eq!(header.correlation_id, 7);
    let v = ApiVersionsResponse::decode(&mut answer, 0).unwrap();
    assert_eq!(v.error_code, 35);
    assert_eq!(v.api_keys.len(), 1);
    assert_eq!(v.api_keys[0].api_key, ApiKey::ApiVersions as i16);
}

/// A produce with `acks=0` gets no answer, yet the answers before it are not held back; the
/// broker's clock, not the producer's create time, is the message's timestamp (what retention
/// reads: an old create time must not expire fresh data).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_zero_holds_nothing_back_and_time_is_the_brokers() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", mmmq_tests::free_port());
    let broker = kafka_broker(tmp.path(), &kafka).await;
    let (status, body) = broker.put("/mmmq/topics/fire", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let frame = |key: ApiKey, version: i16, correlation: i32, body: &dyn Fn(&mut BytesMut)| {
        let mut f = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(correlation)
            .encode(&mut f, key.request_header_version(version))
            .unwrap();
        body(&mut f);
        let mut out = BytesMut::new();
        out.put_i32(f.len() as i32);
        out.put_slice(&f);
        out
    };
    let versions = frame(ApiKey::ApiVersions, 3, 1, &|f| {
        ApiVersionsRequest::default().encode(f, 3).unwrap()
    });
    let fire = frame(ApiKey::Produce, 9, 2, &|f| {
        produce("fire", batch(-1, -1, -1, &["x"]))
            .with_acks(0)
            .encode(f, 9)
            .unwrap()
    });
    let mut c = Conn::open(&kafka).await;
    c.stream
        .write_all(&[&versions[..], &fire[..]].concat())
        .await
        .unwrap();
    let mut answer = c
        .read_frame()
        .await
        .expect("the ApiVersions answer, not held back");
    let header = ResponseHeader::decode(&mut answer, 0).unwrap();
    assert_eq!(header.correlation_id, 1);
    let stored = mmmq_tests::eventually_async(Duration::from_secs(10), "the record", || async {
        broker.pull_all("fire").await.into_iter().next()
    })
    .await;
    // The batch's create time is 2023's; the message's time is now.
    let at = stored["timestamp"].as_u64().unwrap();
    assert!(at > 1_700_000_000_000 + 86_400_000, "{stored}");
}

/// With `--auth-token`, SASL/PLAIN with the token as password comes first: any other request
/// closes the connection, as does a frame over 512 KiB; a wrong password is answered with
/// SASL_AUTHENTICATION_FAILED (58) and the connection closed; the right one opens the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_plain_with_the_auth_token_comes_first() {
    use kafka_protocol::messages::{MetadataRequest, MetadataResponse};
    let tmp = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", mmmq_tests::free_port());
    let _broker = Broker::start_with(
        tmp.path(),
        &["--kafka-listen", &kafka, "--auth-token", "s3cret"],
    )
    .await;
    let login = |password: &'static str| {
        let kafka = kafka.clone();
        async move {
            let (c, code, _) = mmmq_tests::kafka_wire::sasl_plain(&kafka, password).await;
            (c, code)
        }
    };
    // Nothing else before the login.
    let mut c = Conn::open(&kafka).await;
    let mut f = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(ApiKey::Metadata as i16)
        .with_request_api_version(9)
        .with_correlation_id(1)
        .encode(&mut f, ApiKey::Metadata.request_header_version(9))
        .unwrap();
    MetadataRequest::default().encode(&mut f, 9).unwrap();
    c.send_raw(&f).await;
    assert!(c.read_frame().await.is_none(), "metadata before a login");
    let mut c = Conn::open(&kafka).await;
    c.stream
        .write_all(&(1i32 << 20).to_be_bytes())
        .await
        .unwrap();
    assert!(
        c.read_frame().await.is_none(),
        "a 1 MiB frame before a login"
    );
    // A wrong password: told, then closed.
    let (mut c, code) = login("wrong").await;
    assert_eq!(code, 58);
    assert!(
        c.read_frame().await.is_none(),
        "closed after a failed login"
    );
    // The token: the rest is open.
    let (mut c, code) = login("s3cret").await;
    assert_eq!(code, 0);
    let m: MetadataResponse = c
        .call(ApiKey::Metadata, 9, &MetadataRequest::default())
        .await;
    assert_eq!(m.brokers.len(), 1);
    let r: ProduceResponse = c
        .call(
            ApiKey::Produce,
            9,
            &produce("authed", batch(-1, -1, -1, &["x"])),
        )
        .await;
    assert_eq!(
        outcome(&r).0,
        3,
        "an unknown topic (Metadata creates topics, produce does not)"
    );
    // SaslHandshake v0: the next frame is the bare PLAIN token, answered with an empty frame
    // when it is right; a wrong one closes the connection.
    for (password, ok) in [("s3cret", true), ("wrong", false)] {
        let mut c = Conn::open(&kafka).await;
        c.sasl_handshake(0).await;
        c.send_raw(format!("\0user\0{password}").as_bytes()).await;
        let answer = c.read_frame().await;
        if !ok {
            assert!(answer.is_none(), "a wrong raw token closes the connection");
            continue;
        }
        assert_eq!(answer.as_deref(), Some(&b""[..]), "an empty server token");
        let m: MetadataResponse = c
            .call(ApiKey::Metadata, 9, &MetadataRequest::default())
            .await;
        assert_eq!(m.brokers.len(), 1);
    }
}

/// CreateTopics, DescribeConfigs and DeleteTopics act on the topics HTTP sees: partitions and
/// retention as configured, a second create refused (TOPIC_ALREADY_EXISTS, 36), an unknown
/// config refused (INVALID_CONFIG, 40), a delete seen by HTTP, a second delete refused (3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_admin_over_kafka_is_the_topics_of_http() {
    use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
    use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
    use kafka_protocol::messages::{
        CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse,
        DescribeConfigsRequest, DescribeConfigsResponse,
    };
    let tmp = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", mmmq_tests::free_port());
    let broker = kafka_broker(tmp.path(), &kafka).await;
    let mut c = Conn::open(&kafka).await;
    let topic = |name: &str, config: (&'static str, &'static str)| {
        CreatableTopic::default()
            .with_name(TopicName(StrBytes::from_string(name.to_owned())))
            .with_num_partitions(3)
            .with_replication_factor(-1)
            .with_configs(vec![
                CreatableTopicConfig::default()
                    .with_name(StrBytes::from_static_str(config.0))
                    .with_value(Some(StrBytes::from_static_str(config.1))),
            ])
    };
    let create = |topics| {
        CreateTopicsRequest::default()
            .with_topics(topics)
            .with_timeout_ms(5000)
    };
    let r: CreateTopicsResponse = c
        .call(
            ApiKey::CreateTopics,
            5,
            &create(vec![
                topic("made", ("retention.ms", "3600000")),
                topic("odd", ("compression.type", "zstd")),
            ]),
        )
        .await;
    let codes: Vec<i16> = r.topics.iter().map(|t| t.error_code).collect();
    assert_eq!(codes, [0, 40]);
    let (status, detail) = broker.get("/mmmq/topics/made").await;
    assert_eq!(status, 200, "{detail}");
    assert_eq!(detail["config"]["partitions"], 3, "{detail}");
    assert_eq!(detail["config"]["retentionMs"], 3_600_000, "{detail}");
    assert_eq!(broker.get("/mmmq/topics/odd").await.0, 404);
    let again: CreateTopicsResponse = c
        .call(
            ApiKey::CreateTopics,
            5,
            &create(vec![topic("made", ("retention.ms", "1"))]),
        )
        .await;
    assert_eq!(again.topics[0].error_code, 36);
    let d: DescribeConfigsResponse = c
        .call(
            ApiKey::DescribeConfigs,
            4,
            &DescribeConfigsRequest::default().with_resources(vec![
                DescribeConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(StrBytes::from_static_str("made")),
            ]),
        )
        .await;
    let retention = d.results[0]
        .configs
        .iter()
        .find(|c| c.name.as_str() == "retention.ms")
        .and_then(|c| c.value.as_ref().map(|v| v.as_str().to_owned()));
    assert_eq!(retention.as_deref(), Some("3600000"));
    let delete = DeleteTopicsRequest::default()
        .with_topic_names(vec![TopicName(StrBytes::from_static_str("made"))])
        .with_timeout_ms(5000);
    let r: DeleteTopicsResponse = c.call(ApiKey::DeleteTopics, 5, &delete).await;
    assert_eq!(r.responses[0].error_code, 0);
    assert_eq!(broker.get("/mmmq/topics/made").await.0, 404);
    let r: DeleteTopicsResponse = c.call(ApiKey::DeleteTopics, 5, &delete).await;
    assert_eq!(r.responses[0].error_code, 3);
}

/// A produce's compressed batches expand, all of them together, into no more than the frame
/// limit (32 × `--max-body-bytes`): a request of many partitions, each batch a small
/// decompression bomb under the limit alone, is not held in memory whole. The batches past
/// the budget are refused (`MESSAGE_TOO_LARGE`) and store nothing; the ones before it are
/// stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requests_compressed_batches_share_one_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", mmmq_tests::free_port());
    // A frame limit of 2 MiB.
    let broker = Broker::start_with(
        tmp.path(),
        &["--kafka-listen", &kafka, "--max-body-bytes", "65536"],
    )
    .await;
    let (status, t) = broker
        .put("/mmmq/topics/bombs", &json!({"partitions": 3}))
        .await;
    assert_eq!(status, 200, "{t}");
    // 18 records of 60,000 bytes of one byte each (a record may be 64 KiB here): about 1 MiB
    // that gzips to a few kilobytes.
    let bomb = {
        let records: Vec<Record> = (0..18)
            .map(|i| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: -1,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset: i,
                sequence: i as i32,
                timestamp: 1_700_000_000_000,
                key: None,
                value: Some(Bytes::from(vec![b'a'; 60_000])),
                headers: Default::default(),
            })
            .collect();
        let mut out = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut out,
            records.iter(),
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::Gzip,
            },
        )
        .unwrap();
        out.freeze()
    };
    assert!(bomb.len() < 16 * 1024, "{} bytes", bomb.len());
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_static_str("bombs")))
                .with_partition_data(
                    (0..3)
                        .map(|p| {
                            PartitionProduceData::default()
                                .with_index(p)
                                .with_records(Some(bomb.clone()))
                        })
                        .collect(),
                ),
        ]);
    let mut c = Conn::open(&kafka).await;
    let r: ProduceResponse = c.call(ApiKey::Produce, 9, &request).await;
    let codes: Vec<i16> = r.responses[0]
        .partition_responses
        .iter()
        .map(|p| p.error_code)
        .collect();
    assert_eq!(codes, [0, 10, 10], "{r:?}");
    let (_, detail) = broker.get("/mmmq/topics/bombs").await;
    let stored: Vec<u64> = detail["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["nextOffset"].as_u64().unwrap())
        .collect();
    assert_eq!(stored, [18, 0, 0], "{detail}");
    // The connection serves on: the next request's budget is whole again.
    let r: ProduceResponse = c.call(ApiKey::Produce, 9, &produce("bombs", bomb)).await;
    assert_eq!(outcome(&r), (0, 18));
}

/// A fetch's `max_bytes` bounds the whole answer, as Kafka's: only the first partition with
/// records may go past it (by its first record); the others answer what fits in the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_answers_at_most_its_max_bytes_past_the_first_partition() {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::{FetchRequest, FetchResponse};
    let tmp = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", mmmq_tests::free_port());
    // Small segments: each large record is a segment of its own (librdkafka 0082 got two
    // records of two segments, past its budget).
    let broker = Broker::start_with(
        tmp.path(),
        &["--kafka-listen", &kafka, "--segment-max-bytes", "100000"],
    )
    .await;
    let (status, _) = broker
        .put("/mmmq/topics/wide", &json!({"partitions": 3}))
        .await;
    assert_eq!(status, 200);
    let mut c = Conn::open(&kafka).await;
    let value = "v".repeat(600_000);
    // Partition 0: two large records; 1: a small one; 2: a large one.
    for (p, v) in [
        (0, &value),
        (0, &value),
        (1, &"small".to_owned()),
        (2, &value),
    ] {
        let mut request = produce("wide", batch(-1, -1, -1, &[v]));
        request.topic_data[0].partition_data[0].index = p;
        let r: ProduceResponse = c.call(ApiKey::Produce, 9, &request).await;
        assert_eq!(outcome(&r).0, 0);
    }
    let fetch = FetchRequest::default()
        .with_replica_id(kafka_protocol::messages::BrokerId(-1))
        .with_max_wait_ms(100)
        .with_min_bytes(1)
        .with_max_bytes(1_000_000)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_static_str("wide")))
                .with_partitions(
                    (0..3)
                        .map(|p| {
                            FetchPartition::default()
                                .with_partition(p)
                                .with_fetch_offset(0)
                                .with_partition_max_bytes(1 << 20)
                        })
                        .collect(),
                ),
        ]);
    let r: FetchResponse = c.call(ApiKey::Fetch, 12, &fetch).await;
    let sizes: Vec<usize> = r.responses[0]
        .partitions
        .iter()
        .map(|p| p.records.as_ref().map_or(0, |b| b.len()))
        .collect();
    // The first partition's first record only (the second would pass max_bytes), the small
    // record that fits in what is left, nothing of the third.
    assert!((600_000..1_000_000).contains(&sizes[0]), "{sizes:?}");
    assert!((1..1_000).contains(&sizes[1]), "{sizes:?}");
    assert_eq!(sizes[2], 0, "past max_bytes after the first: {sizes:?}");
}
