//! The dashboard (docs/operations.md, "Dashboard") in a real browser ([`mmmq_tests::browser`]:
//! headless Chromium through chromedriver) against the real broker. Screenshots of each view go to
//! `target/dashboard-screenshots/`.

use std::time::{Duration, Instant};

use fantoccini::Locator;
use mmmq_tests::browser::{Browser, WAIT};
use mmmq_tests::{Broker, plugin_wasm, testbed_root};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_shows_topics_produces_browses_and_shows_dispatchers() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    testbed_root(root, "audit", "orders", json!({}));
    let broker = Broker::start(root).await;
    broker.produce("orders", json!({"n": 1})).await;

    let b = Browser::start().await;
    b.client.goto(&format!("{}/", broker.url)).await.unwrap();
    // The overview: health, counts, and rates once two samples of the metrics are in.
    b.text("#health", "ok").await;
    let topics: u64 = b.text("#topic-count", "").await.parse().unwrap_or(0);
    assert!(
        topics >= 1,
        "orders (and the plugin's log topic) counted: {topics}"
    );
    b.text("#rate-in", ".").await;
    b.screenshot("overview-at-start").await;
    b.click("nav button[data-view=topics]").await;
    b.text("tr[data-topic=orders]", "orders").await;
    // Create a topic of 3 partitions, see its partitions and configuration, delete it.
    b.fill("#create-topic input[name=name]", "made.here").await;
    b.fill("#create-topic input[name=partitions]", "3").await;
    b.click("#create-topic button").await;
    b.click("tr[data-topic=\"made.here\"] td").await;
    let partitions = b.text("#topic-partitions", "2").await;
    assert_eq!(partitions.lines().count(), 3, "{partitions}");
    b.text("#topic-config", "\"partitions\": 3").await;
    b.screenshot("topics").await;
    b.click("tr[data-topic=\"made.here\"] button[data-delete]")
        .await;
    b.client.accept_alert().await.unwrap();
    let started = Instant::now();
    while broker.get("/mmmq/topics/made.here").await.0 != 404 {
        assert!(started.elapsed() < WAIT, "the topic was not deleted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Produce through the form, find it through the API and in the browser.
    b.click("nav button[data-view=messages]").await;
    b.fill("#produce input[name=topic]", "orders").await;
    b.fill("#produce input[name=key]", "k-7").await;
    b.fill(
        "#produce textarea[name=content]",
        r#"{"from": "the browser"}"#,
    )
    .await;
    b.click("#produce button").await;
    b.text("#produce-result", "stored: orders partition 0 offset 1")
        .await;
    let stored = broker.pull_all("orders").await;
    assert_eq!(stored[1]["content"], json!({"from": "the browser"}));
    assert_eq!(stored[1]["key"], "k-7");
    b.click("#browse button").await;
    b.text("#message-rows", "the browser").await;
    b.screenshot("messages").await;

    // Bad input shows the broker's (or the form's) reason, and the page keeps working.
    b.fill("#produce textarea[name=content]", "{nope").await;
    b.click("#produce button").await;
    b.text("#produce-result", "content is not JSON").await;
    b.fill("#produce textarea[name=content]", "1").await;
    b.fill("#produce input[name=topic]", "bad name").await;
    b.click("#produce button").await;
    let refused = b.text("#produce-result", "topic").await;
    assert!(!refused.contains("stored"), "{refused}");
    assert_eq!(broker.pull_all("orders").await.len(), 2);

    // Dispatchers: the plugin dispatcher and its version; a second one naming a plugin not deployed
    // yet holds its messages (lag 2 on the page) until a deploy drains them (lag 0). Its
    // consumerId is `__proto__`, a key like any other to the page (not the page's prototype).
    b.click("nav button[data-view=dispatchers]").await;
    let row = b.text("tr[data-dispatcher=audit]", "plugin").await;
    assert!(row.contains("@"), "the version shows: {row}");
    b.text("tr[data-dispatcher=audit] td.lag", "0").await;
    let mut dispatchers: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("dispatchers.json")).unwrap())
            .unwrap();
    dispatchers
        .as_array_mut()
        .unwrap()
        .push(json!({"consumerId": "__proto__", "pattern": "orders", "plugin": {"name": "later"}}));
    std::fs::write(root.join("dispatchers.json"), dispatchers.to_string()).unwrap();
    let (code, body) = broker.post("/mmmq/admin/reload", &json!({})).await;
    assert_eq!(code, 200, "{body}");
    b.text("tr[data-dispatcher=__proto__] td.lag", "2").await;
    b.screenshot("dispatchers").await;
    let (code, body) = broker
        .deploy_wasm(
            "later",
            std::fs::read(plugin_wasm("testbed", None)).unwrap(),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    b.text("tr[data-dispatcher=__proto__] td.lag", "0").await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_an_auth_token_the_dashboard_asks_for_it_and_keeps_it() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start_with(tmp.path(), &["--auth-token", "s3cret"]).await;
    let (code, _) = broker.get("/mmmq/topics").await;
    assert_eq!(code, 401);
    let b = Browser::start().await;
    b.client.goto(&format!("{}/", broker.url)).await.unwrap();
    let login = b
        .client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#login.on"))
        .await
        .unwrap();
    b.screenshot("token").await;
    login
        .find(Locator::Css("input[name=token]"))
        .await
        .unwrap()
        .send_keys("s3cret")
        .await
        .unwrap();
    b.click("#token-form button").await;
    b.text("#health", "ok").await;
    b.text("#topic-count", "0").await;
    // The overview's calls carry the token too: the version (from the API description) and the
    // cluster view (404 with the token: a single broker).
    b.text("#version", env!("CARGO_PKG_VERSION")).await;
    b.text("#cluster-summary", "single broker (not clustered)")
        .await;
    // Kept for the session: a reload does not ask again.
    b.client.refresh().await.unwrap();
    b.text("#topic-count", "0").await;
    let asked: Value = b
        .client
        .execute("return document.getElementById('login').className", vec![])
        .await
        .unwrap();
    assert_eq!(asked, json!(""));
    b.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn dead_letters_redrive_plugins_logs_and_a_live_tail_through_the_page() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    testbed_root(root, "p", "orders", json!({"maxNackRetries": 0}));
    let broker = Broker::start(root).await;
    broker.produce("orders", json!({"do": "panic"})).await;
    broker
        .dispatcher_when("p", |s| s["deadLettered"] == 1)
        .await;

    let b = Browser::start().await;
    b.client.goto(&format!("{}/", broker.url)).await.unwrap();
    b.text("#health", "ok").await;

    // Dead letters: the reason and attempts, then a redrive from the page.
    b.click("nav button[data-view=deadletters]").await;
    b.text("#dlq-dispatcher", "p").await;
    b.click("#dlq button[name=show]").await;
    let row = b.text("#dlq-rows", "trapped").await;
    assert!(row.contains("orders 0@0"), "{row}");
    b.screenshot("deadletters").await;
    b.click("#redrive").await;
    b.text("#dlq-result", "redriving 1 dead letter(s)").await;
    // The redriven message traps again: dead-lettered again, with its history.
    broker
        .dispatcher_when("p", |s| {
            s["redrive"]["running"] == false && s["redrive"]["deadLettered"] == 1
        })
        .await;

    // Plugins: deploy two versions by file upload, roll back to the first.
    b.click("nav button[data-view=plugins]").await;
    let mut versions = Vec::new();
    for variant in [None, Some("v2")] {
        b.fill("#deploy input[name=name]", "tb").await;
        let file = b
            .client
            .find(Locator::Css("#deploy input[name=file]"))
            .await
            .unwrap();
        file.send_keys(plugin_wasm("testbed", variant).to_str().unwrap())
            .await
            .unwrap();
        b.click("#deploy button").await;
        let said = b.text("#deploy-result", "deployed tb version").await;
        let version = said.split_whitespace().nth(3).unwrap().to_owned();
        b.text("tr[data-plugin=tb] td.current", &version).await;
        versions.push(version);
    }
    b.screenshot("plugins").await;
    b.click("tr[data-plugin=tb] button[data-rollback]").await;
    b.text("#deploy-result", &format!("tb now runs {}", versions[0]))
        .await;
    let (_, listed) = broker.get("/mmmq/plugins").await;
    assert_eq!(listed[0]["current"], versions[0].as_str());

    // The plugin's own log lines.
    b.select("#logs select", "p").await;
    b.click("#logs button").await;
    b.text("#log-rows", "testbed version=v1").await;

    // A live tail: a message produced after the page started following shows up.
    b.click("nav button[data-view=messages]").await;
    b.select("#browse select", "orders").await;
    b.click("#follow").await;
    b.click("#browse button").await;
    b.text("#message-rows", "panic").await;
    broker.produce("orders", json!({"n": "live"})).await;
    b.text("#message-rows", "live").await;
    b.close().await;
}

/// The RETENTION column of `mmmq topics`, by topic (the last column).
fn cli_retention(broker: &Broker) -> Vec<(String, String)> {
    let out = broker.cli_ok(["topics"]);
    let text = String::from_utf8(out.stdout).unwrap();
    let at = text.lines().next().unwrap().find("RETENTION").unwrap();
    text.lines()
        .skip(1)
        .map(|l| {
            let name = l.split_whitespace().next().unwrap().to_owned();
            (name, l[at..].trim().to_owned())
        })
        .collect()
}

/// Each view has its own URL (opened by a link, kept by a reload, left with the back button);
/// retention reads as `mmmq topics` says it; a reason or last error shows its first line with the
/// whole a click away, and a last error its age and, once delivery works again, "(resolved)".
#[tokio::test(flavor = "multi_thread")]
async fn views_have_urls_retention_reads_as_the_cli_says_and_reasons_unfold() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    testbed_root(root, "p", "orders", json!({}));
    let broker = Broker::start(root).await;
    for (name, retention) in [
        ("days", json!({"retentionMs": 1_209_600_000u64})),
        ("hours", json!({"retentionMs": 7_200_000})),
        ("seconds", json!({"retentionMs": 90_000})),
        ("millis", json!({"retentionMs": 1500})),
        (
            "bytes",
            json!({"retentionMs": null, "retentionBytes": 1_000_000}),
        ),
    ] {
        let (code, body) = broker
            .put(&format!("/mmmq/topics/{name}"), &retention)
            .await;
        assert_eq!(code, 200, "{body}");
    }
    let reason = "bad order\nfield x is missing";
    broker
        .produce("orders", json!({"do": "deadletter", "reason": reason}))
        .await;
    broker
        .dispatcher_when("p", |s| s["deadLettered"] == 1)
        .await;

    let b = Browser::start().await;
    b.client
        .goto(&format!("{}/#dispatchers", broker.url))
        .await
        .unwrap();
    let shown = || async {
        let v: Value = b
            .client
            .execute(
                "return [location.hash, document.querySelector('section.on').id, \
                 document.querySelector('nav button.on').dataset.view]",
                vec![],
            )
            .await
            .unwrap();
        v
    };
    assert_eq!(
        shown().await,
        json!(["#dispatchers", "dispatchers", "dispatchers"])
    );
    // The last error: its age and first line; the whole reason unfolds on a click.
    let cell = "tr[data-dispatcher=p] td.last-error";
    let text = b
        .text(
            cell,
            "ago: offset 0 dead-lettered after 1 attempts: bad order…",
        )
        .await;
    assert!(
        text.starts_with(|c: char| c.is_ascii_digit()) && !text.contains("field x"),
        "{text}"
    );
    b.click(&format!("{cell} summary")).await;
    b.text(cell, "field x is missing").await;
    b.screenshot("last-error").await;
    broker.produce("orders", json!({"n": 1})).await;
    b.text(cell, "bad order… (resolved)").await;
    // The row was drawn again (counts, the resolved state): the reason opened stays open.
    let open: Value = b
        .client
        .execute(
            "return document.querySelector('tr[data-dispatcher=p] td.last-error details').open",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(open, json!(true), "a refresh folded the opened reason");
    b.text("#partition-rows", "(resolved)").await;

    // Topics by their URL; retention as the CLI says it.
    b.click("nav button[data-view=topics]").await;
    assert_eq!(shown().await, json!(["#topics", "topics", "topics"]));
    for (name, said) in cli_retention(&broker) {
        let cell = format!("tr[data-topic=\"{name}\"] td.retention");
        assert_eq!(b.text(&cell, &said).await, said, "{name}");
    }
    let cli = cli_retention(&broker);
    assert!(
        cli.contains(&("days".into(), "14d".into()))
            && cli.contains(&("millis".into(), "1500ms".into()))
            && cli.contains(&("bytes".into(), "forever, 1000000 B".into())),
        "{cli:?}"
    );
    // Back to the dispatchers; a reload keeps the view.
    b.client.back().await.unwrap();
    assert_eq!(
        shown().await,
        json!(["#dispatchers", "dispatchers", "dispatchers"])
    );
    b.click("nav button[data-view=deadletters]").await;
    b.client.refresh().await.unwrap();
    assert_eq!(
        shown().await,
        json!(["#deadletters", "deadletters", "deadletters"])
    );

    // A dead letter's reason: the first line, the whole a click away.
    b.text("#dlq-dispatcher", "p").await;
    b.click("#dlq button[name=show]").await;
    let reason_cell = "#dlq-rows td.error";
    let shown = b.text(reason_cell, "bad order…").await;
    assert!(!shown.contains("field x"), "{shown}");
    b.click(&format!("{reason_cell} summary")).await;
    b.text(reason_cell, "field x is missing").await;
    b.close().await;
}
