//! Restarts, crashes, reloads and bad input, against the real binary.

use std::process::Command;
use std::time::{Duration, Instant};

use mmmq_tests::{Broker, Consumer, eventually, host_dispatcher, mmmq_bin, write_dispatchers};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

fn checkpoint(root: &std::path::Path, topic: &str, id: &str) -> Option<u64> {
    let raw = std::fs::read(
        root.join("topics")
            .join(topic)
            .join("checkpoints")
            .join(format!("{id}.checkpoint")),
    )
    .ok()?;
    Some(u64::from_be_bytes(raw.try_into().expect("8 bytes")))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clean_restart_neither_loses_nor_redelivers() {
    let tmp = tempfile::tempdir().unwrap();
    let consumer = Consumer::start().await;
    write_dispatchers(
        tmp.path(),
        &json!([host_dispatcher("c", "**", consumer.port)]),
    );
    let broker = Broker::start(tmp.path()).await;
    for i in 0..10 {
        broker.produce("t", json!(i)).await;
    }
    consumer.wait_for(10, WAIT).await;
    let marker = tmp.path().join(".clean-shutdown");
    assert!(!marker.exists(), "no marker while running");
    assert!(broker.terminate().success(), "SIGTERM exits 0");
    assert_eq!(
        checkpoint(tmp.path(), "t", "c"),
        Some(10),
        "checkpoint persisted at shutdown"
    );
    assert!(marker.exists(), "a clean stop leaves the marker");

    let broker = Broker::start(tmp.path()).await;
    assert!(!marker.exists(), "the boot takes the marker");
    assert!(
        broker.log.lock().contains("tail_check=Quick"),
        "a quick check after a clean stop"
    );
    assert_eq!(broker.pull_all("t").await.len(), 10, "nothing lost");
    broker.produce("t", json!(10)).await;
    // A fence: delivery is in order, so a redelivery from an old checkpoint would come before 10.
    eventually(WAIT, "offset 10", || {
        consumer
            .envelopes()
            .iter()
            .any(|e| e["offset"] == 10)
            .then_some(())
    })
    .await;
    let offsets: Vec<u64> = consumer.offsets();
    assert_eq!(
        offsets,
        (0..11).collect::<Vec<_>>(),
        "each message exactly once"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_requests_get_4xx_and_change_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    broker.produce("kept", json!({"v": 1})).await;
    let before = broker.pull_all("kept").await;
    let deep = format!(
        r#"{{"topic":"deep","content":{}1{}}}"#,
        "[".repeat(5000),
        "]".repeat(5000)
    );
    let big = format!(
        r#"{{"topic":"big","content":"{}"}}"#,
        "x".repeat(2 * 1024 * 1024)
    );
    let long = format!(r#"{{"topic":"{}","content":1}}"#, "t".repeat(250));
    let cases: Vec<(&str, &str, String, Option<&str>)> = vec![
        ("POST", "/mmmq/messages", "not json".into(), None),
        ("POST", "/mmmq/messages", "[1,2]".into(), None),
        ("POST", "/mmmq/messages", r#"{"topic":"a"}"#.into(), None),
        ("POST", "/mmmq/messages", r#"{"content":1}"#.into(), None),
        (
            "POST",
            "/mmmq/messages",
            r#"{"topic":"../../etc/passwd","content":1}"#.into(),
            None,
        ),
        (
            "POST",
            "/mmmq/messages",
            r#"{"topic":"a/b","content":1}"#.into(),
            None,
        ),
        (
            "POST",
            "/mmmq/messages",
            r#"{"topic":"주문.생성","content":1}"#.into(),
            None,
        ),
        (
            "POST",
            "/mmmq/messages",
            r#"{"topic":"..","content":1}"#.into(),
            None,
        ),
        (
            "POST",
            "/mmmq/messages",
            r#"{"topic":"","content":1}"#.into(),
            None,
        ),
        ("POST", "/mmmq/messages", long, None),
        ("POST", "/mmmq/messages", big, None),
        ("POST", "/mmmq/messages", deep, None),
        // Found by fuzzing: valid JSON syntax that consumers' parsers refuse.
        (
            "POST",
            "/mmmq/messages",
            r#"{"topic":"a","content":{"n":1e999}}"#.into(),
            None,
        ),
        (
            "POST",
            "/mmmq/messages",
            r#"{"topic":"a","content":"\ud800"}"#.into(),
            None,
        ),
        (
            "POST",
            "/mmmq/messages",
            r#"{"topic":"a","content":1}"#.into(),
            Some("text/plain"),
        ),
        (
            "POST",
            "/mmmq/messages",
            r#"{"topic":"a","contnet":1}"#.into(),
            None,
        ),
        (
            "POST",
            "/mmmq/messages",
            r#"{"topic":"a","content":1,"key":5}"#.into(),
            None,
        ),
        (
            "POST",
            "/mmmq/messages",
            r#"{"topic":"__dlq.x","content":1}"#.into(),
            None,
        ),
        (
            "POST",
            "/mmmq/messages",
            "{\"topic\":\"a\",\"content\":\"a\u{1}b\"}".into(),
            None,
        ),
        (
            "POST",
            "/mmmq/messages/batch",
            r#"{"topic":"a","content":1}"#.into(),
            None,
        ),
        ("POST", "/mmmq/messages/batch", "[]".into(), None),
        (
            "GET",
            "/mmmq/topics/..%2F..%2Fetc/messages",
            String::new(),
            None,
        ),
        (
            "GET",
            "/mmmq/topics/kept/messages?from=-1",
            String::new(),
            None,
        ),
        (
            "GET",
            "/mmmq/topics/kept/messages?waitMs=soon",
            String::new(),
            None,
        ),
        ("DELETE", "/mmmq/messages", String::new(), None),
    ];
    assert!(cases.len() >= 12);
    for (method, path, body, ct) in &cases {
        let mut req = broker
            .http
            .request(method.parse().unwrap(), format!("{}{path}", broker.url))
            .header("content-type", ct.unwrap_or("application/json"));
        if !body.is_empty() {
            req = req.body(body.clone());
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        let shown: String = body.chars().take(80).collect();
        assert!(
            (400..500).contains(&status),
            "{method} {path} {shown}: {status} {text}"
        );
        let err: Value = serde_json::from_str(&text)
            .unwrap_or_else(|_| panic!("{method} {path}: not JSON: {text}"));
        assert!(
            err["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{text}"
        );
    }
    let (status, _) = broker.get("/healthz").await;
    assert_eq!(status, 200, "still healthy");
    assert_eq!(
        broker.pull_all("kept").await,
        before,
        "stored data unchanged"
    );
    let (_, topics) = broker.get("/mmmq/topics").await;
    assert_eq!(
        topics.as_array().unwrap().len(),
        1,
        "no topic created: {topics}"
    );
    let mut entries: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    entries.sort();
    assert_eq!(
        entries,
        vec![".lock", "dispatchers.json", "topics"],
        "nothing created outside topics/"
    );
    let topics: Vec<String> = std::fs::read_dir(tmp.path().join("topics"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(topics, vec!["kept"]);
}

/// Refused before the port is taken, like a bad flag.
#[tokio::test(flavor = "multi_thread")]
async fn a_broken_dispatchers_json_stops_serve_with_a_message_naming_the_entry() {
    let host = json!({"protocol": "HTTP", "address": "127.0.0.1", "port": 9});
    let cases = vec![
        ("[{", "not a JSON array".to_owned()),
        (r#"{"consumerId":"a"}"#, "not a JSON array".to_owned()),
        (&*Box::leak(json!([{"consumerId": "dup", "pattern": "a", "host": host}, {"consumerId": "dup", "pattern": "b", "host": host}]).to_string().into_boxed_str()), "entry 1 (consumerId \"dup\"): duplicate consumerId".to_owned()),
        (&*Box::leak(json!([{"consumerId": "ftp", "pattern": "a", "host": {"protocol": "FTP", "address": "h", "port": 1}}]).to_string().into_boxed_str()), "entry 0 (consumerId \"ftp\"): unknown protocol \"FTP\"".to_owned()),
        (&*Box::leak(json!([{"consumerId": "none", "pattern": "a"}]).to_string().into_boxed_str()), "entry 0 (consumerId \"none\"): has neither".to_owned()),
        (&*Box::leak(json!([{"consumerId": "both", "pattern": "a", "host": host, "plugin": {"path": "x.wasm"}}]).to_string().into_boxed_str()), "has both".to_owned()),
        (&*Box::leak(json!([{"consumerId": "extra", "pattern": "a", "host": host, "retries": 1}]).to_string().into_boxed_str()), "unknown field `retries`".to_owned()),
    ];
    for (text, want) in cases {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("dispatchers.json"), text).unwrap();
        let out = Command::new(mmmq_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--root-dir"])
            .arg(tmp.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text}: serve started");
        assert!(
            stderr.contains(&want),
            "{text}\nwant: {want}\ngot: {stderr}"
        );
        assert!(stderr.contains("dispatchers.json"), "{stderr}");
        assert!(
            !stderr.contains("listening"),
            "refused before it listens: {stderr}"
        );
    }
}

/// A setting out of range stops `serve` before it listens, naming the flag (it used to be raised
/// to 1 silently).
#[test]
fn serve_refuses_settings_out_of_range() {
    let tmp = tempfile::tempdir().unwrap();
    for (flag, value) in [
        ("--max-connections", "0"),
        ("--header-timeout-ms", "0"),
        // It used to start and refuse every topic.
        ("--max-topics", "0"),
        ("--max-groups", "0"),
        ("--max-produce-ids", "0"),
    ] {
        let out = Command::new(mmmq_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--root-dir"])
            .arg(tmp.path())
            .args([flag, value])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} {value}: serve started");
        assert!(
            stderr.contains(&format!("{flag}: must be at least 1")),
            "{stderr}"
        );
        assert!(!stderr.contains("listening"), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn reload_adds_changes_and_removes_dispatchers_without_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("dispatchers.json"))
            .unwrap()
            .trim(),
        "[]",
        "created as []"
    );
    for i in 0..3 {
        broker.produce("t", json!(i)).await;
    }
    let consumer = Consumer::start().await;
    write_dispatchers(
        tmp.path(),
        &json!([host_dispatcher("late", "t", consumer.port)]),
    );
    let (status, report) = broker.post("/mmmq/admin/reload", &json!(null)).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["added"], json!(["late"]));
    let got = consumer.wait_for(3, WAIT).await;
    assert_eq!(
        got.iter().map(|e| e["offset"].clone()).collect::<Vec<_>>(),
        vec![json!(0), json!(1), json!(2)],
        "caught up from 0"
    );

    // An invalid file is refused and the running configuration stays.
    std::fs::write(
        tmp.path().join("dispatchers.json"),
        r#"[{"consumerId":"late","pattern":"t"}]"#,
    )
    .unwrap();
    let (status, body) = broker.post("/mmmq/admin/reload", &json!(null)).await;
    assert_eq!(status, 400);
    assert!(
        body["error"].as_str().unwrap().contains("entry 0"),
        "{body}"
    );
    broker.produce("t", json!(3)).await;
    consumer.wait_for(4, WAIT).await;

    // SIGHUP applies a removal; the checkpoint stays and nothing more is delivered.
    write_dispatchers(tmp.path(), &json!([]));
    broker.signal(libc::SIGHUP);
    eventually(WAIT, "the dispatcher to go", || {
        broker
            .log
            .lock()
            .contains("dispatcher stopped")
            .then_some(())
    })
    .await;
    let (_, status) = broker.get("/mmmq/dispatchers").await;
    assert_eq!(status, json!([]));
    // Its workers were joined before it left the status: nothing can deliver this one until it
    // comes back (checked below: it arrives once, after the return).
    broker.produce("t", json!(4)).await;
    assert_eq!(checkpoint(tmp.path(), "t", "late"), Some(4));

    // Back again: it resumes from its checkpoint, not from 0.
    write_dispatchers(
        tmp.path(),
        &json!([host_dispatcher("late", "t", consumer.port)]),
    );
    let (status, _) = broker.post("/mmmq/admin/reload", &json!(null)).await;
    assert_eq!(status, 200);
    // A fence: in order, so anything delivered twice would come before 5.
    broker.produce("t", json!(5)).await;
    eventually(WAIT, "offset 5", || {
        consumer
            .envelopes()
            .iter()
            .any(|e| e["offset"] == 5)
            .then_some(())
    })
    .await;
    let offsets: Vec<Value> = consumer
        .envelopes()
        .iter()
        .map(|e| e["offset"].clone())
        .collect();
    assert_eq!(offsets, (0..6).map(|o| json!(o)).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_topics_open_restore_and_deliver() {
    let tmp = tempfile::tempdir().unwrap();
    let consumer = Consumer::start().await;
    write_dispatchers(
        tmp.path(),
        &json!([host_dispatcher("all", "many.*", consumer.port)]),
    );
    let broker = Broker::start(tmp.path()).await;
    let batch: Vec<Value> = (0..1000)
        .map(|i| json!({"topic": format!("many.t{i:04}"), "content": i}))
        .collect();
    let (status, body) = broker
        .post("/mmmq/messages/batch", &Value::Array(batch))
        .await;
    assert_eq!(status, 200, "{body}");
    consumer.wait_for(1000, Duration::from_secs(60)).await;
    assert!(broker.terminate().success());
    // About two file descriptors per topic: more than the usual soft limit of 1,024.
    let broker = Broker::start(tmp.path()).await;
    let (_, topics) = broker.get("/mmmq/topics").await;
    assert_eq!(topics.as_array().unwrap().len(), 1000);
    let batch: Vec<Value> = (0..1000)
        .map(|i| json!({"topic": format!("many.t{i:04}"), "content": -i}))
        .collect();
    let (status, _) = broker
        .post("/mmmq/messages/batch", &Value::Array(batch))
        .await;
    assert_eq!(status, 200);
    consumer.wait_for(2000, Duration::from_secs(60)).await;
    assert_eq!(
        consumer
            .envelopes()
            .iter()
            .filter(|e| e["offset"] == 1)
            .count(),
        1000
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_takes_its_settings_from_the_environment_and_pull_clamps_its_limits() {
    let tmp = tempfile::tempdir().unwrap();
    let port = mmmq_tests::free_port();
    let mut child = Command::new(mmmq_bin())
        .arg("serve")
        .env("MMMQ_ROOT_DIR", tmp.path())
        .env("MMMQ_LISTEN", format!("127.0.0.1:{port}"))
        .env("MMMQ_SEGMENT_MAX_BYTES", "300")
        .env("MMMQ_MAX_BODY_BYTES", "2000")
        .env("MMMQ_ALLOWED_HOSTS", "mmmq.internal")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let deadline = Instant::now() + WAIT;
    while !http
        .get(format!("{url}/healthz"))
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
    {
        assert!(
            Instant::now() < deadline,
            "no broker on the port from MMMQ_LISTEN"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for i in 0..1100 {
        let r = http
            .post(format!("{url}/mmmq/messages"))
            .json(&json!({"topic": "env", "content": {"i": i, "pad": "p".repeat(100)}}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let big = http
        .post(format!("{url}/mmmq/messages"))
        .json(&json!({"topic": "env", "content": "x".repeat(3000)}))
        .send()
        .await
        .unwrap();
    assert_eq!(big.status(), 413, "MMMQ_MAX_BODY_BYTES applies");
    for (host, status) in [("mmmq.internal", 200), ("other.internal", 403)] {
        let r = http
            .get(format!("{url}/healthz"))
            .header("host", host)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "MMMQ_ALLOWED_HOSTS applies: {host}");
    }
    // The files are under MMMQ_ROOT_DIR, rolled at MMMQ_SEGMENT_MAX_BYTES.
    let segments = std::fs::read_dir(tmp.path().join("topics/env"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".mmm")
        })
        .count();
    assert!(segments > 100, "{segments} segments");
    // max is at most 1000 and at least 1; waitMs at most 30 s (an absurd value is not an error).
    let page: Value = http
        .get(format!("{url}/mmmq/topics/env/messages?max=5000"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(page["messages"].as_array().unwrap().len(), 1000);
    assert_eq!(page["next"], 1000);
    let page: Value = http
        .get(format!("{url}/mmmq/topics/env/messages?max=0"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(page["messages"].as_array().unwrap().len(), 1);
    let page: Value = http
        .get(format!(
            "{url}/mmmq/topics/env/messages?from=1099&waitMs=99999999"
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(page["next"], 1100);
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    assert!(child.wait().unwrap().success(), "SIGINT exits 0 too");
}

/// Every file under `dir` with its bytes: what "touches nothing" is checked against.
fn tree(dir: &std::path::Path) -> std::collections::BTreeMap<std::path::PathBuf, Vec<u8>> {
    let mut files = std::collections::BTreeMap::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                files.insert(path.strip_prefix(dir).unwrap().to_owned(), Vec::new());
                todo.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                files.insert(path.strip_prefix(dir).unwrap().to_owned(), bytes);
            }
        }
    }
    files
}

/// Runs `mmmq serve` on `root` with `args` and waits at most 20 s for it to exit.
fn serve_expecting_exit(root: &std::path::Path, args: &[&str]) -> (bool, String) {
    let listen = if args.contains(&"--listen") {
        &[][..]
    } else {
        &["--listen", "127.0.0.1:0"][..]
    };
    let mut child = Command::new(mmmq_bin())
        .args(["serve", "--root-dir"])
        .arg(root)
        .args(listen)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("a second serve on a held root dir kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (status.success(), stderr)
}

/// Contract §1: a second `serve` on a root dir in use exits non-zero at once, naming the root dir
/// and the holder's PID, and touches nothing; a SIGKILL of the holder frees the root dir. Before
/// the lock, the second broker acknowledged a message at offset 0 again, over the first's.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_serve_on_a_root_dir_in_use_exits_at_once_and_touches_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let first = Broker::start(tmp.path()).await;
    let (status, ack) = first
        .post(
            "/mmmq/messages",
            &json!({"topic": "t", "content": "first's"}),
        )
        .await;
    assert_eq!((status, ack["offset"].clone()), (200, json!(0)), "{ack}");
    let before = tree(tmp.path());
    // Alone, and as a would-be cluster member (whose Raft logs would be opened before topics).
    let port = mmmq_tests::free_port();
    let addr = format!("127.0.0.1:{port}");
    let peers = format!("1={addr}");
    let member = ["--listen", &addr, "--node-id", "1", "--peers", &peers].map(String::from);
    let member: Vec<&str> = member.iter().map(String::as_str).collect();
    for args in [&[][..], &member[..]] {
        let (ok, stderr) = serve_expecting_exit(tmp.path(), args);
        assert!(!ok, "{args:?}: the second serve exited 0:\n{stderr}");
        assert!(
            stderr.contains(&tmp.path().display().to_string())
                && stderr.contains(&format!("PID {}", first.pid())),
            "{args:?}: names the root dir and the holder: {stderr}"
        );
        assert_eq!(
            tree(tmp.path()),
            before,
            "{args:?}: the root dir was touched"
        );
    }
    let (status, ack) = first
        .post(
            "/mmmq/messages",
            &json!({"topic": "t", "content": "second"}),
        )
        .await;
    assert_eq!((status, ack["offset"].clone()), (200, json!(1)), "{ack}");
    first.kill();
    // The kernel released the lock with the process: no stale lock file to remove by hand.
    let again = Broker::start(tmp.path()).await;
    let contents: Vec<Value> = again
        .pull_all("t")
        .await
        .iter()
        .map(|m| m["content"].clone())
        .collect();
    assert_eq!(contents, vec![json!("first's"), json!("second")]);
}
