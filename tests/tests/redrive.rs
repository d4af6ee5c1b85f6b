//! Dead-letter redrive end to end (docs/delivery.md, "Dead-letter redrive"): `POST
//! /mmmq/dispatchers/{consumerId}/redrive` delivers the original envelopes again to that
//! dispatcher only, in order; a message that fails again is dead-lettered again with its history;
//! `mmmq dlq list|redrive`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use mmmq_tests::{Answer, Broker, Consumer, host_dispatcher, write_dispatchers};
use serde_json::{Value, json};

fn dispatcher(id: &str, pattern: &str, port: u16, retries: u32) -> Value {
    let mut d = host_dispatcher(id, pattern, port);
    d["maxNackRetries"] = json!(retries);
    d
}

fn n_of(e: &Value) -> u64 {
    e["content"]["n"].as_u64().unwrap()
}

async fn redrive_done(broker: &Broker, id: &str) -> Value {
    let s = broker
        .dispatcher_when(id, |s| s["redrive"]["running"] == false)
        .await;
    s["redrive"].clone()
}

fn cli(broker: &Broker, args: &[&str]) -> (bool, String) {
    let out = broker.cli(args);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// Odd messages are NACKed into the dead-letter topic; the consumer is fixed; a redrive delivers
/// exactly those again, in order, to it alone; a second redrive finds nothing left, also after a
/// restart; `from` redrives a range again.
#[tokio::test(flavor = "multi_thread")]
async fn a_redrive_to_a_consumer_that_now_acks_delivers_the_originals_to_it_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let fixed = Arc::new(AtomicBool::new(false));
    let f = fixed.clone();
    let picky = Consumer::start_on(
        0,
        Arc::new(move |e: &Value| {
            if !f.load(Ordering::SeqCst) && n_of(e) % 2 == 1 {
                Answer::Nack
            } else {
                Answer::Ack
            }
        }),
    )
    .await;
    let other = Consumer::start().await;
    write_dispatchers(
        tmp.path(),
        &json!([
            dispatcher("picky", "rd", picky.port, 0),
            dispatcher("other", "rd", other.port, 0)
        ]),
    );
    let broker = Broker::start(tmp.path()).await;
    for n in 0..6 {
        broker.produce("rd", json!({"n": n})).await;
    }
    broker
        .dispatcher_when("picky", |s| s["deadLettered"] == 3 && s["lag"] == 0)
        .await;
    fixed.store(true, Ordering::SeqCst);
    let before = picky.envelopes().len();

    let (status, body) = broker
        .post("/mmmq/dispatchers/picky/redrive", &json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["partitions"][0]["from"], 0, "{body}");
    assert_eq!(body["partitions"][0]["to"], 3, "{body}");
    let r = redrive_done(&broker, "picky").await;
    assert_eq!(
        (&r["redriven"], &r["delivered"]),
        (&json!(3), &json!(3)),
        "{r}"
    );
    assert_eq!(r["remaining"], 0, "{r}");
    let again: Vec<(u64, u64)> = picky.envelopes()[before..]
        .iter()
        .map(|e| (e["offset"].as_u64().unwrap(), n_of(e)))
        .collect();
    assert_eq!(again, [(1, 1), (3, 3), (5, 5)], "the originals, in order");
    assert_eq!(picky.envelopes()[before]["topic"], "rd");
    assert_eq!(
        other.envelopes().len(),
        6,
        "other dispatchers see no redrive"
    );

    // Nothing left: the position of the last redrive is kept, also across a restart.
    let (_, body) = broker
        .post_raw("/mmmq/dispatchers/picky/redrive", String::new())
        .await;
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["remaining"], 0, "{body}");
    assert!(broker.terminate().success());
    let broker = Broker::start(tmp.path()).await;
    let (status, body) = broker
        .post("/mmmq/dispatchers/picky/redrive", &json!({}))
        .await;
    assert_eq!((status, &body["remaining"]), (200, &json!(0)), "{body}");
    assert_eq!(redrive_done(&broker, "picky").await["redriven"], 0);

    // An explicit range goes again.
    let (status, body) = broker
        .post(
            "/mmmq/dispatchers/picky/redrive",
            &json!({"from": 1, "to": 2}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(redrive_done(&broker, "picky").await["delivered"], 1);
    assert_eq!(n_of(picky.envelopes().last().unwrap()), 3);
}

/// A consumer that still NACKs: the redriven message is dead-lettered again, at the end of the
/// same topic, with the earlier failure in its history; the next redrive takes that one, and its
/// history grows. `mmmq dlq list` and `mmmq dlq redrive --wait` show the same.
#[tokio::test(flavor = "multi_thread")]
async fn a_message_that_fails_again_is_dead_lettered_again_with_its_history() {
    let tmp = tempfile::tempdir().unwrap();
    let stubborn = Consumer::start_on(
        0,
        Arc::new(|e: &Value| {
            if n_of(e) == 1 {
                Answer::Nack
            } else {
                Answer::Ack
            }
        }),
    )
    .await;
    write_dispatchers(
        tmp.path(),
        &json!([dispatcher("stub", "st", stubborn.port, 1)]),
    );
    let broker = Broker::start(tmp.path()).await;
    for n in 0..3 {
        broker.produce("st", json!({"n": n})).await;
    }
    broker
        .dispatcher_when("stub", |s| s["deadLettered"] == 1 && s["lag"] == 0)
        .await;
    let (status, body) = broker
        .post("/mmmq/dispatchers/stub/redrive", &json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    let r = redrive_done(&broker, "stub").await;
    assert_eq!(
        (&r["deadLettered"], &r["nacked"], &r["delivered"]),
        (&json!(1), &json!(2), &json!(0)),
        "{r}"
    );
    // The redrive's last problem: when, and not over (nothing was ACKed after it).
    assert!(
        r["lastError"].as_str().unwrap().contains("dead-lettered"),
        "{r}"
    );
    assert!(r["lastErrorAt"].is_u64(), "{r}");
    assert_eq!(r["lastErrorResolvedAt"], Value::Null, "{r}");
    let dlq = broker.pull_all("__dlq.stub").await;
    assert_eq!(dlq.len(), 2);
    let second = &dlq[1]["content"];
    assert_eq!(second["attempts"], 2, "{second}");
    assert_eq!(second["envelope"]["offset"], 1, "{second}");
    assert_eq!(second["history"][0]["attempts"], 2, "{second}");
    assert_eq!(second["history"][0]["dlqOffset"], 0, "{second}");
    assert!(
        second["history"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("NACK"),
        "{second}"
    );

    let (ok, text) = cli(&broker, &["dlq", "redrive", "stub", "--wait"]);
    assert!(ok, "{text}");
    assert!(
        text.contains("done: 1 redriven (0 delivered, 1 dead-lettered again"),
        "{text}"
    );
    let dlq = broker.pull_all("__dlq.stub").await;
    assert_eq!(dlq.len(), 3);
    assert_eq!(dlq[2]["content"]["history"].as_array().unwrap().len(), 2);
    // Each dead letter: how many redrives of its message failed before it (its history), and
    // whether a redrive took it (the two redrives took offsets 0 and 1; 2 waits for the next).
    let (ok, text) = cli(&broker, &["dlq", "list", "stub"]);
    assert!(ok, "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    let columns = [
        "OFFSET",
        "TOPIC",
        "PARTITION",
        "FROM OFFSET",
        "ATTEMPTS",
        "FAILED REDRIVES",
        "REDRIVEN",
        "REASON",
    ];
    let starts: Vec<usize> = columns
        .iter()
        .map(|c| {
            lines[0]
                .find(c)
                .unwrap_or_else(|| panic!("no {c}:\n{text}"))
        })
        .collect();
    assert!(starts.is_sorted(), "{text}");
    let cells = |line: &str| -> Vec<String> {
        (0..columns.len())
            .map(|i| {
                let end = starts.get(i + 1).copied().unwrap_or(line.len());
                line[starts[i]..end].trim().to_owned()
            })
            .collect()
    };
    let rows: Vec<Vec<String>> = lines[1..].iter().map(|l| cells(l)).collect();
    let reason = format!(
        "http://127.0.0.1:{}/mmmq/messages answered NACK",
        stubborn.port
    );
    for (i, redriven) in ["yes", "yes", "no"].iter().enumerate() {
        let want = [
            format!("0/{i}"),
            "st".into(),
            "0".into(),
            "1".into(),
            "2".into(),
            i.to_string(),
            redriven.to_string(),
            reason.clone(),
        ];
        assert_eq!(rows[i], want, "{text}");
    }
    assert_eq!(
        broker.dispatcher("stub").await["redriveNext"],
        json!([{"partition": 0, "next": 2}])
    );
    let (ok, text) = cli(&broker, &["dlq", "list", "nobody"]);
    assert!(ok && text.contains("no dead letters"), "{text}");
}

/// Unknown dispatchers are `404`, `from > to` and bad bodies `400`, a second redrive while one
/// runs (its consumer is down) `409`.
#[tokio::test(flavor = "multi_thread")]
async fn bad_redrives_are_refused_naming_the_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let nacker = Consumer::start_on(0, Arc::new(|_: &Value| Answer::Nack)).await;
    let port = nacker.port;
    write_dispatchers(tmp.path(), &json!([dispatcher("bad", "bd", port, 0)]));
    let broker = Broker::start(tmp.path()).await;
    broker.produce("bd", json!({"n": 0})).await;
    broker
        .dispatcher_when("bad", |s| s["deadLettered"] == 1)
        .await;

    let (status, body) = broker
        .post("/mmmq/dispatchers/nobody/redrive", &json!({}))
        .await;
    assert_eq!(status, 404, "{body}");
    assert!(body["error"].as_str().unwrap().contains("nobody"), "{body}");
    for (req, want) in [
        (json!({"from": 5, "to": 2}), "`from` (5) is after `to` (2)"),
        (json!({"from": -1}), "invalid JSON body"),
        (json!({"since": 0}), "unknown field `since`"),
    ] {
        let (status, body) = broker.post("/mmmq/dispatchers/bad/redrive", &req).await;
        assert_eq!(status, 400, "{req}: {body}");
        assert!(
            body["error"].as_str().unwrap().contains(want),
            "{req}: {body}"
        );
    }
    let (status, body) = broker
        .post_raw("/mmmq/dispatchers/bad/redrive", "{not json".into())
        .await;
    assert_eq!(status, 400, "{body}");

    // A range past the end of the dead-letter topic (one dead letter: its end is 1) is refused:
    // it would take the dead letters the redrive itself writes, without end.
    for (req, bound, value) in [
        (json!({"from": u64::MAX}), "from", u64::MAX),
        (json!({"from": 2}), "from", 2),
        (json!({"from": 0, "to": 5}), "to", 5),
    ] {
        let (status, body) = broker.post("/mmmq/dispatchers/bad/redrive", &req).await;
        assert_eq!(status, 400, "{req}: {body}");
        assert_eq!(
            body["error"],
            format!(
                "`{bound}` ({value}) is past the end of the dead-letter topic __dlq.bad (its next offset is 1)"
            ),
            "{req}"
        );
    }
    // A range that ends where the topic ends is empty, and over at once.
    let (status, body) = broker
        .post("/mmmq/dispatchers/bad/redrive", &json!({"from": 1}))
        .await;
    assert_eq!(status, 200, "{body}");
    let done = redrive_done(&broker, "bad").await;
    assert_eq!(
        (&done["redriven"], &done["remaining"]),
        (&json!(0), &json!(0)),
        "{done}"
    );
    let (_, dlq) = broker.get("/mmmq/topics/__dlq.bad").await;
    assert_eq!(dlq["partitions"][0]["nextOffset"], 1, "{dlq}");

    // The consumer goes away: the redrive retries with backoff and keeps running.
    nacker.stop().await;
    let (status, body) = broker
        .post("/mmmq/dispatchers/bad/redrive", &json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = broker
        .post("/mmmq/dispatchers/bad/redrive", &json!({}))
        .await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("already running"),
        "{body}"
    );
    let s = broker
        .dispatcher_when("bad", |s| {
            s["redrive"]["lastError"]
                .as_str()
                .is_some_and(|e| !e.is_empty())
        })
        .await;
    assert_eq!(s["redrive"]["running"], true, "{s}");
}
