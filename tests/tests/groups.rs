//! Pull consumer groups end to end (docs/topics-and-groups.md, "Consumer groups"): balanced ownership, positions,
//! commits, session timeouts and `409` for a member that lost its partitions.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use mmmq_tests::Broker;
use serde_json::{Value, json};

/// Polls as `member`; `c` is the one that goes silent, with a short session timeout (long enough
/// for a loaded machine between its polls), the others have a long one.
async fn poll(broker: &Broker, member: &str) -> Value {
    let session = if member == "c" { 3000 } else { 60_000 };
    let (status, body) = broker
        .get(&format!(
            "/mmmq/groups/g/messages?member={member}&pattern=g6&max=1000&sessionTimeoutMs={session}"
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    body
}

fn partitions_of(answer: &Value) -> BTreeSet<u64> {
    answer["assignment"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["partition"].as_u64().unwrap())
        .collect()
}

async fn commit(broker: &Broker, member: &str, partition: u64, offset: u64) -> (u16, Value) {
    broker
        .post(
            "/mmmq/groups/g/commit",
            &json!({"member": member, "offsets": [{"topic": "g6", "partition": partition, "offset": offset}]}),
        )
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn three_members_share_six_partitions_and_a_silent_one_hands_them_over_at_the_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    broker
        .put("/mmmq/topics/g6", &json!({"partitions": 6}))
        .await;
    // Everyone joins (nothing to read yet); then each owns two partitions, none shared.
    for m in ["a", "b", "c"] {
        poll(&broker, m).await;
    }
    let batch: Vec<Value> = (0..60)
        .map(|n| json!({"topic": "g6", "content": {"n": n}}))
        .collect();
    let (status, b) = broker.post("/mmmq/messages/batch", &json!(batch)).await;
    assert_eq!(status, 200, "{b}");
    let status = broker.get("/mmmq/groups/g").await.1;
    let mut owned: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for m in status["members"].as_array().unwrap() {
        let parts = m["assignment"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["partition"].as_u64().unwrap())
            .collect::<BTreeSet<_>>();
        assert_eq!(parts.len(), 2, "{status}");
        owned.insert(m["member"].as_str().unwrap().to_owned(), parts);
    }
    let all: BTreeSet<u64> = owned.values().flatten().copied().collect();
    assert_eq!(all, (0..6).collect(), "{status}");
    // Each member reads its partitions from the committed offset (0), and only those.
    let mut got: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for m in ["a", "b", "c"] {
        let answer = poll(&broker, m).await;
        assert_eq!(partitions_of(&answer), owned[m]);
        let msgs = answer["messages"].as_array().unwrap().clone();
        assert!(
            msgs.iter()
                .all(|e| owned[m].contains(&e["partition"].as_u64().unwrap()))
        );
        assert_eq!(msgs.len(), 20, "{m}: {answer}");
        got.insert(m.to_owned(), msgs);
    }
    // a and b commit everything; c commits 4 of one partition and nothing of the other.
    for m in ["a", "b"] {
        for &p in &owned[m] {
            let (status, body) = commit(&broker, m, p, 10).await;
            assert_eq!(status, 200, "{body}");
        }
    }
    let c_parts: Vec<u64> = owned["c"].iter().copied().collect();
    assert_eq!(commit(&broker, "c", c_parts[0], 4).await.0, 200);
    // A commit past the partition's end, or for a partition not owned, is refused.
    assert_eq!(commit(&broker, "a", c_parts[0], 5).await.0, 409);
    let (status, e) = commit(&broker, "c", c_parts[1], 11).await;
    assert_eq!(status, 400, "{e}");
    // c goes silent; a and b keep polling and take its partitions after the session timeout,
    // from c's committed offsets.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut taken: Vec<Value> = Vec::new();
    loop {
        for m in ["a", "b"] {
            let answer = poll(&broker, m).await;
            taken.extend(answer["messages"].as_array().unwrap().iter().cloned());
        }
        let status = broker.get("/mmmq/groups/g").await.1;
        let members = status["members"].as_array().unwrap().len();
        let covered: usize = taken.len();
        if members == 2 && covered >= 16 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "c's partitions never moved: {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let offsets = |p: u64| -> Vec<u64> {
        taken
            .iter()
            .filter(|e| e["partition"] == p)
            .map(|e| e["offset"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(offsets(c_parts[0]), (4..10).collect::<Vec<_>>());
    assert_eq!(offsets(c_parts[1]), (0..10).collect::<Vec<_>>());
    assert!(
        taken
            .iter()
            .all(|e| c_parts.contains(&e["partition"].as_u64().unwrap()))
    );
    // The old owner's commit is refused now.
    let (status, e) = commit(&broker, "c", c_parts[0], 10).await;
    assert_eq!(status, 409, "{e}");
    // Lag: partitions all committed by their owners are at 0 after they commit.
    let status = broker.get("/mmmq/groups/g").await.1;
    let lag: u64 = status["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["lag"].as_u64().unwrap())
        .sum();
    assert_eq!(lag, 6 + 10, "{status}");
    // Committed offsets are durable: a restart keeps them.
    assert!(broker.terminate().success());
    let broker = Broker::start(tmp.path()).await;
    let answer = poll(&broker, "z").await;
    let firsts: BTreeMap<u64, u64> =
        answer["messages"]
            .as_array()
            .unwrap()
            .iter()
            .fold(BTreeMap::new(), |mut m, e| {
                m.entry(e["partition"].as_u64().unwrap())
                    .or_insert(e["offset"].as_u64().unwrap());
                m
            });
    assert_eq!(firsts.get(&c_parts[0]), Some(&4));
    assert_eq!(firsts.get(&c_parts[1]), Some(&0));
    assert_eq!(
        firsts.len(),
        2,
        "the others were committed at their end: {firsts:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_group_requests_are_refused_naming_the_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    for (path, what) in [
        ("/mmmq/groups/g/messages?member=a%20b&pattern=x", "member"),
        ("/mmmq/groups/g/messages?member=a&pattern=a..b", "pattern"),
        ("/mmmq/groups/g%2Fx/messages?member=a&pattern=x", "group"),
        (
            "/mmmq/groups/g/messages?member=a&pattern=x&sessionTimeoutMs=1",
            "sessionTimeoutMs",
        ),
    ] {
        let (status, e) = broker.get(path).await;
        assert_eq!(status, 400, "{path}: {e}");
        assert!(e["error"].as_str().unwrap().contains(what), "{path}: {e}");
    }
    // The pattern is fixed at the first poll.
    assert_eq!(
        broker
            .get("/mmmq/groups/g/messages?member=a&pattern=x")
            .await
            .0,
        200
    );
    let (status, e) = broker
        .get("/mmmq/groups/g/messages?member=b&pattern=y")
        .await;
    assert_eq!(status, 400, "{e}");
    let (status, _) = broker.get("/mmmq/groups/nope").await;
    assert_eq!(status, 404);
    let (status, _) = broker.delete("/mmmq/groups/g/members/a").await;
    assert_eq!(status, 200);
    let (status, _) = broker.delete("/mmmq/groups/g/members/a").await;
    assert_eq!(status, 404);
}

/// `mmmq-client`'s `GroupConsumer`: two members share a topic's partitions, read every message
/// once between them, and auto-commit what they processed; `mmmq groups` shows the group.
#[tokio::test(flavor = "multi_thread")]
async fn group_consumers_from_the_client_crate_share_a_topic_and_commit() {
    use futures_util::StreamExt;
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    broker
        .put("/mmmq/topics/gc", &json!({"partitions": 4}))
        .await;
    let member = |name: &str| {
        mmmq_client::GroupConsumer::new(&broker.url, "workers", name, "gc")
            .unwrap()
            .wait(Duration::from_millis(200))
            .max(7)
    };
    let (mut one, mut two) = (member("one"), member("two"));
    // Both join before there is anything to read.
    one.poll().await.unwrap();
    two.poll().await.unwrap();
    for n in 0..80 {
        broker.produce("gc", json!({"n": n})).await;
    }
    let mut seen = BTreeSet::new();
    let (s1, s2) = (Box::pin(one.into_stream()), Box::pin(two.into_stream()));
    let mut both = futures_util::stream::select(s1, s2);
    while seen.len() < 80 {
        let e = tokio::time::timeout(Duration::from_secs(30), both.next())
            .await
            .expect("messages keep coming")
            .unwrap()
            .unwrap();
        assert!(seen.insert(e.content.get().to_owned()), "{e:?} twice");
    }
    // The last batches are committed at the members' next polls.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let _ = tokio::time::timeout(Duration::from_millis(300), both.next()).await;
        let status = broker.get("/mmmq/groups/workers").await.1;
        let lag: u64 = status["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["lag"].as_u64().unwrap())
            .sum();
        if lag == 0 {
            assert_eq!(status["members"].as_array().unwrap().len(), 2, "{status}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never committed: {status}"
        );
    }
    let out = std::process::Command::new(mmmq_tests::mmmq_bin())
        .args(["groups", "--broker", &broker.url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("GROUP"), "{text}");
    assert!(
        text.contains("workers") && text.contains("one,two"),
        "{text}"
    );
}

/// A poll answers up to `max` messages over the member's partitions: what idle partitions leave
/// is filled from a busy one (it used to get `max` ÷ partitions from each).
#[tokio::test(flavor = "multi_thread")]
async fn a_poll_fills_max_from_the_partitions_that_have_messages() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    let (status, body) = broker
        .put("/mmmq/topics/busy", &json!({"partitions": 4}))
        .await;
    assert_eq!(status, 200, "{body}");
    let batch: Vec<Value> = (0..30)
        .map(|n| json!({"topic": "busy", "partition": 1, "content": n}))
        .collect();
    let (status, body) = broker.post("/mmmq/messages/batch", &json!(batch)).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = broker
        .get("/mmmq/groups/g/messages?member=only&pattern=busy&max=20")
        .await;
    assert_eq!(status, 200, "{body}");
    let got: Vec<u64> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(got, (0..20).collect::<Vec<_>>(), "{body}");
    let (_, body) = broker
        .get("/mmmq/groups/g/messages?member=only&pattern=busy&max=20")
        .await;
    assert_eq!(body["messages"].as_array().unwrap().len(), 10, "{body}");
    assert_eq!(body["messages"][0]["offset"], 20, "{body}");
}

/// A group name as long as a consumer id may be (240) commits, and its commit is there after a
/// restart; one character more is refused up front (before the cap was 240, names of 241–243
/// characters were taken and every commit of theirs failed: `{name}.checkpoint.tmp` is over the
/// file system's 255 bytes).
#[tokio::test(flavor = "multi_thread")]
async fn the_longest_group_name_commits_and_a_longer_one_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    let (status, _) = broker
        .post("/mmmq/messages", &json!({"topic": "long", "content": 1}))
        .await;
    assert_eq!(status, 200);
    let too_long = "g".repeat(241);
    let (status, e) = broker
        .get(&format!(
            "/mmmq/groups/{too_long}/messages?member=a&pattern=long"
        ))
        .await;
    assert_eq!(status, 400, "{e}");
    assert!(e["error"].as_str().unwrap().contains("consumerId"), "{e}");
    let longest = "g".repeat(240);
    let (status, body) = broker
        .get(&format!(
            "/mmmq/groups/{longest}/messages?member=a&pattern=long"
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, e) = broker
        .post(
            &format!("/mmmq/groups/{longest}/commit"),
            &json!({"member": "a", "offsets": [{"topic": "long", "partition": 0, "offset": 1}]}),
        )
        .await;
    assert_eq!(status, 200, "{e}");
    broker.kill();
    let broker = Broker::start(tmp.path()).await;
    let (status, body) = broker
        .get(&format!(
            "/mmmq/groups/{longest}/messages?member=a&pattern=long"
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["messages"], json!([]), "resumed at its commit: {body}");
}
