//! Support for the end-to-end tests: the real `mmmq` binary in a temporary root dir on a free
//! port, and real HTTP consumers that record what they receive.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::Value;

/// The payload the crash appender writes for (`cycle`, `task`, `seq`): varied lengths, so that
/// torn writes land at every kind of boundary.
pub fn crash_payload(cycle: u64, task: u64, seq: u64) -> Vec<u8> {
    let pad = "p".repeat(((cycle * 7 + task * 13 + seq) % 200) as usize);
    format!(r#"{{"timestamp":0,"key":null,"content":{{"cycle":{cycle},"task":{task},"seq":{seq},"pad":"{pad}"}}}}"#)
        .into_bytes()
}

/// The `mmmq` binary of this build (`scripts/test` builds it before the tests run; `MMMQ_BIN`
/// overrides).
pub fn mmmq_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("MMMQ_BIN") {
        return p.into();
    }
    // target/debug/deps/<test> → target/debug/mmmq
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let bin = dir.join("mmmq");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p mmmq` (scripts/test does) or set MMMQ_BIN",
        bin.display()
    );
    bin
}

/// An example binary of this build (`target/debug/examples/NAME`, built by `cargo test`).
pub fn example_bin(name: &str) -> PathBuf {
    let bin = mmmq_bin()
        .parent()
        .expect("target dir")
        .join("examples")
        .join(name);
    assert!(
        bin.exists(),
        "{} is missing: cargo test builds examples",
        bin.display()
    );
    bin
}

/// Waits until `f` returns `Some`, checking every 20 ms, or panics after `timeout` with `what`.
pub async fn eventually<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

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

/// Writes `{root}/dispatchers.json`.
pub fn write_dispatchers(root: &Path, dispatchers: &Value) {
    std::fs::create_dir_all(root).unwrap();
    std::fs::write(
        root.join("dispatchers.json"),
        serde_json::to_vec_pretty(dispatchers).unwrap(),
    )
    .unwrap();
}

/// A dispatcher entry for a local consumer.
pub fn host_dispatcher(id: &str, pattern: &str, port: u16) -> Value {
    serde_json::json!({
        "consumerId": id,
        "pattern": pattern,
        "host": {"protocol": "HTTP", "address": "127.0.0.1", "port": port, "timeoutMs": 5000},
    })
}

/// A dispatcher entry for a plugin file in `{root}/plugins/`; `extra` adds fields (and fields of
/// `"plugin"`).
pub fn plugin_dispatcher(id: &str, pattern: &str, file: &str, extra: Value) -> Value {
    let mut d = serde_json::json!({"consumerId": id, "pattern": pattern, "plugin": {"path": format!("plugins/{file}")}});
    if let Value::Object(extra) = extra {
        for (k, v) in extra {
            if k == "plugin" {
                for (pk, pv) in v.as_object().unwrap() {
                    d["plugin"][pk] = pv.clone();
                }
            } else {
                d[k] = v;
            }
        }
    }
    d
}

/// A root dir whose one dispatcher, `id`, runs the `testbed` plugin on `pattern` (`extra` as in
/// [`plugin_dispatcher`]).
pub fn testbed_root(root: &Path, id: &str, pattern: &str, extra: Value) {
    deploy_plugin(root, &plugin_wasm("testbed", None), "testbed.wasm");
    write_dispatchers(
        root,
        &serde_json::json!([plugin_dispatcher(id, pattern, "testbed.wasm", extra)]),
    );
}

/// How a test consumer answers one envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// `200 {"ack":"ACK"}`.
    Ack,
    /// `200 {"ack":"NACK"}`.
    Nack,
    /// `500`.
    Error,
}

type Policy = dyn Fn(&Value) -> Answer + Send + Sync;

/// A real HTTP consumer (README, "Dispatchers") that records every envelope it receives, in order.
pub struct Consumer {
    /// Its port.
    pub port: u16,
    received: Arc<Mutex<Vec<(Instant, Value)>>>,
    /// The `Authorization` header of every request, in order.
    pub authorization: Arc<Mutex<Vec<Option<String>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Consumer {
    /// ACKs everything, on a free port.
    pub async fn start() -> Self {
        Self::start_on(0, Arc::new(|_| Answer::Ack)).await
    }

    /// Answers by `policy`, on `port` (0 for a free one).
    pub async fn start_on(port: u16, policy: Arc<Policy>) -> Self {
        Self::start_slow(port, policy, Duration::ZERO).await
    }

    /// As [`Consumer::start_on`], taking `delay` per request before it answers (a slow consumer;
    /// requests are served concurrently).
    pub async fn start_slow(port: u16, policy: Arc<Policy>, delay: Duration) -> Self {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let authorization: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
        let rec = received.clone();
        let auth = authorization.clone();
        let app = axum::Router::new().route(
            "/mmmq/messages",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let rec = rec.clone();
                    let auth = auth.clone();
                    let policy = policy.clone();
                    async move {
                        auth.lock().push(
                            headers
                                .get("authorization")
                                .and_then(|v| v.to_str().ok())
                                .map(str::to_owned),
                        );
                        let v: Value = serde_json::from_slice(&body).expect("broker sent JSON");
                        let items = match &v {
                            Value::Array(a) => a.clone(),
                            one => vec![one.clone()],
                        };
                        let mut answer = Answer::Ack;
                        for item in &items {
                            let a = policy(item);
                            if a != Answer::Ack {
                                answer = a;
                            }
                        }
                        rec.lock().push((Instant::now(), v));
                        if !delay.is_zero() {
                            tokio::time::sleep(delay).await;
                        }
                        match answer {
                            Answer::Ack => (axum::http::StatusCode::OK, r#"{"ack":"ACK"}"#),
                            Answer::Nack => (axum::http::StatusCode::OK, r#"{"ack":"NACK"}"#),
                            Answer::Error => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "{}"),
                        }
                    }
                },
            ),
        );
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            port,
            received,
            authorization,
            task,
        }
    }

    /// Every request body received, in order (an envelope, or an array for batches).
    pub fn requests(&self) -> Vec<Value> {
        self.received
            .lock()
            .iter()
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Every envelope received, batches flattened, in order.
    pub fn envelopes(&self) -> Vec<Value> {
        self.timed_envelopes().into_iter().map(|(_, v)| v).collect()
    }

    /// Every envelope received with the moment its request arrived, batches flattened, in order.
    pub fn timed_envelopes(&self) -> Vec<(Instant, Value)> {
        self.received
            .lock()
            .iter()
            .flat_map(|(at, v)| match v {
                Value::Array(a) => a.iter().map(|e| (*at, e.clone())).collect(),
                one => vec![(*at, one.clone())],
            })
            .collect()
    }

    /// The offset of every envelope received, in order.
    pub fn offsets(&self) -> Vec<u64> {
        self.envelopes()
            .iter()
            .map(|e| e["offset"].as_u64().expect("an envelope has an offset"))
            .collect()
    }

    /// Envelopes of one topic, in the order received.
    pub fn of_topic(&self, topic: &str) -> Vec<Value> {
        self.envelopes()
            .into_iter()
            .filter(|e| e["topic"] == topic)
            .collect()
    }

    /// Waits until at least `n` envelopes arrived.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Value> {
        eventually(timeout, &format!("{n} envelopes"), || {
            let e = self.envelopes();
            (e.len() >= n).then_some(e)
        })
        .await
    }

    /// Stops listening (the port is free again).
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// A port nothing listens on (yet).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_owned()
}

/// Builds the plugin crate `package` for `wasm32-wasip2` (profile `plugin`) and returns the
/// component's path. `variant` sets `TESTBED_VERSION` and gets its own target dir, so two
/// versions of one plugin can exist side by side. Built once per test process.
pub fn plugin_wasm(package: &str, variant: Option<&str>) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let key = format!("{package}/{}", variant.unwrap_or("-"));
    let mut built = BUILT.lock().unwrap();
    if let Some((_, p)) = built.iter().find(|(k, _)| *k == key) {
        return p.clone();
    }
    ensure_wasm_target();
    let root = workspace_root();
    let target_dir = root.join("target").join(match variant {
        Some(v) => format!("wasm-{v}"),
        None => "wasm".to_owned(),
    });
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args([
            "build",
            "--profile",
            "plugin",
            "--target",
            "wasm32-wasip2",
            "-p",
            package,
        ])
        .arg("--target-dir")
        .arg(&target_dir);
    if let Some(v) = variant {
        cmd.env("TESTBED_VERSION", v);
    }
    let out = cmd.output().expect("run cargo");
    assert!(
        out.status.success(),
        "building {package} for wasm32-wasip2 failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = target_dir
        .join("wasm32-wasip2/plugin")
        .join(format!("{}.wasm", package.replace('-', "_")));
    assert!(path.exists(), "{} was not built", path.display());
    built.push((key, path.clone()));
    path
}

/// Installs the `wasm32-wasip2` target when it is missing (`scripts/test` does it first).
pub fn ensure_wasm_target() {
    let out = Command::new("rustc")
        .args(["--print", "target-libdir", "--target", "wasm32-wasip2"])
        .output();
    let installed = out
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .is_some_and(|p| p.exists());
    if !installed {
        let status = Command::new("rustup")
            .args(["target", "add", "wasm32-wasip2"])
            .status()
            .expect("rustup");
        assert!(status.success(), "rustup target add wasm32-wasip2 failed");
    }
}

/// Copies a built component to `{root}/plugins/{name}` atomically (write aside, then rename), as
/// a deploy would.
pub fn deploy_plugin(root: &Path, wasm: &Path, name: &str) -> PathBuf {
    let dir = root.join("plugins");
    std::fs::create_dir_all(&dir).unwrap();
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::copy(wasm, &tmp).unwrap();
    let dest = dir.join(name);
    std::fs::rename(&tmp, &dest).unwrap();
    dest
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

/// Runs `cmd` and waits; panics with what it printed unless it succeeded.
pub fn run_ok(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    succeeded(out)
}

/// `out`, after checking that its command succeeded (else a panic with what it printed).
fn succeeded(out: std::process::Output) -> std::process::Output {
    assert!(
        out.status.success(),
        "the command failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
