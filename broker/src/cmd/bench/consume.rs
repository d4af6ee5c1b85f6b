//! `mmmq bench consume`: delivery through a slow consumer with `maxInFlight` lanes, and pull
//! consumer groups of 1 and 3 members (docs/dispatchers.md, "Dispatchers", "Consumer groups").

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{scratch_dir, start_broker};

/// Parameters of `mmmq bench consume`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConsumeBench {
    /// Where the scratch root goes.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// `maxInFlight` values to compare, each through the slow consumer.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    pub lanes: Vec<usize>,
    /// What the slow consumer takes per message, in milliseconds.
    #[arg(long, default_value_t = 5)]
    pub consumer_ms: u64,
    /// Messages through the slow consumer per configuration (over 1,000 keys).
    #[arg(long, default_value_t = 1000)]
    pub messages: u64,
    /// Messages read by the consumer groups (a topic of 6 partitions).
    #[arg(long, default_value_t = 100_000)]
    pub group_messages: u64,
}

async fn produce(
    http: &reqwest::Client,
    base: &str,
    topic: &str,
    n: u64,
    keyed: bool,
) -> anyhow::Result<()> {
    let mut i = 0;
    while i < n {
        let batch: Vec<Value> = (i..(i + 500).min(n))
            .map(|k| {
                if keyed {
                    json!({"topic": topic, "key": format!("k{}", k % 1000), "content": {"n": k}})
                } else {
                    json!({"topic": topic, "content": {"n": k}})
                }
            })
            .collect();
        let r = http
            .post(format!("{base}/mmmq/messages/batch"))
            .json(&batch)
            .send()
            .await?;
        anyhow::ensure!(r.status() == 200, "produce answered {}", r.status());
        i += batch.len() as u64;
    }
    Ok(())
}

/// Runs the benchmark.
pub async fn run(cfg: ConsumeBench, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let scratch = scratch_dir(&cfg.dir)?;
    let root = scratch.path().join("root");
    std::fs::create_dir_all(&root)?;
    // The slow consumer: counts what it ACKs, after `consumer_ms`.
    let acked = Arc::new(AtomicU64::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    {
        let (acked, delay) = (acked.clone(), Duration::from_millis(cfg.consumer_ms));
        let app = axum::Router::new().route(
            "/mmmq/messages",
            axum::routing::post(move || {
                let acked = acked.clone();
                async move {
                    tokio::time::sleep(delay).await;
                    acked.fetch_add(1, Ordering::Relaxed);
                    r#"{"ack":"ACK"}"#
                }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
    }
    let dispatchers: Vec<Value> = cfg
        .lanes
        .iter()
        .map(|n| {
            json!({"consumerId": format!("lanes{n}"), "pattern": format!("lanes.m{n}"),
                   "maxInFlight": n,
                   "host": {"protocol": "HTTP", "address": "127.0.0.1", "port": port}})
        })
        .collect();
    std::fs::write(
        root.join("dispatchers.json"),
        json!(dispatchers).to_string(),
    )?;
    let (base, stop, server) = start_broker(&root).await?;
    let http = reqwest::Client::new();
    let mut first = None;
    for &n in &cfg.lanes {
        let before = acked.load(Ordering::Relaxed);
        let start = Instant::now();
        produce(&http, &base, &format!("lanes.m{n}"), cfg.messages, true).await?;
        while acked.load(Ordering::Relaxed) < before + cfg.messages {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let rate = cfg.messages as f64 / start.elapsed().as_secs_f64();
        let base_rate = *first.get_or_insert(rate);
        writeln!(
            out,
            "{}",
            json!({
                "bench": "consume", "what": "lanes", "max_in_flight": n, "consumer_ms": cfg.consumer_ms,
                "messages": cfg.messages, "msgs_per_s": rate.round(), "ratio_to_first": rate / base_rate,
            })
        )?;
    }
    // Groups: 1 member, then 3, each reading the whole topic from the start (a new group).
    let r = http
        .put(format!("{base}/mmmq/topics/grp"))
        .json(&json!({"partitions": 6}))
        .send()
        .await?;
    anyhow::ensure!(r.status() == 200, "creating grp: {}", r.status());
    produce(&http, &base, "grp", cfg.group_messages, false).await?;
    for members in [1usize, 3] {
        let group = format!("g{members}");
        let read = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for m in 0..members {
            let (http, base, group, read, total) = (
                http.clone(),
                base.clone(),
                group.clone(),
                read.clone(),
                cfg.group_messages,
            );
            tasks.push(tokio::spawn(async move {
                while read.load(Ordering::Relaxed) < total {
                    let answer: Value = http
                        .get(format!(
                            "{base}/mmmq/groups/{group}/messages?member=m{m}&pattern=grp&max=1000&waitMs=100"
                        ))
                        .send()
                        .await?
                        .json()
                        .await?;
                    let msgs = answer["messages"].as_array().cloned().unwrap_or_default();
                    let mut next: std::collections::BTreeMap<u64, u64> = Default::default();
                    for e in &msgs {
                        let (p, o) = (e["partition"].as_u64().unwrap_or(0), e["offset"].as_u64().unwrap_or(0));
                        next.insert(p, o + 1);
                    }
                    if !next.is_empty() {
                        let offsets: Vec<Value> = next
                            .iter()
                            .map(|(p, o)| json!({"topic": "grp", "partition": p, "offset": o}))
                            .collect();
                        http.post(format!("{base}/mmmq/groups/{group}/commit"))
                            .json(&json!({"member": format!("m{m}"), "offsets": offsets}))
                            .send()
                            .await?;
                    }
                    read.fetch_add(msgs.len() as u64, Ordering::Relaxed);
                }
                Ok::<_, anyhow::Error>(())
            }));
        }
        for t in tasks {
            t.await??;
        }
        let rate = read.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
        writeln!(
            out,
            "{}",
            json!({
                "bench": "consume", "what": "group", "members": members, "partitions": 6,
                "messages": read.load(Ordering::Relaxed), "msgs_per_s": rate.round(),
                "note": "each poll of up to 1,000 messages is followed by a commit of what it read",
            })
        )?;
    }
    stop.cancel();
    server.await??;
    Ok(())
}
