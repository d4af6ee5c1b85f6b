//! A cluster of brokers (docs/cluster.md): real `mmmq serve` processes on 127.0.0.1.

use std::collections::BTreeSet;
use std::time::Duration;

use mmmq_tests::Broker;
use mmmq_tests::checker::MsgId;
use mmmq_tests::cluster::{
    Cluster, acked_once_leader, assert_each_holds, check_orders, produce, sent,
};
use serde_json::{Value, json};

/// A broker started without cluster flags says so, over HTTP and in `mmmq cluster status`.
#[tokio::test]
async fn a_single_broker_says_it_is_not_clustered() {
    let tmp = tempfile::tempdir().unwrap();
    let broker = Broker::start(tmp.path()).await;
    let (code, view) = broker.get("/mmmq/cluster").await;
    assert_eq!(code, 200);
    assert_eq!(view["clustered"], false, "{view}");
    assert_eq!(view["brokers"], serde_json::json!([]));
    let out = broker.cli_ok(["cluster", "status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("single broker"), "{text}");
    let out = broker.cli_ok(["cluster", "status", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["clustered"], false);
}

#[tokio::test(flavor = "multi_thread")]
async fn three_brokers_elect_one_leader_and_each_answers_for_the_cluster() {
    let c = Cluster::start(3, &[]).await;
    let leader = c.meta_leader(1).await;
    for via in [2, 3] {
        assert_eq!(c.meta_leader(via).await, leader);
    }
    let out = c.broker(2).cli_ok(["cluster", "status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches(" yes ").count(), 3, "{text}");
    assert!(
        text.contains(&format!("metadata leader: {leader}")),
        "{text}"
    );
}

/// Contract §13: any broker takes a produce; it is acknowledged once a majority holds it, and
/// every replica holds every message at the same offset.
#[tokio::test(flavor = "multi_thread")]
async fn a_produce_through_any_broker_is_on_every_replica_at_the_same_offset() {
    let c = Cluster::start(3, &[]).await;
    c.meta_leader(1).await;
    let mut acks = Vec::new();
    for via in 1..=3 {
        acks.extend(produce(&c, via, "orders", via, 0..30).await);
    }
    let offsets: BTreeSet<u64> = acks.iter().map(|a| a.offset).collect();
    assert_eq!(offsets, (0..90).collect(), "offsets are dense and distinct");
    // A produce id retried through the same broker is stored once (§9).
    let with_id = json!({"topic": "ids", "id": "order-1", "content": {"n": 1}});
    let (code, first) = c.broker(2).post("/mmmq/messages", &with_id).await;
    assert_eq!((code, first["duplicate"].as_bool()), (200, None), "{first}");
    let (code, again) = c.broker(2).post("/mmmq/messages", &with_id).await;
    assert_eq!(code, 200, "{again}");
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["offset"], first["offset"]);
    // Every broker reads all of it (a replica answers what a majority acknowledged).
    for via in 1..=3 {
        let got = c.broker(via).pull_until("orders", 90).await;
        assert_eq!(got.len(), 90);
    }
    let sent = sent(&acks);
    let replicas = c.stop_and_read("orders", 0).await;
    assert_each_holds(&replicas, 90);
    let report = check_orders(replicas, &acks, &sent);
    assert!(report.clean() && report.duplicates == 0, "{report}");
}

/// Contract §13, failover: SIGKILL of the partition's leader; a produce through another broker
/// is acknowledged again within 5 s; the killed broker comes back and catches up; the checker
/// finds nothing lost, divergent or phantom.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_leader_is_replaced_and_the_cluster_keeps_one_history() {
    let mut c = Cluster::start(3, &[]).await;
    c.meta_leader(1).await;
    let mut acks = produce(&c, 1, "orders", 1, 0..20).await;
    let (_, view) = c.broker(1).get("/mmmq/cluster").await;
    let leader = view["partitions"][0]["leader"].as_u64().expect("a leader");
    c.brokers[(leader - 1) as usize].take().unwrap().kill();
    let via = if leader == 1 { 2 } else { 1 };
    let killed = std::time::Instant::now();
    let b = c.broker(via);
    acks.push(
        acked_once_leader(
            b,
            MsgId {
                producer: 2,
                seq: 0,
            },
            Duration::from_secs(10),
        )
        .await,
    );
    let failover = killed.elapsed();
    assert!(
        failover < Duration::from_secs(5),
        "failover took {failover:?}"
    );
    acks.extend(produce(&c, via, "orders", 2, 1..20).await);
    // The killed broker comes back and catches up.
    let back = c.spawn(leader).await;
    c.brokers[(leader - 1) as usize] = Some(back);
    c.caught_up(via).await;
    let sent = sent(&acks);
    let replicas = c.stop_and_read("orders", 0).await;
    let report = check_orders(replicas, &acks, &sent);
    assert!(report.clean(), "{report}");
}

/// The topic API on any broker changes the cluster's topic; `replicationFactor` places fewer
/// replicas than brokers, a pull through a broker without a replica is forwarded to the
/// leader, and a delete through another broker removes the topic everywhere.
#[tokio::test(flavor = "multi_thread")]
async fn topics_are_the_clusters_whichever_broker_is_asked() {
    let c = Cluster::start(3, &[]).await;
    c.meta_leader(1).await;
    let (code, body) = c
        .broker(3)
        .put(
            "/mmmq/topics/two",
            &json!({"partitions": 3, "replicationFactor": 2}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["config"]["partitions"], 3);
    let (code, body) = c
        .broker(1)
        .put("/mmmq/topics/two", &json!({"replicationFactor": 9}))
        .await;
    assert_eq!(code, 400, "{body}");
    let (_, view) = c.broker(2).get("/mmmq/cluster").await;
    let parts: Vec<&Value> = view["partitions"].as_array().unwrap().iter().collect();
    assert_eq!(parts.len(), 3, "{view}");
    // Each partition on two brokers; some broker lacks each one.
    for p in &parts {
        assert_eq!(p["replicas"].as_array().unwrap().len(), 2, "{p}");
    }
    for p in 0..3u64 {
        for seq in 0..5u64 {
            let content = MsgId { producer: p, seq }.content();
            let (code, body) = c
                .broker(1)
                .post(
                    "/mmmq/messages",
                    &json!({"topic": "two", "partition": p, "content": content}),
                )
                .await;
            assert_eq!((code, body["offset"].as_u64()), (200, Some(seq)), "{body}");
        }
    }
    // Every broker reads every partition, replica or not.
    for via in 1..=3 {
        for p in 0..3u64 {
            let (code, page) = c
                .broker(via)
                .get(&format!("/mmmq/topics/two/messages?partition={p}&from=0"))
                .await;
            assert_eq!(code, 200, "{page}");
            let got: Vec<&Value> = page["messages"].as_array().unwrap().iter().collect();
            assert_eq!(got.len(), 5, "broker {via}, partition {p}: {page}");
            assert_eq!(got[4]["content"], json!({"p": p, "s": 4}));
        }
    }
    let (code, _) = c.broker(2).delete("/mmmq/topics/two").await;
    assert_eq!(code, 200);
    for via in 1..=3 {
        let b = c.broker(via);
        mmmq_tests::eventually_async(Duration::from_secs(10), "the topic gone", || async {
            (b.get("/mmmq/topics/two").await.0 == 404).then_some(())
        })
        .await;
    }
}

/// Three consecutive free ports on 127.0.0.1 (`scripts/cluster` takes the first).
fn free_ports_in_a_row(n: u16) -> u16 {
    for _ in 0..200 {
        let base = 20_000 + (rand_u16() % 30_000);
        let held: Vec<_> = (0..n)
            .map_while(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).ok())
            .collect();
        if held.len() == n as usize {
            return base;
        }
    }
    panic!("no {n} free ports in a row");
}

fn rand_u16() -> u16 {
    let mut b = [0u8; 2];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .unwrap();
    u16::from_le_bytes(b)
}

/// The README's cluster section, as written: `scripts/cluster 3`, a produce through broker 1,
/// a SIGKILL of the partition's leader (its pid as the script printed it), a produce through
/// another broker that waits out the election, and every message read from a third.
#[tokio::test(flavor = "multi_thread")]
async fn the_readme_cluster_runs_as_written() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::CommandExt;
    let tmp = tempfile::tempdir().unwrap();
    let port = free_ports_in_a_row(3);
    let mut cmd = std::process::Command::new(mmmq_tests::workspace_root().join("scripts/cluster"));
    mmmq_tests::doc_run::die_with_parent(&mut cmd)
        .arg("3")
        .env("MMMQ_BIN", mmmq_tests::mmmq_bin())
        .env("MMMQ_CLUSTER_DIR", tmp.path().join("mmmq-cluster"))
        .env("MMMQ_CLUSTER_PORT", port.to_string())
        .env(
            "MMMQ_CLUSTER_KAFKA_PORT",
            free_ports_in_a_row(3).to_string(),
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .process_group(0);
    let mut script = cmd.spawn().unwrap();
    let stderr = script.stderr.take().unwrap();
    // "  broker 2  http://127.0.0.1:8082  pid 1234"
    let pids: Vec<(u64, String, u32)> = tokio::task::spawn_blocking(move || {
        let mut found = Vec::new();
        for line in BufReader::new(stderr).lines() {
            let line = line.unwrap();
            eprintln!("[cluster] {line}");
            let words: Vec<&str> = line.split_whitespace().collect();
            if let ["broker", id, url, "pid", pid] = words[..] {
                found.push((id.parse().unwrap(), url.to_owned(), pid.parse().unwrap()));
                if found.len() == 3 {
                    return found;
                }
            }
        }
        found
    })
    .await
    .unwrap();
    let stop = || {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", script.id())])
            .status();
    };
    assert_eq!(pids.len(), 3, "scripts/cluster did not print three brokers");
    let http = reqwest::Client::new();
    let produce = |url: String, n: u64| {
        let http = http.clone();
        async move {
            let r = http
                .post(format!("{url}/mmmq/messages"))
                .header("content-type", "application/json")
                .body(json!({"topic": "orders", "content": {"n": n}}).to_string())
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (code, body) = produce(pids[0].1.clone(), 1).await;
    assert_eq!(code, 200, "{body}");
    let view: Value = http
        .get(format!("{}/mmmq/cluster", pids[1].1))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let leader = view["partitions"][0]["leader"].as_u64().expect("a leader");
    let pid = pids.iter().find(|p| p.0 == leader).unwrap().2;
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let others: Vec<_> = pids.iter().filter(|p| p.0 != leader).collect();
    // As the README's `curl --retry 5 --retry-delay 1`: a 503 (no leader yet, or a write whose
    // outcome the broker cannot know) is tried again a second later.
    let mut tries = 0;
    let (code, body) = loop {
        let (code, body) = produce(others[0].1.clone(), 2).await;
        tries += 1;
        if code != 503 || tries > 5 {
            break (code, body);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert_eq!(
        code, 200,
        "a produce after the kill is acknowledged: {body}"
    );
    let page: Value = http
        .get(format!(
            "{}/mmmq/topics/orders/messages?from=0",
            others[1].1
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let contents: Vec<&Value> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["content"])
        .collect();
    stop();
    let _ = script.wait();
    assert_eq!(contents, [&json!({"n": 1}), &json!({"n": 2})], "{page}");
}

/// A single broker's root dir is never opened as a cluster member's (its logs have no log ids
/// and would be misread and cut), nor a member's as a single broker's; `--flush none` cannot
/// acknowledge in a cluster.
#[tokio::test(flavor = "multi_thread")]
async fn a_root_dir_is_one_kind_of_broker_and_a_member_fsyncs() {
    let tmp = tempfile::tempdir().unwrap();
    let single = Broker::start(tmp.path()).await;
    single.produce("kept", json!({"n": 1})).await;
    assert!(single.terminate().success());
    let port = mmmq_tests::free_port();
    let member = |root: &std::path::Path, extra: &[&str]| {
        let mut cmd = std::process::Command::new(mmmq_tests::mmmq_bin());
        cmd.arg("serve")
            .arg("--root-dir")
            .arg(root)
            .args(["--listen", &format!("127.0.0.1:{port}"), "--node-id", "1"])
            .args(["--peers", &format!("1=127.0.0.1:{port}")])
            .args(extra);
        cmd.output().unwrap()
    };
    let out = member(tmp.path(), &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("single broker's root dir"),
        "{err}"
    );
    // The single broker's message is still there, as it was.
    let again = Broker::start(tmp.path()).await;
    assert_eq!(again.pull_all("kept").await.len(), 1);
    drop(again);
    let fresh = tempfile::tempdir().unwrap();
    let out = member(fresh.path(), &["--flush", "none"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--flush"), "{err}");
    // A member's root dir, started without the flags, is refused.
    std::fs::create_dir_all(fresh.path().join("cluster/meta")).unwrap();
    let (mut child, addr, log) = mmmq_tests::spawn_serve(fresh.path(), &[]);
    let status = child.wait().unwrap();
    assert!(addr.is_none() || !status.success());
    // The log's reader thread may still be reading the pipe the process closed.
    mmmq_tests::eventually(Duration::from_secs(5), "the refusal logged", || {
        log.lock()
            .contains("cluster member's root dir")
            .then_some(())
    })
    .await;
}

/// A leader cut off from the others (both directions, through `--fault-injection`) never
/// acknowledges; the majority elects another and goes on; once the links heal the old leader's
/// uncommitted entry is cut and every replica holds one history.
#[tokio::test(flavor = "multi_thread")]
async fn a_partitioned_leader_never_acknowledges_and_the_majority_goes_on() {
    let cluster = Cluster::start(3, &["--fault-injection"]).await;
    let c = &cluster;
    c.meta_leader(1).await;
    let mut acks = produce(c, 1, "orders", 1, 0..10).await;
    c.caught_up(1).await;
    let (_, view) = c.broker(1).get("/mmmq/cluster").await;
    let leader = view["partitions"][0]["leader"].as_u64().expect("a leader");
    let others: Vec<u64> = (1..=3).filter(|b| *b != leader).collect();
    let cut = |b: u64, rules: Value| async move { c.faults(b, &rules).await };
    cut(
        leader,
        json!({ others[0].to_string(): "drop", others[1].to_string(): "drop" }),
    )
    .await;
    for b in &others {
        cut(*b, json!({ leader.to_string(): "drop" })).await;
    }
    // The old leader cannot commit: its produce is not acknowledged.
    let lost = MsgId {
        producer: 9,
        seq: 0,
    };
    let (code, body) = c
        .broker(leader)
        .post(
            "/mmmq/messages",
            &json!({"topic": "orders", "content": lost.content()}),
        )
        .await;
    assert_ne!(code, 200, "an isolated leader acknowledged: {body}");
    // The majority elects a leader and takes produces.
    let b = c.broker(others[0]);
    acks.push(
        acked_once_leader(
            b,
            MsgId {
                producer: 2,
                seq: 0,
            },
            Duration::from_secs(20),
        )
        .await,
    );
    acks.extend(produce(c, others[1], "orders", 2, 1..10).await);
    for b in 1..=3 {
        cut(b, json!({})).await;
    }
    c.caught_up(others[0]).await;
    let sent = sent(&acks);
    let replicas = cluster.stop_and_read("orders", 0).await;
    for r in &replicas {
        assert!(
            !r.entries.values().any(|v| MsgId::of(v) == Some(lost)),
            "broker {} kept the isolated leader's unacknowledged entry",
            r.broker
        );
    }
    let report = check_orders(replicas, &acks, &sent);
    assert!(report.clean() && report.duplicates == 0, "{report}");
}

/// docs/cluster.md, "Who may speak for the cluster": once a cluster formed, its members hold the
/// secret it drew, and `/mmmq/internal/*` answers `403` to anything else, the client token (which
/// every producer has) and the cluster's id (which `GET /mmmq/cluster` shows) included: no vote,
/// no change of members, no write into the metadata moves a group. A forwarded request that is
/// not a member's is refused too. Before, each was taken with the token.
#[tokio::test(flavor = "multi_thread")]
async fn internal_routes_refuse_a_client_with_the_token() {
    const TOKEN: &str = "every-producer-has-this";
    let c = Cluster::start(3, &["--auth-token", TOKEN, "--fault-injection"]).await;
    let http = reqwest::Client::new();
    let get_view = |id: u64| {
        let (http, url) = (http.clone(), c.url(id));
        async move {
            let r = http
                .get(format!("{url}/mmmq/cluster"))
                .bearer_auth(TOKEN)
                .send()
                .await
                .unwrap();
            r.json::<Value>().await.unwrap()
        }
    };
    // Formed, named, each member holding the secret, and a partition with its leader.
    let mut view = Value::Null;
    for _ in 0..600 {
        let (status, _, _) = c
            .broker(1)
            .send(
                "POST",
                "/mmmq/messages",
                &[("authorization", &format!("Bearer {TOKEN}"))],
                Some((r#"{"topic": "t", "content": 1}"#, Some("application/json"))),
            )
            .await;
        view = get_view(1).await;
        let ready = status == 200
            && (1..=3).all(|id| c.member_secret(id).is_some())
            && view["partitions"][0]["leader"].is_u64()
            && view["clusterId"].is_string();
        if ready {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let secret = c
        .member_secret(1)
        .expect("the cluster drew a members' secret");
    assert_eq!(secret.len(), 64, "256 bits in hex");
    for id in 2..=3 {
        assert_eq!(c.member_secret(id), Some(secret.clone()), "broker {id}");
    }
    let id = view["clusterId"].as_str().expect("named").to_owned();
    let moves = |v: &Value| {
        (
            v["meta"]["term"].clone(),
            v["meta"]["voters"].clone(),
            v["partitions"][0]["term"].clone(),
            v["partitions"][0]["replicas"].clone(),
        )
    };
    let before = moves(&view);
    let auth = format!("Bearer {TOKEN}");
    let client: &[(&str, &str)] = &[("authorization", &auth), ("x-mmmq-cluster", &id)];
    let guessed: &[(&str, &str)] = &[
        ("authorization", &auth),
        ("x-mmmq-cluster", &id),
        (
            "x-mmmq-member",
            "0000000000000000000000000000000000000000000000000000000000000000",
        ),
    ];
    let binary = Some(("\u{0}\u{1}not postcard", Some("application/octet-stream")));
    let json_body = Some(("{}", Some("application/json")));
    for b in 1..=3 {
        for headers in [client, guessed] {
            for rpc in [
                "append",
                "vote",
                "pre-vote",
                "snapshot",
                "transfer-leader",
                "write",
                "members",
                "ping",
                "no-such-rpc",
            ] {
                let path = format!("/mmmq/internal/raft/{rpc}");
                let (code, _, body) = c.broker(b).send("POST", &path, headers, binary).await;
                assert_eq!(code, 403, "broker {b} {path}: {body}");
            }
            let (code, _, body) = c
                .broker(b)
                .send("PUT", "/mmmq/internal/faults", headers, json_body)
                .await;
            assert_eq!(code, 403, "broker {b} faults: {body}");
            let (code, _, body) = c
                .broker(b)
                .send("GET", "/mmmq/internal/plugins/p/0123", headers, None)
                .await;
            assert_eq!(code, 403, "broker {b} plugin bytes: {body}");
            // A client that says it is a broker forwarding is not answered as one.
            let mut forged = headers.to_vec();
            forged.push(("x-mmmq-forwarded-by", "2"));
            let (code, _, body) = c
                .broker(b)
                .send("GET", "/mmmq/topics/t/messages?from=0", &forged, None)
                .await;
            assert_eq!(code, 403, "broker {b} forged forward: {body}");
        }
    }
    // Nothing moved, and the cluster still takes produces through every broker.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for b in 1..=3 {
        assert_eq!(moves(&get_view(b).await), before, "broker {b}");
        let (code, _, body) = c
            .broker(b)
            .send(
                "POST",
                "/mmmq/messages",
                &[("authorization", &auth)],
                Some((r#"{"topic": "t", "content": 2}"#, Some("application/json"))),
            )
            .await;
        assert_eq!(code, 200, "broker {b}: {body}");
    }
}
