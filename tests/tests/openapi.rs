//! The API description (docs/http-api.md, "HTTP API"): `GET /mmmq/openapi.json` is OpenAPI 3.1, describes
//! exactly the endpoints the README lists and the broker serves, and the real broker's answers to
//! a tour of every endpoint validate against the schemas it gives for them.

use std::collections::BTreeSet;

use mmmq_tests::{Broker, plugin_wasm, testbed_root};
use serde_json::{Value, json};

/// `(METHOD, /path/{param})` of every operation in the document.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            ops.insert((method.to_uppercase(), path.clone()));
        }
    }
    ops
}

/// Whether `path` (with concrete segments or `{…}`) fits `template`.
fn fits(template: &str, path: &str) -> bool {
    let (t, p): (Vec<&str>, Vec<&str>) = (template.split('/').collect(), path.split('/').collect());
    t.len() == p.len()
        && t.iter()
            .zip(&p)
            .all(|(t, p)| t == p || (t.starts_with('{') && t.ends_with('}')))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_description_lists_every_endpoint_the_readme_lists_and_the_broker_serves() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    let (code, doc) = broker.get("/mmmq/openapi.json").await;
    assert_eq!(code, 200);
    assert_eq!(doc["openapi"], "3.1.0");
    let ops = operations(&doc);

    // The HTTP API's document names the same endpoints.
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/http-api.md"))
            .unwrap();
    let mut listed = BTreeSet::new();
    for method in ["GET", "POST", "PUT", "DELETE"] {
        for (i, _) in readme.match_indices(&format!("`{method} /")) {
            let rest = &readme[i + method.len() + 2..];
            let end = rest.find(['`', ' ', '?']).unwrap();
            listed.insert((method.to_owned(), rest[..end].to_owned()));
        }
    }
    for (m, p) in &listed {
        assert!(
            ops.iter().any(|(om, op)| om == m && fits(op, p)),
            "docs/http-api.md lists {m} {p}, the description does not"
        );
    }
    for (m, p) in &ops {
        assert!(
            listed.contains(&(m.clone(), p.clone())),
            "the description has {m} {p}, docs/http-api.md does not list it"
        );
    }

    // Every described operation is served (not the router's fallback), and an undescribed path
    // is not.
    let http = reqwest::Client::new();
    for (m, p) in &ops {
        let path = p.replace('{', "x").replace('}', "");
        let r = http
            .request(m.parse().unwrap(), format!("{}{path}", broker.url))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body = r.text().await.unwrap();
        assert!(
            status != 405 && !body.contains("no such endpoint"),
            "{m} {p} is described but not served: {status} {body}"
        );
    }
    let (code, body) = broker.get("/mmmq/undescribed").await;
    assert_eq!(
        (code, body["error"].as_str()),
        (404, Some("no such endpoint"))
    );
}

/// Validates `answer` against the schema the document gives for `method path` and `status`.
fn check(doc: &Value, method: &str, path: &str, status: u16, answer: &Value) {
    let errors = misfits(doc, method, path, status, answer);
    assert!(
        errors.is_empty(),
        "{method} {path} {status}: {answer}\ndoes not fit its schema: {errors:#?}"
    );
}

/// How `answer` does not fit the schema of `method path` and `status`.
fn misfits(doc: &Value, method: &str, path: &str, status: u16, answer: &Value) -> Vec<String> {
    let pointer = format!(
        "/paths/{}/{}/responses/{status}/content/application~1json/schema",
        path.replace('~', "~0").replace('/', "~1"),
        method.to_lowercase()
    );
    assert!(
        doc.pointer(&pointer).is_some(),
        "no schema for {method} {path} {status}"
    );
    // The document is the root, so `#/components/schemas/…` references resolve.
    let mut schema = doc.clone();
    let fragment = pointer.replace('{', "%7B").replace('}', "%7D");
    schema["$ref"] = json!(format!("#{fragment}"));
    schema["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
    let validator = jsonschema::validator_for(&schema).unwrap();
    validator
        .iter_errors(answer)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn answers_of_every_endpoint_fit_their_schemas() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    testbed_root(root, "p", "orders", json!({"maxNackRetries": 0}));
    let broker = Broker::start(root).await;
    let (_, doc) = broker.get("/mmmq/openapi.json").await;
    // The check can fail: answers of the wrong shape do not fit.
    assert!(!misfits(&doc, "GET", "/mmmq/topics", 200, &json!([{"name": 1}])).is_empty());
    assert!(!misfits(&doc, "POST", "/mmmq/messages", 200, &json!({"ack": "ACK"})).is_empty());
    assert!(
        !misfits(
            &doc,
            "GET",
            "/mmmq/dispatchers",
            200,
            &json!([{"consumerId": "p", "target": {"type": "nope"}}])
        )
        .is_empty()
    );
    let ok = |method: &str, path: &str, r: (u16, Value)| {
        assert_eq!(r.0, 200, "{method} {path}: {}", r.1);
        check(&doc, method, path, 200, &r.1);
    };

    ok(
        "POST",
        "/mmmq/messages",
        broker
            .post(
                "/mmmq/messages",
                &json!({"topic": "orders", "key": "k", "id": "i-1", "content": {"n": 1}}),
            )
            .await,
    );
    let dup = broker
        .post(
            "/mmmq/messages",
            &json!({"topic": "orders", "id": "i-1", "content": {"n": 1}}),
        )
        .await;
    assert_eq!(dup.1["duplicate"], true);
    ok("POST", "/mmmq/messages", dup);
    ok("POST", "/mmmq/messages/batch", broker.post("/mmmq/messages/batch", &json!([{"topic": "orders", "content": {"do": "panic"}}, {"topic": "other", "content": 7}])).await);
    broker
        .dispatcher_when("p", |s| s["deadLettered"] == 1 && s["lag"] == 0)
        .await;
    ok("GET", "/mmmq/topics", broker.get("/mmmq/topics").await);
    let single = broker.get("/mmmq/cluster").await;
    assert_eq!(single.1["clustered"], false, "{}", single.1);
    ok("GET", "/mmmq/cluster", single);
    ok(
        "GET",
        "/mmmq/topics/{topic}",
        broker.get("/mmmq/topics/orders").await,
    );
    ok(
        "PUT",
        "/mmmq/topics/{topic}",
        broker
            .put(
                "/mmmq/topics/other",
                &json!({"partitions": 2, "retentionMs": null}),
            )
            .await,
    );
    ok(
        "GET",
        "/mmmq/topics/{topic}/messages",
        broker
            .get("/mmmq/topics/orders/messages?from=0&max=10")
            .await,
    );
    ok(
        "GET",
        "/mmmq/topics/{topic}/messages",
        broker.get("/mmmq/topics/__dlq.p/messages").await,
    );
    ok(
        "GET",
        "/mmmq/dispatchers",
        broker.get("/mmmq/dispatchers").await,
    );
    ok(
        "POST",
        "/mmmq/dispatchers/{consumerId}/redrive",
        broker.post("/mmmq/dispatchers/p/redrive", &json!({})).await,
    );
    ok(
        "POST",
        "/mmmq/admin/reload",
        broker.post("/mmmq/admin/reload", &json!({})).await,
    );
    ok(
        "GET",
        "/mmmq/groups/{group}/messages",
        broker
            .get("/mmmq/groups/g/messages?member=m1&pattern=orders")
            .await,
    );
    ok("POST", "/mmmq/groups/{group}/commit", broker.post("/mmmq/groups/g/commit", &json!({"member": "m1", "offsets": [{"topic": "orders", "partition": 0, "offset": 1}]})).await);
    ok("GET", "/mmmq/groups", broker.get("/mmmq/groups").await);
    ok(
        "GET",
        "/mmmq/groups/{group}",
        broker.get("/mmmq/groups/g").await,
    );
    ok(
        "DELETE",
        "/mmmq/groups/{group}/members/{member}",
        broker.delete("/mmmq/groups/g/members/m1").await,
    );
    let wasm = std::fs::read(plugin_wasm("testbed", None)).unwrap();
    let (code, deployed) = broker.deploy_wasm("tb", wasm).await;
    assert_eq!(code, 200, "{deployed}");
    check(&doc, "PUT", "/mmmq/plugins/{name}", 200, &deployed);
    ok("GET", "/mmmq/plugins", broker.get("/mmmq/plugins").await);
    let version = deployed["version"].as_str().unwrap();
    ok(
        "POST",
        "/mmmq/plugins/{name}/versions/{version}/activate",
        broker
            .post(
                &format!("/mmmq/plugins/tb/versions/{version}/activate"),
                &json!({}),
            )
            .await,
    );
    ok(
        "DELETE",
        "/mmmq/topics/{topic}",
        broker.delete("/mmmq/topics/other").await,
    );
    ok("GET", "/healthz", broker.get("/healthz").await);
    ok(
        "GET",
        "/mmmq/openapi.json",
        broker.get("/mmmq/openapi.json").await,
    );

    // Errors fit the error schemas.
    let (code, body) = broker
        .post(
            "/mmmq/messages",
            &json!({"topic": "bad name", "content": 1}),
        )
        .await;
    assert_eq!(code, 400);
    check(&doc, "POST", "/mmmq/messages", 400, &body);
    let (code, body) = broker.get("/mmmq/topics/nope").await;
    assert_eq!(code, 404);
    check(&doc, "GET", "/mmmq/topics/{topic}", 404, &body);
    let (code, body) = broker.post("/mmmq/plugins/tb/rollback", &json!({})).await;
    assert_eq!(code, 400, "{body}");
    check(&doc, "POST", "/mmmq/plugins/{name}/rollback", 400, &body);
}
