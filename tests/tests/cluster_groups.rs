//! Pull groups in a cluster (contract §8 and §13; docs/cluster.md, "Pull groups in a cluster"):
//! every broker answers a group's calls (the metadata leader coordinates them), each partition of
//! three members' group is owned by one member (also once a new coordinator rebuilt it), partitions
//! without a replica on the coordinator are read through their leader, and the group's commits survive the coordinator's SIGKILL: the next
//! coordinator starts each partition exactly at its committed offset.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use mmmq_tests::cluster::Cluster;
use serde_json::{Value, json};

/// (topic, partition) → next offset.
type Positions = BTreeMap<(String, u64), u64>;

async fn poll(c: &Cluster, via: u64, member: &str) -> Option<Value> {
    let (code, body) = c
        .broker(via)
        .get(&format!(
            "/mmmq/groups/g/messages?member={member}&pattern=g.*&max=1000&sessionTimeoutMs=60000"
        ))
        .await;
    ok_unless_503(code, body, &format!("poll of {member} through {via}"))
}

/// An answer of `200`; `None` for a `503` (the metadata group electing a new leader, a new
/// coordinator not yet sure of its quorum: tried again); anything else fails the test.
fn ok_unless_503(code: u16, body: Value, what: &str) -> Option<Value> {
    match code {
        200 => Some(body),
        503 => None,
        other => panic!("{what}: HTTP {other} {body}"),
    }
}

fn assignment(answer: &Value) -> BTreeSet<(String, u64)> {
    answer["assignment"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["topic"].as_str().unwrap().to_owned(),
                a["partition"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Polls `member` through `via` until `want` messages arrived in total; records each message's
/// (topic, partition, offset) and the first offset seen per partition.
async fn consume(
    c: &Cluster,
    via: u64,
    member: &str,
    seen: &mut Vec<(String, u64, u64)>,
    want: usize,
) -> Positions {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while seen.len() < want {
        assert!(
            std::time::Instant::now() < deadline,
            "{member} read {seen:?}"
        );
        if let Some(answer) = poll(c, via, member).await {
            seen.extend(messages(&answer));
        }
    }
    let mut next = Positions::new();
    for (t, p, o) in seen.iter() {
        let n = next.entry((t.clone(), *p)).or_insert(0);
        *n = (*n).max(o + 1);
    }
    next
}

fn messages(answer: &Value) -> Vec<(String, u64, u64)> {
    answer["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["topic"].as_str().unwrap().to_owned(),
                m["partition"].as_u64().unwrap(),
                m["offset"].as_u64().unwrap(),
            )
        })
        .collect()
}

async fn commit(c: &Cluster, via: u64, member: &str, positions: &Positions) {
    let offsets: Vec<Value> = positions
        .iter()
        .map(|((t, p), o)| json!({"topic": t, "partition": p, "offset": o}))
        .collect();
    let body = json!({"member": member, "offsets": offsets});
    mmmq_tests::eventually_async(Duration::from_secs(10), "a commit", || async {
        let (code, answer) = c.broker(via).post("/mmmq/groups/g/commit", &body).await;
        ok_unless_503(code, answer, &format!("commit of {member} through {via}"))
    })
    .await;
}

async fn produce(c: &Cluster, topic: &str, partitions: u64, from: u64, n: u64) {
    let batch: Vec<Value> = (from..from + n)
        .map(|i| json!({"topic": topic, "partition": i % partitions, "content": {"n": i}}))
        .collect();
    let (code, body) = c
        .broker(1)
        .post("/mmmq/messages/batch", &json!(batch))
        .await;
    assert_eq!(code, 200, "{body}");
}

/// The members after the coordinator's failover and the survivor each polls through (`c`'s
/// broker died with the coordinator).
const MEMBERS_AFTER: [(&str, usize); 3] = [("a", 0), ("b", 1), ("c", 0)];

/// Every partition owned by exactly one member.
fn assert_one_owner(owned: &[BTreeSet<(String, u64)>]) {
    let mut all = BTreeSet::new();
    for o in owned {
        for p in o {
            assert!(all.insert(p.clone()), "{p:?} owned twice: {owned:?}");
        }
    }
    assert_eq!(all.len(), 6, "{owned:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_group_is_served_by_any_broker_and_keeps_its_commits_across_a_coordinator_failover() {
    let mut c = Cluster::start(3, &[]).await;
    let coordinator = c.meta_leader(1).await;
    for (topic, rf) in [("g.w", 3), ("g.n", 1)] {
        let (code, body) = c
            .broker(1)
            .put(
                &format!("/mmmq/topics/{topic}"),
                &json!({"partitions": 3, "replicationFactor": rf}),
            )
            .await;
        assert_eq!(code, 200, "{body}");
    }
    // Three members join (nothing to read yet), each through a broker of its own (`c` through
    // the coordinator's); the coordinator shares the six partitions, two each.
    let others: Vec<u64> = (1..=3).filter(|b| *b != coordinator).collect();
    let (via_a, via_b) = (others[0], others[1]);
    poll(&c, via_a, "a").await.expect("a joins");
    poll(&c, via_b, "b").await.expect("b joins");
    let m3 = poll(&c, coordinator, "c").await.expect("c joins");
    let b = poll(&c, via_b, "b").await.expect("b polls");
    let a = poll(&c, via_a, "a").await.expect("a polls");
    produce(&c, "g.w", 3, 0, 30).await;
    produce(&c, "g.n", 3, 0, 30).await;
    let owned = [assignment(&a), assignment(&b), assignment(&m3)];
    assert_one_owner(&owned);
    // Any broker shows the same group (the coordinator's).
    for via in 1..=3 {
        let (code, status) = c.broker(via).get("/mmmq/groups/g").await;
        assert_eq!(code, 200, "{status}");
        assert_eq!(status["members"].as_array().unwrap().len(), 3, "{status}");
    }
    // Each reads its partitions whole (those without a replica on the coordinator through
    // their leader), and commits.
    let mut seen_a = messages(&a);
    let mut seen_b = messages(&b);
    let mut seen_c = messages(&m3);
    let next_a = consume(&c, via_a, "a", &mut seen_a, 10 * owned[0].len()).await;
    let next_b = consume(&c, via_b, "b", &mut seen_b, 10 * owned[1].len()).await;
    let next_c = consume(&c, coordinator, "c", &mut seen_c, 10 * owned[2].len()).await;
    let all: BTreeSet<(String, u64, u64)> = seen_a
        .iter()
        .chain(&seen_b)
        .chain(&seen_c)
        .cloned()
        .collect();
    assert_eq!(all.len(), 60, "every message of both topics read");
    assert_eq!(
        seen_a.len() + seen_b.len() + seen_c.len(),
        60,
        "and each once"
    );
    commit(&c, via_a, "a", &next_a).await;
    commit(&c, via_b, "b", &next_b).await;
    commit(&c, coordinator, "c", &next_c).await;

    // More messages; the coordinator dies; the members go on through the brokers left (`c`
    // through another one).
    produce(&c, "g.w", 3, 30, 30).await;
    c.kill(coordinator);
    let mut after = Vec::new();
    let survivors = [via_a, via_b];
    let mut first: BTreeMap<(String, u64), u64> = BTreeMap::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        for (member, via) in MEMBERS_AFTER.map(|(m, i)| (m, survivors[i])) {
            if let Some(answer) = poll(&c, via, member).await {
                for (t, p, o) in messages(&answer) {
                    first.entry((t.clone(), p)).or_insert(o);
                    after.push((t, p, o));
                }
            }
        }
        let new: BTreeSet<(u64, u64)> = after
            .iter()
            .filter(|(t, _, o)| t == "g.w" && *o >= 10)
            .map(|(_, p, o)| (*p, *o))
            .collect();
        if new.len() >= 30 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "after the failover: {after:?}"
        );
    }
    // The new coordinator rebuilt the group: once the members' rounds of polls stop moving
    // partitions (each rejoin rebalances), every partition has one owner.
    let mut previous = Vec::new();
    for round in 0.. {
        let mut owned = Vec::new();
        for (member, via) in MEMBERS_AFTER.map(|(m, i)| (m, survivors[i])) {
            let answer =
                mmmq_tests::eventually_async(Duration::from_secs(10), "a poll", || async {
                    poll(&c, via, member).await
                })
                .await;
            owned.push(assignment(&answer));
        }
        if owned == previous {
            assert_one_owner(&owned);
            break;
        }
        assert!(round < 10, "the group never settled: {owned:?}");
        previous = owned;
    }
    // The new coordinator started every partition it handed out at the group's commit: nothing
    // committed came again.
    let committed: Positions = next_a.into_iter().chain(next_b).chain(next_c).collect();
    for ((t, p), o) in &first {
        assert_eq!(
            Some(o),
            committed.get(&(t.clone(), *p)),
            "{t}/{p} restarted at {o}"
        );
    }
    // And any survivor shows the commits.
    let status =
        mmmq_tests::eventually_async(Duration::from_secs(10), "the group's status", || async {
            let (code, status) = c.broker(survivors[0]).get("/mmmq/groups/g").await;
            (code == 200).then_some(status)
        })
        .await;
    for part in status["partitions"].as_array().unwrap() {
        if part["topic"] == "g.w" {
            assert!(part["committed"].as_u64().unwrap() >= 10, "{status}");
        }
    }
}
