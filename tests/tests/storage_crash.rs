//! Crash safety with a real process: a child appends under concurrent load and prints each
//! acknowledged offset; it is SIGKILLed at random moments, and after every kill the log must
//! reopen with every acknowledged offset readable, with its exact content, and no gaps.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use mmmq::storage::{Log, LogConfig, OsFs};
use rand::Rng;

const CYCLES: u64 = 24;

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_under_load_loses_no_acknowledged_append() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("topics").join("crash");
    // Small segments, so kills also land in the middle of rotations.
    let segment_max_bytes = 16 * 1024;
    // What every acknowledged offset must hold, across all cycles.
    let mut acked: BTreeMap<u64, (u64, u64, u64)> = BTreeMap::new();
    let mut rng = rand::rng();
    for cycle in 0..CYCLES {
        let mut child = Command::new(env!("CARGO_BIN_EXE_crash-appender"))
            .arg(&dir)
            .arg(segment_max_bytes.to_string())
            .arg(cycle.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let ready = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("child ready");
        let start: u64 = ready.strip_prefix("ready ").unwrap().parse().unwrap();
        assert!(
            start >= acked.keys().next_back().map_or(0, |k| k + 1),
            "cycle {cycle}: the log reopened at {start}, behind acknowledged offsets"
        );
        // Wait for the first acknowledgement, then let it run a random while before the kill.
        rx.recv_timeout(Duration::from_secs(30))
            .map(|l| parse(&l, cycle, &mut acked))
            .expect("first ack");
        std::thread::sleep(Duration::from_millis(rng.random_range(1..150)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        reader.join().unwrap();
        for line in rx.try_iter() {
            parse(&line, cycle, &mut acked);
        }

        // Reopen (recovery) and check every acknowledged offset ever made.
        let d = dir.clone();
        let log = tokio::task::spawn_blocking(move || {
            Log::open(
                &d,
                Arc::new(OsFs),
                LogConfig {
                    segment_max_bytes,
                    ..LogConfig::default()
                },
            )
        })
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("cycle {cycle}: recovery failed: {e}"));
        let next = log.next_offset();
        let last_acked = *acked.keys().next_back().unwrap();
        assert!(
            next > last_acked,
            "cycle {cycle}: acked {last_acked}, log ends at {next}"
        );
        let entries = log.read_from(0, usize::MAX, usize::MAX).unwrap();
        assert_eq!(entries.len() as u64, next, "cycle {cycle}: gaps in offsets");
        for (i, e) in entries.iter().enumerate() {
            assert_eq!(e.offset, i as u64);
            let payload = e
                .payload
                .as_ref()
                .unwrap_or_else(|c| panic!("cycle {cycle}: {c}"));
            if let Some(&(c, task, seq)) = acked.get(&e.offset) {
                assert_eq!(
                    payload,
                    &mmmq_tests::crash_payload(c, task, seq),
                    "cycle {cycle}: offset {} holds the wrong content",
                    e.offset
                );
            }
        }
        drop(log);
    }
    assert!(
        acked.len() > CYCLES as usize * 8,
        "the children acknowledged only {} appends in all",
        acked.len()
    );
}

fn parse(line: &str, cycle: u64, acked: &mut BTreeMap<u64, (u64, u64, u64)>) {
    let mut it = line.split(' ').map(|s| s.parse::<u64>().unwrap());
    let (offset, task, seq) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
    assert!(
        acked.insert(offset, (cycle, task, seq)).is_none(),
        "offset {offset} acknowledged twice"
    );
}
