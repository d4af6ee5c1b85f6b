//! The cluster's fault campaign (docs/cluster.md, "The fault campaign"): three real brokers
//! under concurrent produce, through a seeded schedule of faults — SIGKILL of a partition's
//! leader or of a follower, SIGSTOP of the leader for longer than an election, a broker cut off
//! from the others, a whole-cluster SIGKILL and restart, a follower kept down while producers
//! run and then catching up — after which the checker reads every replica's files and compares
//! them with every acknowledgement: nothing acknowledged lost, no offset holding two messages,
//! nothing stored that no producer sent.
//!
//! Producers send through any broker, up or not, and record every attempt; half of them send
//! produce ids. A message whose produce got no clear answer is sent again, through a broker
//! chosen at random again (with the same id, for those that have one), so duplicates can only
//! come from a retry; they are counted and reported by kind, and those with ids must be 0
//! (contract §9 and §13: ids stay deduplicated across a change of leader).
//!
//! `MMMQ_CLUSTER_FAULT_RUNS` (2 by default, as in CI; `scripts/cluster-faults` runs 50),
//! `MMMQ_CLUSTER_FAULT_STEPS` (faults per run, 4), `MMMQ_CLUSTER_FAULT_SEED` (replays a run's
//! schedule: the seed of each run is printed). Each run prints one JSON line.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mmmq_tests::checker::{Ack, MsgId, check};
use mmmq_tests::cluster::Cluster;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

const BROKERS: u64 = 3;
const TOPIC: &str = "faults";
const PARTITIONS: u32 = 2;
/// Producers; the even ones send produce ids.
const PRODUCERS: u64 = 4;
/// A produce that takes longer is an unknown outcome, sent again. Longer than a SIGSTOP, so
/// that a paused broker's answer comes back and is checked.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// The longest a produce may take to be acknowledged after a fault heals (an election, a
/// broker's boot): past it the run fails as unavailable.
const RECOVERY: Duration = Duration::from_secs(30);

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// One fault of a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGKILL the partition's leader; start it again after `hold_ms`.
    KillLeader,
    /// SIGKILL a follower of the partition; start it again after `hold_ms`.
    KillFollower,
    /// SIGSTOP the leader for `hold_ms` (longer than an election), then SIGCONT: deposed, it
    /// must never acknowledge what the others did not commit.
    PauseLeader,
    /// Cut the leader off from both others (both directions) for `hold_ms`.
    IsolateLeader,
    /// Cut a follower off for `hold_ms`.
    IsolateFollower,
    /// SIGKILL every broker, then start them all again.
    RestartAll,
    /// SIGKILL a follower, keep it down for a long `hold_ms` while producers run, start it
    /// again: it catches up from far behind under load.
    LaggingFollower,
}

const FAULTS: [Fault; 7] = [
    Fault::KillLeader,
    Fault::KillFollower,
    Fault::PauseLeader,
    Fault::IsolateLeader,
    Fault::IsolateFollower,
    Fault::RestartAll,
    Fault::LaggingFollower,
];

/// A step: the fault, on which partition's leader or follower, how long it lasts, and how long
/// producers run before it.
#[derive(Debug, Clone, Copy)]
struct Step {
    fault: Fault,
    partition: u32,
    /// Which follower when there is a choice (0 or 1).
    pick: usize,
    hold_ms: u64,
    gap_ms: u64,
}

/// The schedule a seed stands for: the same seed, the same faults in the same order.
fn schedule(seed: u64, steps: usize) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..steps)
        .map(|_| {
            let fault = FAULTS[rng.random_range(0..FAULTS.len())];
            let hold_ms = match fault {
                Fault::PauseLeader => rng.random_range(2_000..4_000),
                Fault::LaggingFollower => rng.random_range(3_000..6_000),
                Fault::RestartAll => 0,
                _ => rng.random_range(200..3_000),
            };
            Step {
                fault,
                partition: rng.random_range(0..PARTITIONS),
                pick: rng.random_range(0..2),
                hold_ms,
                gap_ms: rng.random_range(300..1_500),
            }
        })
        .collect()
}

/// What producers know at the end: every acknowledgement, every message they tried, and which
/// of those were sent more than once after an unclear answer.
#[derive(Default)]
struct Ledger {
    acks: Vec<Ack>,
    /// Ack times per partition, to measure how long each fault kept it unavailable.
    acked_at: BTreeMap<u32, Vec<Instant>>,
    sent: std::collections::BTreeSet<MsgId>,
    retried: std::collections::BTreeSet<MsgId>,
    attempts: u64,
    errors: BTreeMap<String, u64>,
}

/// One producer: messages `{p, s}` to partition `s % PARTITIONS` through a broker chosen at
/// random per message (a down one too: the answer is an error and the message is sent again).
async fn producer(
    p: u64,
    seed: u64,
    urls: Vec<String>,
    ledger: Arc<Mutex<Ledger>>,
    stop: Arc<AtomicBool>,
) {
    let with_ids = p.is_multiple_of(2);
    let http = reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .unwrap();
    let mut rng = StdRng::seed_from_u64(seed ^ (p << 32));
    let mut seq = 0;
    while !stop.load(Ordering::Relaxed) {
        let msg = MsgId { producer: p, seq };
        let partition = (seq % PARTITIONS as u64) as u32;
        let mut body = json!({"topic": TOPIC, "partition": partition, "content": msg.content()});
        if with_ids {
            body["id"] = json!(format!("p{p}-s{seq}"));
        }
        ledger.lock().sent.insert(msg);
        let mut via = rng.random_range(0..urls.len());
        let first = Instant::now();
        let mut tries = 0;
        loop {
            tries += 1;
            let answer = http
                .post(format!("{}/mmmq/messages", urls[via]))
                .json(&body)
                .send()
                .await;
            let outcome = match answer {
                Ok(r) if r.status() == 200 => Ok(r.json::<Value>().await),
                Ok(r) => {
                    let code = r.status().as_u16();
                    if code != 503 {
                        eprintln!(
                            "producer {p}: HTTP {code} {}",
                            r.text().await.unwrap_or_default()
                        );
                    }
                    Err(format!("HTTP {code}"))
                }
                Err(e) if e.is_connect() => Err("connection refused".to_owned()),
                Err(e) if e.is_timeout() => Err("timeout".to_owned()),
                Err(_) => Err("connection lost".to_owned()),
            };
            let acked = {
                let mut l = ledger.lock();
                l.attempts += 1;
                match outcome {
                    Ok(Ok(answer)) => {
                        let offset = answer["offset"].as_u64().expect("an offset");
                        assert_eq!(answer["partition"], partition, "{answer}");
                        l.acks.push(Ack {
                            partition: (TOPIC.to_owned(), partition),
                            offset,
                            msg,
                        });
                        l.acked_at
                            .entry(partition)
                            .or_default()
                            .push(Instant::now());
                        true
                    }
                    Ok(Err(e)) => panic!("an acknowledgement that is not JSON: {e}"),
                    Err(e) => {
                        let never_reached = e == "connection refused";
                        *l.errors.entry(e).or_default() += 1;
                        if !never_reached {
                            l.retried.insert(msg);
                        }
                        false
                    }
                }
            };
            if acked {
                break;
            }
            assert!(
                first.elapsed() < RECOVERY + REQUEST_TIMEOUT,
                "producer {p}: message {seq} unacknowledged after {tries} tries"
            );
            // Every retry goes through any broker: a producer with ids must get its message
            // stored once whichever broker it retries through.
            via = rng.random_range(0..urls.len());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        seq += 1;
    }
}

/// Runs one step's fault; answers the instant the partition lost its leader (if the fault
/// aimed at the leader).
async fn inject(c: &mut Cluster, step: Step) -> Option<Instant> {
    let p = step.partition;
    let leader = leader_of(c, p).await;
    let followers: Vec<u64> = (1..=BROKERS).filter(|b| *b != leader).collect();
    let follower = followers[step.pick % followers.len()];
    let hold = Duration::from_millis(step.hold_ms);
    match step.fault {
        Fault::KillLeader | Fault::KillFollower | Fault::LaggingFollower => {
            let victim = if step.fault == Fault::KillLeader {
                leader
            } else {
                follower
            };
            c.kill(victim);
            let at = Instant::now();
            tokio::time::sleep(hold).await;
            c.restart(victim).await;
            (step.fault == Fault::KillLeader).then_some(at)
        }
        Fault::PauseLeader => {
            c.broker(leader).signal(libc::SIGSTOP);
            let at = Instant::now();
            tokio::time::sleep(hold).await;
            c.broker(leader).signal(libc::SIGCONT);
            Some(at)
        }
        Fault::IsolateLeader | Fault::IsolateFollower => {
            let victim = if step.fault == Fault::IsolateLeader {
                leader
            } else {
                follower
            };
            c.isolate(victim).await;
            let at = Instant::now();
            tokio::time::sleep(hold).await;
            c.heal().await;
            (step.fault == Fault::IsolateLeader).then_some(at)
        }
        Fault::RestartAll => {
            for b in 1..=BROKERS {
                c.kill(b);
            }
            let at = Instant::now();
            c.restart_down().await;
            Some(at)
        }
    }
}

/// The partition's leader, once one of the running brokers names one.
async fn leader_of(c: &Cluster, p: u32) -> u64 {
    mmmq_tests::eventually_async(RECOVERY, "a partition leader", || async {
        for via in c.running() {
            if let Some(l) = c.leader_of(via, TOPIC, p).await {
                return Some(l);
            }
        }
        None
    })
    .await
}

/// One seeded run; answers its JSON summary and panics when a promise broke.
async fn run(seed: u64, steps: usize) -> Value {
    let schedule = schedule(seed, steps);
    eprintln!("cluster fault run: MMMQ_CLUSTER_FAULT_SEED={seed} {schedule:?}");
    let mut c = Cluster::start(BROKERS as usize, &["--fault-injection"]).await;
    c.meta_leader(1).await;
    let (code, body) = c
        .broker(1)
        .put(
            &format!("/mmmq/topics/{TOPIC}"),
            &json!({"partitions": PARTITIONS}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let urls: Vec<String> = (1..=BROKERS).map(|b| c.url(b)).collect();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            tokio::spawn(producer(
                p,
                seed,
                urls.clone(),
                ledger.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let mut unavailable = Vec::new();
    for step in &schedule {
        tokio::time::sleep(Duration::from_millis(step.gap_ms)).await;
        let acked_before = ledger.lock().acks.len();
        if let Some(at) = inject(&mut c, *step).await {
            // How long the partition went without an acknowledgement from the fault on.
            let p = step.partition;
            let next = mmmq_tests::eventually_async(RECOVERY, "an ack after the fault", || {
                let ledger = ledger.clone();
                async move {
                    let l = ledger.lock();
                    l.acked_at.get(&p)?.iter().rev().find(|t| **t > at).copied()
                }
            })
            .await;
            unavailable.push((next - at).as_millis() as u64);
        }
        // Producers go on after every fault.
        mmmq_tests::eventually_async(RECOVERY, "acks after the fault", || async {
            (ledger.lock().acks.len() > acked_before + PRODUCERS as usize).then_some(())
        })
        .await;
    }
    stop.store(true, Ordering::Relaxed);
    for p in producers {
        p.await.expect("producer");
    }
    c.caught_up(1).await;
    let replicas = c.stop_and_read_partitions(TOPIC, PARTITIONS).await;
    let l = ledger.lock();
    let report = check(&replicas, &l.acks, &l.sent);
    let with_ids = report
        .duplicated
        .iter()
        .filter(|m| m.producer.is_multiple_of(2))
        .count();
    assert!(
        report.duplicated.iter().all(|m| l.retried.contains(m)),
        "a message stored twice that was sent once: {report}"
    );
    let summary = json!({
        "seed": seed,
        "faults": schedule.iter().map(|s| format!("{:?}", s.fault)).collect::<Vec<_>>(),
        "acks": report.acks,
        "attempts": l.attempts,
        "errors": l.errors,
        "lost": report.lost.len(),
        "divergent": report.divergent.len(),
        "phantom": report.phantom.len(),
        "duplicatesWithoutIds": report.duplicates - with_ids,
        "duplicatesWithIds": with_ids,
        "unavailableMs": unavailable,
    });
    println!("{summary}");
    assert!(report.clean(), "seed {seed}: {report}");
    assert_eq!(
        with_ids, 0,
        "seed {seed}: messages with produce ids stored twice: {report}"
    );
    summary
}

/// Contract §13 under faults: every run of the campaign ends with the checker's zeros.
#[tokio::test(flavor = "multi_thread")]
async fn the_cluster_keeps_one_history_through_seeded_faults() {
    let runs = env_u64("MMMQ_CLUSTER_FAULT_RUNS").unwrap_or(2);
    let steps = env_u64("MMMQ_CLUSTER_FAULT_STEPS").unwrap_or(4) as usize;
    let first = env_u64("MMMQ_CLUSTER_FAULT_SEED").unwrap_or_else(|| rand::rng().random());
    let mut total = json!({"runs": 0, "acks": 0, "lost": 0, "divergent": 0, "phantom": 0,
        "duplicatesWithoutIds": 0, "duplicatesWithIds": 0});
    for i in 0..runs {
        let summary = run(first.wrapping_add(i), steps).await;
        for k in [
            "acks",
            "lost",
            "divergent",
            "phantom",
            "duplicatesWithoutIds",
            "duplicatesWithIds",
        ] {
            total[k] = json!(total[k].as_u64().unwrap() + summary[k].as_u64().unwrap());
        }
        total["runs"] = json!(i + 1);
    }
    println!("cluster fault campaign: {total}");
}

/// Every fault kind is reachable from a seed and a seed always stands for one schedule.
#[test]
fn a_seed_stands_for_one_schedule_and_covers_every_fault() {
    let a = schedule(7, 50);
    let b = schedule(7, 50);
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
    for f in FAULTS {
        assert!(a.iter().any(|s| s.fault == f), "{f:?} never drawn");
    }
}
