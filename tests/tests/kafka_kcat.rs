//! Kafka's protocol with a client nobody here wrote (docs/kafka.md): Debian's `kcat` (librdkafka
//! 2.0.2), installed by `./scripts/test`, against the real binary.

use mmmq_tests::Broker;
use mmmq_tests::kafka::kcat;
use serde_json::json;

/// A broker that speaks Kafka on a port of its own; `(broker, bootstrap address)`.
async fn broker(root: &std::path::Path, more: &[&str]) -> (Broker, String) {
    let port = mmmq_tests::free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec!["--kafka-listen", listen.as_str()];
    args.extend_from_slice(more);
    let broker = Broker::start_with(root, &args).await;
    (broker, listen)
}

/// 100,000 keyed records in, the same bytes out, in order per partition, with their keys; the
/// metadata lists the topic with its partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcat_produces_and_consumes_the_same_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let (broker, bootstrap) = broker(tmp.path(), &[]).await;
    let (status, body) = broker
        .put("/mmmq/topics/bytes", &json!({"partitions": 4}))
        .await;
    assert_eq!(status, 200, "{body}");
    // Keys and values of every byte but the delimiters kcat splits on (newline, and `\x01`
    // between key and value), values that are JSON and values that are not.
    let n = 100_000usize;
    let mut input = Vec::new();
    let mut sent = Vec::with_capacity(n);
    for i in 0..n {
        let key = format!("key-{}", i % 97).into_bytes();
        let value: Vec<u8> = if i % 3 == 0 {
            format!("{{\"i\":{i}}}").into_bytes()
        } else {
            let mut v = format!("v{i}:").into_bytes();
            v.extend((0u8..=255).filter(|b| *b != b'\n' && *b != 1).take(i % 200));
            v
        };
        input.extend_from_slice(&key);
        input.push(1);
        input.extend_from_slice(&value);
        input.push(b'\n');
        sent.push((key, value));
    }
    kcat(
        &[
            "-b", &bootstrap, "-P", "-t", "bytes", "-K", "\x01", "-X", "acks=all",
        ],
        &input,
    );
    // Read back: key, value and partition of each record, NUL-delimited (neither contains 0…
    // except the values, so lengths are printed and the bytes parsed by length).
    let out = kcat(
        &[
            "-b",
            &bootstrap,
            "-C",
            "-t",
            "bytes",
            "-o",
            "beginning",
            "-e",
            "-f",
            "%p %o %K %S\n%k%s",
        ],
        b"",
    );
    let mut got: Vec<(i32, u64, Vec<u8>, Vec<u8>)> = Vec::new();
    let mut rest = &out[..];
    while !rest.is_empty() {
        let nl = rest.iter().position(|b| *b == b'\n').unwrap();
        let head = std::str::from_utf8(&rest[..nl]).unwrap();
        let f: Vec<&str> = head.split(' ').collect();
        let (klen, vlen): (usize, usize) = (f[2].parse().unwrap(), f[3].parse().unwrap());
        let body = &rest[nl + 1..];
        got.push((
            f[0].parse().unwrap(),
            f[1].parse().unwrap(),
            body[..klen].to_vec(),
            body[klen..klen + vlen].to_vec(),
        ));
        rest = &body[klen + vlen..];
    }
    assert_eq!(got.len(), n);
    // librdkafka's default partitioner puts a key on one partition: per key, the values arrive
    // in the order sent, byte for byte.
    let mut by_key: std::collections::HashMap<Vec<u8>, Vec<Vec<u8>>> = Default::default();
    for (k, v) in &sent {
        by_key.entry(k.clone()).or_default().push(v.clone());
    }
    let mut partition_of: std::collections::HashMap<Vec<u8>, i32> = Default::default();
    let mut read: std::collections::HashMap<Vec<u8>, Vec<Vec<u8>>> = Default::default();
    got.sort_by_key(|(p, o, ..)| (*p, *o));
    for (p, _, k, v) in &got {
        assert_eq!(
            *partition_of.entry(k.clone()).or_insert(*p),
            *p,
            "one key, one partition"
        );
        read.entry(k.clone()).or_default().push(v.clone());
    }
    assert_eq!(read, by_key);
    // Offsets are the log's: 0.. with no gap in each partition.
    for p in 0..4 {
        let offsets: Vec<u64> = got.iter().filter(|g| g.0 == p).map(|g| g.1).collect();
        assert_eq!(
            offsets,
            (0..offsets.len() as u64).collect::<Vec<_>>(),
            "partition {p}"
        );
    }
    // Metadata.
    let listing = String::from_utf8(kcat(&["-b", &bootstrap, "-L", "-t", "bytes"], b"")).unwrap();
    assert!(
        listing.contains("topic \"bytes\" with 4 partitions"),
        "{listing}"
    );
    for p in 0..4 {
        assert!(
            listing.contains(&format!("partition {p}, leader 0")),
            "{listing}"
        );
    }
}

/// Produced over HTTP, read by kcat (the content's JSON text, the key's bytes); produced by kcat,
/// read over HTTP (`content` for JSON, `contentBase64` for anything else, the key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_and_kafka_share_topics_both_ways() {
    let tmp = tempfile::tempdir().unwrap();
    let (broker, bootstrap) = broker(tmp.path(), &[]).await;
    // Sent as text: the content's bytes, spacing and `2.50` included, are what Kafka reads.
    let (status, body) = broker
        .post_raw(
            "/mmmq/messages",
            r#"{"topic": "shared", "key": "k1", "content": {"a": [1, 2.50]}}"#.into(),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let out = kcat(
        &[
            "-b",
            &bootstrap,
            "-C",
            "-t",
            "shared",
            "-o",
            "beginning",
            "-e",
            "-f",
            "%k|%s|%o\n",
        ],
        b"",
    );
    assert_eq!(String::from_utf8(out).unwrap(), "k1|{\"a\": [1, 2.50]}|0\n");
    kcat(
        &["-b", &bootstrap, "-P", "-t", "shared", "-K", ":"],
        b"k2:{\"b\":true}\nk3:not json\n",
    );
    let page = broker.pull_all("shared").await;
    assert_eq!(page.len(), 3, "{page:?}");
    assert_eq!(page[1]["key"], "k2");
    assert_eq!(page[1]["content"], json!({"b": true}));
    assert_eq!(page[2]["key"], "k3");
    assert_eq!(page[2]["contentBase64"], "bm90IGpzb24=");
    assert!(page[2].get("content").is_none(), "{}", page[2]);
}

/// `-Q`: the first offset at or after a time, per partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_by_timestamp() {
    let tmp = tempfile::tempdir().unwrap();
    let (broker, bootstrap) = broker(tmp.path(), &[]).await;
    for i in 0..3 {
        broker.produce("times", json!(i)).await;
    }
    let page = broker.pull_all("times").await;
    let second: u64 = page[1]["timestamp"].as_u64().unwrap();
    broker.produce("times", json!(3)).await;
    let out = String::from_utf8(kcat(
        &["-b", &bootstrap, "-Q", "-t", &format!("times:0:{second}")],
        b"",
    ))
    .unwrap();
    // The second message, or an earlier one of the same millisecond (timestamps never go
    // back within a partition).
    let expected_at = page
        .iter()
        .position(|m| m["timestamp"].as_u64() == Some(second))
        .unwrap();
    assert!(
        out.contains(&format!("times [0] offset {expected_at}")),
        "{out}"
    );
    let late = String::from_utf8(kcat(
        &[
            "-b",
            &bootstrap,
            "-Q",
            "-t",
            &format!("times:0:{}", u64::MAX / 4),
        ],
        b"",
    ))
    .unwrap();
    assert!(late.contains("times [0] offset -1"), "{late}");
}

/// Batches compressed with each of Kafka's codecs are stored record by record and read back
/// (uncompressed) by every client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_batches_of_every_codec() {
    let tmp = tempfile::tempdir().unwrap();
    let (broker, bootstrap) = broker(tmp.path(), &[]).await;
    for codec in ["gzip", "snappy", "lz4", "zstd"] {
        let topic = format!("z-{codec}");
        let input: String = (0..2000).map(|i| format!("{codec} record {i}\n")).collect();
        kcat(
            &[
                "-b",
                &bootstrap,
                "-P",
                "-t",
                &topic,
                "-z",
                codec,
                "-X",
                "linger.ms=50",
            ],
            input.as_bytes(),
        );
        let out = kcat(
            &[
                "-b",
                &bootstrap,
                "-C",
                "-t",
                &topic,
                "-o",
                "beginning",
                "-e",
                "-f",
                "%s\n",
            ],
            b"",
        );
        assert_eq!(String::from_utf8(out).unwrap(), input, "{codec}");
        assert_eq!(broker.pull_all(&topic).await.len(), 2000, "{codec}");
    }
}

/// Records produced by a Kafka client are delivered like any other message: a remote HTTP
/// consumer receives `contentBase64` for a value that is not JSON and `content` for one that
/// is; a plugin of the JSON-only world gets the JSON string of the base64 as content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatchers_and_plugins_see_kafka_records() {
    let tmp = tempfile::tempdir().unwrap();
    let port = mmmq_tests::free_port();
    mmmq_tests::deploy_plugin(
        tmp.path(),
        &mmmq_tests::plugin_wasm("testbed", None),
        "testbed.wasm",
    );
    mmmq_tests::write_dispatchers(
        tmp.path(),
        &json!([
            mmmq_tests::host_dispatcher("remote", "fromkafka", port),
            mmmq_tests::plugin_dispatcher("wasm", "fromkafka", "testbed.wasm", json!({})),
        ]),
    );
    let consumer = mmmq_tests::Consumer::start_on(
        port,
        std::sync::Arc::new(|_: &serde_json::Value| mmmq_tests::Answer::Ack),
    )
    .await;
    let (broker, bootstrap) = broker(tmp.path(), &[]).await;
    kcat(
        &["-b", &bootstrap, "-P", "-t", "fromkafka", "-K", ":"],
        b"k1:hello\nk2:{\"n\":2}\n",
    );
    let got = consumer
        .wait_for(2, std::time::Duration::from_secs(30))
        .await;
    assert_eq!(got[0]["key"], "k1");
    assert_eq!(got[0]["contentBase64"], "aGVsbG8=");
    assert!(got[0].get("content").is_none(), "{}", got[0]);
    assert_eq!(got[1]["content"], json!({"n": 2}));
    mmmq_tests::eventually(
        std::time::Duration::from_secs(30),
        "the plugin's two lines",
        || {
            let log = broker.log.lock().clone();
            let lines: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("testbed version=v1 topic=fromkafka"))
                .collect();
            (lines.len() == 2
                && lines[0].contains("key=Some(\"k1\")")
                && lines[0].contains("content=\"aGVsbG8=\"")
                && lines[1].contains("content={\"n\":2}"))
            .then_some(())
        },
    )
    .await;
}

/// A record's headers are a list, as Kafka's: a key repeated keeps every value, in order, read
/// back by kcat and shown so in the HTTP envelope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_header_keys_are_all_kept_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let (broker, bootstrap) = broker(tmp.path(), &[]).await;
    kcat(
        &[
            "-b", &bootstrap, "-P", "-t", "heads", "-H", "trace=a", "-H", "solo=x", "-H", "trace=b",
        ],
        b"value\n",
    );
    let out = kcat(
        &[
            "-b",
            &bootstrap,
            "-C",
            "-t",
            "heads",
            "-o",
            "beginning",
            "-e",
            "-f",
            "%h\n",
        ],
        b"",
    );
    assert_eq!(String::from_utf8_lossy(&out), "trace=a,solo=x,trace=b\n");
    let got = broker.pull_all("heads").await;
    let headers: Vec<(String, String)> = got[0]["headers"]
        .as_array()
        .unwrap_or_else(|| panic!("{got:?}"))
        .iter()
        .map(|h| {
            let value = h["valueBase64"].as_str().unwrap();
            (h["key"].as_str().unwrap().to_owned(), value.to_owned())
        })
        .collect();
    // "a", "x", "b" in base64.
    let want = [("trace", "YQ=="), ("solo", "eA=="), ("trace", "Yg==")];
    assert_eq!(
        headers,
        want.map(|(k, v)| (k.to_owned(), v.to_owned())),
        "{got:?}"
    );
}

/// With `--auth-token`, kcat (librdkafka's SASL/PLAIN: SaslHandshake v1, SaslAuthenticate)
/// logs in with the token as its password, any user name, and produces and consumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcat_logs_in_with_sasl_plain() {
    let tmp = tempfile::tempdir().unwrap();
    let (_broker, bootstrap) = broker(tmp.path(), &["--auth-token", "s3cret"]).await;
    let login = [
        "-X",
        "security.protocol=SASL_PLAINTEXT",
        "-X",
        "sasl.mechanisms=PLAIN",
        "-X",
        "sasl.username=anyone",
        "-X",
        "sasl.password=s3cret",
    ];
    let with = |args: &[&str]| -> Vec<String> {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.extend(login.iter().map(|s| s.to_string()));
        all
    };
    let produce = with(&["-b", &bootstrap, "-P", "-t", "locked", "-K:"]);
    let produce: Vec<&str> = produce.iter().map(String::as_str).collect();
    kcat(&produce, b"k1:one\nk2:two\n");
    let consume = with(&[
        "-b",
        &bootstrap,
        "-C",
        "-t",
        "locked",
        "-o",
        "beginning",
        "-e",
        "-f",
        "%k=%s\n",
    ]);
    let consume: Vec<&str> = consume.iter().map(String::as_str).collect();
    let out = String::from_utf8(kcat(&consume, b"")).unwrap();
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(lines, ["k1=one", "k2=two"]);
}
