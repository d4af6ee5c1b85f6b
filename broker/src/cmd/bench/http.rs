//! `mmmq bench http`: durable produce over HTTP, batch produce, and end to end through a no-op
//! HTTP consumer, each next to the storage engine alone in the same run.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mmmq::storage::FlushMode;
use serde_json::json;

use super::storage::run_appenders;
use super::{Latencies, RunArgs, scratch_dir, start_broker};

/// Parameters of `mmmq bench http`.
#[derive(Debug, Clone, clap::Args)]
pub struct HttpBench {
    /// Where the scratch files go (on the disk being measured, not tmpfs), how long each
    /// configuration runs, and how big a message is.
    #[command(flatten)]
    pub run: RunArgs,
    /// Producer counts for single-message produce.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    pub producers: Vec<usize>,
    /// Producers of the end-to-end run.
    #[arg(long, default_value_t = 16)]
    pub e2e_producers: usize,
    /// Partition counts of a topic produced to by the most producers (keyless: round robin),
    /// each as a ratio to the first.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    pub partitions: Vec<u32>,
}

/// Durable produce over HTTP (1 and 64 keep-alive clients), batch produce, and end to end through
/// a no-op HTTP consumer, each next to the storage engine alone in the same run.
pub async fn run(cfg: HttpBench, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let scratch = scratch_dir(&cfg.run.dir)?;
    let mb = cfg.run.message_bytes as f64 / 1e6;

    // The consumer: answers ACK and records when each message arrived.
    let started = Instant::now();
    let received: Arc<parking_lot::Mutex<Latencies>> = Arc::default();
    let consumer = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let consumer_port = consumer.local_addr()?.port();
    {
        let received = received.clone();
        let app = axum::Router::new().route(
            "/mmmq/messages",
            axum::routing::post(move |body: bytes::Bytes| {
                let received = received.clone();
                async move {
                    let now = started.elapsed().as_secs_f64();
                    if let Ok(env) = serde_json::from_slice::<serde_json::Value>(&body)
                        && let Some(sent) = env["content"]["t"].as_f64()
                    {
                        received.lock().push_secs(now - sent);
                    }
                    r#"{"ack":"ACK"}"#
                }
            }),
        );
        tokio::spawn(async move { axum::serve(consumer, app).await });
    }
    let root = scratch.path().join("root");
    std::fs::create_dir_all(&root)?;
    std::fs::write(
        root.join("dispatchers.json"),
        json!([{"consumerId": "bench", "pattern": "e2e.*",
                "host": {"protocol": "HTTP", "address": "127.0.0.1", "port": consumer_port}}])
        .to_string(),
    )?;
    let (base, stop, server) = start_broker(&root).await?;

    let pad = "x".repeat(cfg.run.message_bytes);
    for &p in &cfg.producers {
        let topic = format!("produce.p{p}");
        let r = http_load(
            std::slice::from_ref(&base),
            p,
            cfg.run.duration,
            started,
            (1, false),
            &topic,
            &pad,
        )
        .await?;
        let storage = run_appenders(
            &scratch.path().join(format!("storage-{p}")),
            FlushMode::GroupCommit,
            p,
            cfg.run.message_bytes,
            cfg.run.duration,
        )
        .await?;
        writeln!(
            out,
            "{}",
            json!({
                "bench": "http", "what": "produce", "producers": p, "message_bytes": cfg.run.message_bytes,
                "msgs_per_s": r.rate().round(), "mb_per_s": r.rate() * mb, "p50_us": r.p50_us, "p99_us": r.p99_us,
                "storage_alone_msgs_per_s": storage.rate().round(), "ratio_to_storage": r.rate() / storage.rate(),
            })
        )?;
    }
    let most = cfg.producers.iter().copied().max().unwrap_or(64);
    let mut first_rate = None;
    let http = reqwest::Client::new();
    for &n in &cfg.partitions {
        let topic = format!("produce.parts{n}");
        let r = http
            .put(format!("{base}/mmmq/topics/{topic}"))
            .json(&json!({"partitions": n}))
            .send()
            .await?;
        anyhow::ensure!(r.status() == 200, "creating {topic}: {}", r.status());
        let r = http_load(
            std::slice::from_ref(&base),
            most,
            cfg.run.duration,
            started,
            (1, false),
            &topic,
            &pad,
        )
        .await?;
        let base_rate = *first_rate.get_or_insert(r.rate());
        writeln!(
            out,
            "{}",
            json!({
                "bench": "http", "what": "produce_partitions", "producers": most, "partitions": n,
                "msgs_per_s": r.rate().round(), "p50_us": r.p50_us, "p99_us": r.p99_us,
                "ratio_to_first": r.rate() / base_rate,
            })
        )?;
    }
    // Batches with and without produce ids, in the same run: what the dedupe costs. The disk
    // slows down as a run writes gigabytes (the first configuration measured ~60 % faster than the
    // same one run third), so the two alternate in short rounds ordered A B B A A B, which cancels
    // a steady drift; each line sums its rounds.
    let mut sums = [
        (0u64, Duration::ZERO, Vec::new()),
        (0, Duration::ZERO, Vec::new()),
    ];
    let round = cfg.run.duration / 2;
    for ids in [false, true, true, false, false, true] {
        let topic = if ids { "batch.ids" } else { "batch.noids" };
        let r = http_load(
            std::slice::from_ref(&base),
            most,
            round,
            started,
            (100, ids),
            topic,
            &pad,
        )
        .await?;
        let sum = &mut sums[usize::from(ids)];
        sum.0 += r.count;
        sum.1 += r.elapsed;
        sum.2.push(r.p50_us);
    }
    let rate = |i: usize| sums[i].0 as f64 / sums[i].1.as_secs_f64();
    for ids in [false, true] {
        let i = usize::from(ids);
        writeln!(
            out,
            "{}",
            json!({
                "bench": "http", "what": "batch_produce_ids", "producers": most, "batch": 100, "ids": ids,
                "rounds": 3, "msgs_per_s": rate(i).round(), "p50_us_per_request_by_round": sums[i].2,
                "ratio_to_no_ids": rate(i) / rate(0),
            })
        )?;
    }
    let r = http_load(
        std::slice::from_ref(&base),
        8,
        cfg.run.duration,
        started,
        (100, false),
        "batch.t",
        &pad,
    )
    .await?;
    writeln!(
        out,
        "{}",
        json!({
            "bench": "http", "what": "batch_produce", "producers": 8, "batch": 100, "message_bytes": cfg.run.message_bytes,
            "msgs_per_s": r.rate().round(), "mb_per_s": r.rate() * mb, "p50_us_per_request": r.p50_us, "p99_us_per_request": r.p99_us,
        })
    )?;

    *received.lock() = Latencies::default();
    let r = http_load(
        std::slice::from_ref(&base),
        cfg.e2e_producers,
        cfg.run.duration,
        started,
        (1, false),
        "e2e.t",
        &pad,
    )
    .await?;
    // Wait for the consumer to drain what was produced.
    let deadline = Instant::now() + Duration::from_secs(60);
    while (received.lock().len() as u64) < r.count && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drain_end = started.elapsed().as_secs_f64();
    let mut lat = std::mem::take(&mut *received.lock());
    writeln!(
        out,
        "{}",
        json!({
            "bench": "http", "what": "end_to_end", "producers": cfg.e2e_producers, "message_bytes": cfg.run.message_bytes,
            "produced": r.count, "delivered": lat.len(), "produce_msgs_per_s": r.rate().round(),
            "delivered_msgs_per_s": (lat.len() as f64 / (drain_end - r.started_at)).round(),
            "p50_us_produce_to_consumer": lat.percentile_us(0.5), "p99_us_produce_to_consumer": lat.percentile_us(0.99),
        })
    )?;
    stop.cancel();
    let _ = server.await;
    Ok(())
}

/// What a load run measured.
pub(super) struct LoadResult {
    pub(super) count: u64,
    pub(super) elapsed: Duration,
    pub(super) started_at: f64,
    pub(super) p50_us: f64,
    pub(super) p99_us: f64,
}

impl LoadResult {
    /// Messages per second.
    pub(super) fn rate(&self) -> f64 {
        self.count as f64 / self.elapsed.as_secs_f64()
    }
}

/// `producers` clients, each with its own connection and one request in flight, for `duration`;
/// producer `i` sends to `bases[i % bases.len()]`.
pub(super) async fn http_load(
    bases: &[String],
    producers: usize,
    duration: Duration,
    clock: Instant,
    (batch, ids): (usize, bool),
    topic: &str,
    pad: &str,
) -> anyhow::Result<LoadResult> {
    let started_at = clock.elapsed().as_secs_f64();
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for producer in 0..producers {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(1)
            .build()?;
        let base = &bases[producer % bases.len()];
        let url = if batch == 1 {
            format!("{base}/mmmq/messages")
        } else {
            format!("{base}/mmmq/messages/batch")
        };
        let topic = topic.to_owned();
        let pad = pad.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut lat = Latencies::default();
            let mut n = 0u64;
            while Instant::now() < deadline {
                let t = clock.elapsed().as_secs_f64();
                let mut one = || {
                    n += 1;
                    let id = if ids {
                        // Unique over the rounds of a run: a repeated id would append nothing.
                        format!(r#""id":"r{started_at}-p{producer}-{n}","#)
                    } else {
                        String::new()
                    };
                    format!(r#"{{"topic":"{topic}",{id}"content":{{"t":{t},"pad":"{pad}"}}}}"#)
                };
                let body = if batch == 1 {
                    one()
                } else {
                    format!(
                        "[{}]",
                        (0..batch).map(|_| one()).collect::<Vec<_>>().join(",")
                    )
                };
                let sent = Instant::now();
                let r = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await?;
                // A cluster electing a partition's leader (a failover run): tried again, not
                // counted.
                if r.status() == 503 {
                    r.bytes().await?;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
                anyhow::ensure!(r.status() == 200, "produce answered {}", r.status());
                r.bytes().await?;
                lat.push(sent.elapsed());
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut all = Latencies::default();
    for t in tasks {
        all.merge(t.await??);
    }
    let elapsed = start.elapsed();
    Ok(LoadResult {
        count: (all.len() * batch) as u64,
        elapsed,
        started_at,
        p50_us: all.percentile_us(0.5),
        p99_us: all.percentile_us(0.99),
    })
}
