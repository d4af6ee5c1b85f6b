//! Budgets of things that grow with what clients do (docs/guarantees.md, "Security"): the pull
//! consumer groups a broker holds (`--max-groups`, and `GET /mmmq/groups` a page at a time) and
//! the produce ids it remembers over every topic (`--max-produce-ids`).

use std::time::Duration;

use mmmq_tests::{Broker, eventually_async};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

async fn poll(broker: &Broker, group: &str) -> (u16, Value) {
    broker
        .get(&format!("/mmmq/groups/{group}/messages?member=m&pattern=t"))
        .await
}

/// Past `--max-groups` a new group's first poll is `503` naming the flag (and counted), while
/// the groups held go on; the list comes a page at a time, with a `Link` to the next.
#[tokio::test(flavor = "multi_thread")]
async fn groups_past_the_cap_are_refused_and_the_list_is_paged() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start_with(tmp.path(), &["--max-groups", "3"]).await;
    broker.produce("t", json!({"n": 0})).await;
    for g in ["g0", "g1", "g2"] {
        let (status, body) = poll(&broker, g).await;
        assert_eq!(status, 200, "{g}: {body}");
        assert_eq!(body["messages"][0]["content"], json!({"n": 0}), "{g}");
    }
    let (status, body) = poll(&broker, "g3").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body["error"],
        "the broker holds 3 groups (--max-groups); group \"g3\" cannot start until one goes (a group without members is forgotten 600 s after its last poll)"
    );
    // The groups held still poll.
    assert_eq!(poll(&broker, "g1").await.0, 200);
    assert_eq!(broker.metric("mmmq_groups").await, 3.0);
    assert_eq!(broker.metric("mmmq_max_groups").await, 3.0);
    assert_eq!(broker.metric("mmmq_groups_refused_total").await, 1.0);

    // A page at a time.
    let page = |path: &'static str| {
        let http = broker.http.clone();
        let url = format!("{}{path}", broker.url);
        async move {
            let r = http.get(url).send().await.unwrap();
            let status = r.status().as_u16();
            let link = r
                .headers()
                .get("link")
                .map(|l| l.to_str().unwrap().to_owned());
            let body: Value = r.json().await.unwrap();
            (status, body, link)
        }
    };
    let names = |body: &Value| -> Vec<String> {
        body.as_array()
            .unwrap()
            .iter()
            .map(|g| g["group"].as_str().unwrap().to_owned())
            .collect()
    };
    let (status, body, link) = page("/mmmq/groups?limit=2").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(names(&body), ["g0", "g1"]);
    assert_eq!(
        link.as_deref(),
        Some("</mmmq/groups?after=g1&limit=2>; rel=\"next\"")
    );
    let (_, body, link) = page("/mmmq/groups?after=g1&limit=2").await;
    assert_eq!((names(&body), link), (vec!["g2".to_owned()], None));
    let (_, body, link) = page("/mmmq/groups").await;
    assert_eq!((names(&body).len(), link), (3, None));
    for bad in [
        "/mmmq/groups?limit=0",
        "/mmmq/groups?limit=1001",
        "/mmmq/groups?page=2",
    ] {
        let (status, body, _) = page(bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
}

/// A group takes at most 1,000 live members: the next new one is `503` (counted with the refused
/// groups), the members in it poll on.
#[tokio::test(flavor = "multi_thread")]
async fn a_group_takes_at_most_a_thousand_members() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    let join = |member: String| {
        let broker = &broker;
        async move {
            broker
                .get(&format!(
                    "/mmmq/groups/big/messages?member={member}&pattern=t"
                ))
                .await
        }
    };
    for m in 0..1000 {
        let (status, body) = join(format!("m{m}")).await;
        assert_eq!(status, 200, "m{m}: {body}");
    }
    let (status, body) = join("one-more".into()).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body["error"],
        "group \"big\" has 1000 live members, the most a group takes; a new member can join once one leaves or its session times out"
    );
    assert_eq!(join("m7".into()).await.0, 200);
    assert_eq!(broker.metric("mmmq_groups_refused_total").await, 1.0);
}

/// Past `--max-produce-ids` the topic that claims a new id forgets its oldest first (each one
/// counted, the log warned): the newest ids stay deduplicated, a forgotten one is stored again,
/// and the broker holds about the budget (one shard of a topic may pass it by one id).
#[tokio::test(flavor = "multi_thread")]
async fn produce_ids_over_every_topic_stay_within_their_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start_with(
        tmp.path(),
        &["--max-produce-ids", "100", "--retention-check-ms", "100"],
    )
    .await;
    let produce = |id: String| {
        let broker = &broker;
        async move {
            let (status, body) = broker
                .post(
                    "/mmmq/messages",
                    &json!({"topic": "t", "id": id, "content": {"id": id}}),
                )
                .await;
            assert_eq!(status, 200, "{body}");
            body
        }
    };
    for n in 0..300 {
        let body = produce(format!("i{n}")).await;
        assert_eq!(body["offset"], n, "{body}");
    }
    let held = broker.metric("mmmq_produce_ids").await;
    let forgotten = broker
        .metric("mmmq_produce_ids_forgotten_early_total")
        .await;
    assert_eq!(
        held + forgotten,
        300.0,
        "held {held}, forgotten {forgotten}"
    );
    assert!((100.0..=116.0).contains(&held), "held {held}");
    assert_eq!(broker.metric("mmmq_max_produce_ids").await, 100.0);
    mmmq_tests::eventually(WAIT, "the warning", || {
        let log = broker.log.lock();
        log.contains("more produce ids than the broker remembers (--max-produce-ids)")
            .then_some(())
    })
    .await;
    // The newest is remembered; the oldest was forgotten (its shard took ~12 claims since).
    let again = produce("i299".into()).await;
    assert_eq!(
        (&again["duplicate"], &again["offset"]),
        (&json!(true), &json!(299))
    );
    let again = produce("i0".into()).await;
    assert_eq!(
        (&again["duplicate"], &again["offset"]),
        (&json!(null), &json!(300))
    );
}

/// Ids past their window are freed by the retention pass, also in a topic nobody produces to any
/// more (before, they held the budget until that topic's next produce).
#[tokio::test(flavor = "multi_thread")]
async fn an_idle_topics_ids_leave_the_budget_once_their_window_has_passed() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start_with(tmp.path(), &["--retention-check-ms", "100"]).await;
    let (status, body) = broker
        .put("/mmmq/topics/idle", &json!({"dedupWindowMs": 1000}))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = broker
        .post(
            "/mmmq/messages/batch",
            &json!(
                (0..5)
                    .map(|n| json!({"topic": "idle", "id": format!("x{n}"), "content": n}))
                    .collect::<Vec<_>>()
            ),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(broker.metric("mmmq_produce_ids").await, 5.0);
    eventually_async(WAIT, "the idle topic's ids expire", || async {
        (broker.metric("mmmq_produce_ids").await == 0.0).then_some(())
    })
    .await;
}
