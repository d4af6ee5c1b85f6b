//! Kafka clients nobody here wrote, for the Kafka tests (docs/kafka.md): Debian's `kcat` and the
//! Python clients of `tests/kafka/clients.py`, run by the venv `./scripts/test` makes
//! (`MMMQ_KAFKA_PYTHON`).

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Runs kcat with `args`, feeding it `input`; its stdout. Fails the test on a non-zero exit.
pub fn kcat(args: &[&str], input: &[u8]) -> Vec<u8> {
    let mut child = std::process::Command::new("kcat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kcat is installed by ./scripts/test");
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(
        out.status.success(),
        "kcat {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A client process of `tests/kafka/clients.py` and the lines it printed so far.
pub struct Client {
    pub child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Client {
    /// Starts `clients.py` with `args` (its first is the command).
    pub fn start(args: &[&str]) -> Self {
        let python = std::env::var("MMMQ_KAFKA_PYTHON").unwrap_or_else(|_| "python3".into());
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("kafka/clients.py");
        let mut child = Command::new(python)
            .arg(script)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("python with confluent-kafka (./scripts/test makes the venv)");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let sink = lines.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = out.next_line().await {
                sink.lock().push(line);
            }
        });
        Client { child, lines }
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().clone()
    }

    /// How many lines so far start with `prefix`.
    pub fn count(&self, prefix: &str) -> usize {
        self.lines
            .lock()
            .iter()
            .filter(|l| l.starts_with(prefix))
            .count()
    }

    /// Waits up to `within` for an `idempotent` producer to finish, and asserts that it
    /// finished well: every one of its `n` records acknowledged, none failed.
    pub async fn produced_all(&self, within: Duration, n: usize) {
        crate::eventually(within, "the producer done", || {
            self.lines()
                .iter()
                .any(|l| l.starts_with("done "))
                .then_some(())
        })
        .await;
        let lines = self.lines();
        assert!(lines.iter().any(|l| l == "done 0"), "{:?}", lines.last());
        assert_eq!(
            self.count("failed "),
            0,
            "{:?}",
            lines.iter().find(|l| l.starts_with("failed"))
        );
        assert_eq!(self.count("acked "), n);
    }
}
