//! A real `mmmq serve` in a temporary root dir on a free port, driven over HTTP and its CLI.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::Value;

use crate::{mmmq_bin, succeeded};

/// A running `mmmq serve`.
pub struct Broker {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Its root dir.
    pub root: PathBuf,
    /// Everything it logged so far.
    pub log: Arc<Mutex<String>>,
    /// HTTP client for the tests.
    pub http: reqwest::Client,
}

impl Broker {
    /// Starts `mmmq serve` on a free port with `root` and waits until `/healthz` answers 200.
    pub async fn start(root: &Path) -> Self {
        Self::start_with(root, &[]).await
    }

    /// As [`Broker::start`], with extra flags.
    pub async fn start_with(root: &Path, args: &[&str]) -> Self {
        let (child, addr, log) = spawn_serve(root, args);
        let addr = addr.unwrap_or_else(|| {
            panic!("mmmq serve did not start:\n{}", log.lock());
        });
        let broker = Self {
            child,
            url: format!("http://{addr}"),
            root: root.to_owned(),
            log,
            http: reqwest::Client::new(),
        };
        let url = format!("{}/healthz", broker.url);
        let http = broker.http.clone();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = http.get(&url).send().await
                && r.status() == 200
            {
                break;
            }
            assert!(Instant::now() < deadline, "broker never became healthy");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        broker
    }

    /// `127.0.0.1:PORT`: where to open raw connections.
    pub fn addr(&self) -> &str {
        self.url.trim_start_matches("http://")
    }

    /// Sends `method` with an optional JSON body to a path; returns the status and the JSON
    /// answer (`null` when the answer is not JSON).
    pub async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let mut r = self.http.request(method, format!("{}{path}", self.url));
        if let Some(body) = body {
            r = r.json(body);
        }
        let r = r.send().await.expect("request");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Sends one request with extra headers (`Host` among them overrides the real one) and an
    /// optional raw body with an optional content type; returns the status, the headers and the
    /// JSON answer (`null` when it is not JSON).
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<(&str, Option<&str>)>,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let mut r = self
            .http
            .request(method.parse().unwrap(), format!("{}{path}", self.url));
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        if let Some((body, content_type)) = body {
            if let Some(ct) = content_type {
                r = r.header("content-type", ct);
            }
            r = r.body(body.to_owned());
        }
        let r = r.send().await.expect("request");
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        (status, headers, r.json().await.unwrap_or(Value::Null))
    }

    /// POSTs JSON to a path; returns the status and the JSON answer.
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.request(reqwest::Method::POST, path, Some(body)).await
    }

    /// POSTs `body` as it is (JSON the test wrote by hand, byte for byte); returns the status and
    /// the answer's text.
    pub async fn post_raw(&self, path: &str, body: String) -> (u16, String) {
        let r = self
            .http
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("request");
        let status = r.status().as_u16();
        (status, r.text().await.unwrap_or_default())
    }

    /// GETs a path; returns the status and the JSON answer.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.request(reqwest::Method::GET, path, None).await
    }

    /// Produces `{"seq": s}` under keys `k0`…`k{keys - 1}` for each `s` of `seqs`, every key's
    /// messages in `seqs` order (batches of 500, each checked).
    pub async fn produce_keyed(&self, topic: &str, keys: u64, seqs: std::ops::Range<u64>) {
        let batch: Vec<Value> = seqs
            .flat_map(|seq| {
                (0..keys).map(move |k| {
                    serde_json::json!({"topic": topic, "key": format!("k{k}"), "content": {"seq": seq}})
                })
            })
            .collect();
        for chunk in batch.chunks(500) {
            let (status, b) = self.post("/mmmq/messages/batch", &Value::from(chunk)).await;
            assert_eq!(status, 200, "{b}");
        }
    }

    /// PUTs JSON to a path; returns the status and the JSON answer.
    pub async fn put(&self, path: &str, body: &Value) -> (u16, Value) {
        self.request(reqwest::Method::PUT, path, Some(body)).await
    }

    /// Deploys a component as plugin `name` (`PUT /mmmq/plugins/{name}`); returns the status and
    /// the JSON answer.
    pub async fn deploy_wasm(&self, name: &str, bytes: Vec<u8>) -> (u16, Value) {
        let r = self
            .http
            .put(format!("{}/mmmq/plugins/{name}", self.url))
            .header("content-type", "application/wasm")
            .body(bytes)
            .send()
            .await
            .unwrap();
        let code = r.status().as_u16();
        (code, r.json().await.unwrap_or(Value::Null))
    }

    /// DELETEs a path; returns the status and the JSON answer.
    pub async fn delete(&self, path: &str) -> (u16, Value) {
        self.request(reqwest::Method::DELETE, path, None).await
    }

    /// The value of a counter or gauge in `/metrics` (summed over its labels), 0 if absent.
    pub async fn metric(&self, name: &str) -> f64 {
        self.get_text("/metrics")
            .await
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// GETs a path; returns the answer's text (for `/metrics` and byte-exact checks).
    pub async fn get_text(&self, path: &str) -> String {
        self.http
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .expect("request")
            .text()
            .await
            .expect("a text body")
    }

    /// Produces one message and returns its offset (panics unless ACKed).
    pub async fn produce(&self, topic: &str, content: Value) -> u64 {
        let (status, body) = self
            .post(
                "/mmmq/messages",
                &serde_json::json!({"topic": topic, "content": content}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["ack"], "ACK");
        body["offset"].as_u64().unwrap()
    }

    /// Every message of a topic, by pull.
    pub async fn pull_all(&self, topic: &str) -> Vec<Value> {
        self.pull_from(topic, 0).await
    }

    /// Every message of a topic from offset `from` on, by pull.
    pub async fn pull_from(&self, topic: &str, mut from: u64) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            let (status, body) = self
                .get(&format!(
                    "/mmmq/topics/{topic}/messages?from={from}&max=1000"
                ))
                .await;
            assert_eq!(status, 200, "{body}");
            let msgs = body["messages"].as_array().unwrap().clone();
            let next = body["next"].as_u64().unwrap();
            if next == from {
                return out;
            }
            out.extend(msgs);
            from = next;
        }
    }

    /// Waits (up to 60 s) until `topic` holds at least `n` messages, and returns them.
    pub async fn pull_until(&self, topic: &str, n: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (status, body) = self
                .get(&format!(
                    "/mmmq/topics/{topic}/messages?waitMs=500&max=1000"
                ))
                .await;
            if status == 200 && body["messages"].as_array().unwrap().len() >= n {
                return body["messages"].as_array().unwrap().clone();
            }
            assert!(Instant::now() < deadline, "{topic} never got {n} messages");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The status of dispatcher `id` (`GET /mmmq/dispatchers`); panics if there is none.
    pub async fn dispatcher(&self, id: &str) -> Value {
        let (_, all) = self.get("/mmmq/dispatchers").await;
        all.as_array()
            .and_then(|a| a.iter().find(|d| d["consumerId"] == id).cloned())
            .unwrap_or_else(|| panic!("no dispatcher {id}: {all}"))
    }

    /// The status of dispatcher `id` once `ready` holds, polled (panics after 60 s). Counters are
    /// updated after the consumer's answer arrives, so a test that saw a message arrive waits on
    /// the count rather than reading it at once.
    pub async fn dispatcher_when(&self, id: &str, ready: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, all) = self.get("/mmmq/dispatchers").await;
            let s = all
                .as_array()
                .and_then(|a| a.iter().find(|d| d["consumerId"] == id))
                .cloned()
                .unwrap_or(Value::Null);
            if ready(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "dispatcher {id} never got there: {s}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory of the process, in bytes (Linux).
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS");
        kb * 1024
    }

    /// SIGTERM, then waits for the exit.
    pub fn terminate(mut self) -> ExitStatus {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().expect("wait");
        std::mem::forget(self);
        status
    }

    /// SIGKILL, then waits for the exit.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::forget(self);
    }

    /// Runs the `mmmq` command line against this broker (`MMMQ_BROKER`) and waits for it.
    pub fn cli<I, S>(&self, args: I) -> std::process::Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        Command::new(mmmq_bin())
            .args(args)
            .env("MMMQ_BROKER", &self.url)
            .output()
            .expect("run mmmq")
    }

    /// [`Broker::cli`] that must succeed (it panics with what the command printed otherwise).
    pub fn cli_ok<I, S>(&self, args: I) -> std::process::Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        succeeded(self.cli(args))
    }

    /// Sends a signal without waiting.
    pub fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `mmmq serve` and returns the child, the address it listens on (None if it exited first)
/// and its log.
pub fn spawn_serve(root: &Path, args: &[&str]) -> (Child, Option<SocketAddr>, Arc<Mutex<String>>) {
    let mut cmd = Command::new(mmmq_bin());
    cmd.arg("serve").arg("--root-dir").arg(root);
    if !args.contains(&"--listen") {
        cmd.args(["--listen", "127.0.0.1:0"]);
    }
    let mut child = cmd
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn mmmq");
    let log = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(addr) = line
                .split_once(" addr=")
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .and_then(|a| a.parse::<SocketAddr>().ok())
            {
                let _ = tx.send(addr);
            }
            eprintln!("[mmmq] {line}");
            let mut l = sink.lock();
            l.push_str(&line);
            l.push('\n');
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(30)).ok();
    (child, addr, log)
}

/// One line the testbed plugin logged for a message it handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled {
    /// `TESTBED_VERSION` of the build that handled it.
    pub version: String,
    /// Topic.
    pub topic: String,
    /// Offset.
    pub offset: u64,
    /// How many messages the instance that handled it had handled, this one included.
    pub seen: u64,
    /// Which delivery of the message it was (1 for builds that do not log it).
    pub attempt: u32,
    /// The rest of the line: `key=… content=…`.
    pub rest: String,
}

impl Broker {
    /// Every message the testbed plugin reported handling, in log order.
    pub fn handled(&self) -> Vec<Handled> {
        self.log
            .lock()
            .lines()
            .filter_map(|l| {
                let rest = l.split_once("testbed version=")?.1;
                let (version, rest) = rest.split_once(" topic=")?;
                let (topic, rest) = rest.split_once(" offset=")?;
                let (offset, rest) = rest.split_once(" seen=")?;
                let (seen, rest) = rest.split_once(' ')?;
                // 0.2.0 builds log the attempt next.
                let (attempt, rest) = match rest.strip_prefix("attempt=") {
                    Some(r) => {
                        let (a, r) = r.split_once(' ')?;
                        (a.parse().ok()?, r)
                    }
                    None => (1, rest),
                };
                // tracing appends the span's fields after the message.
                let rest = rest.split(" consumer_id=").next().unwrap_or(rest);
                Some(Handled {
                    version: version.to_owned(),
                    topic: topic.to_owned(),
                    offset: offset.parse().ok()?,
                    seen: seen.parse().ok()?,
                    attempt,
                    rest: rest.to_owned(),
                })
            })
            .collect()
    }
}
