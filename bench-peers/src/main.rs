//! mmmq next to its peers, with one load model: P producers, each with its own connection and
//! exactly one message in flight, for a fixed time; latency is from send to the durable
//! acknowledgement. One JSON line per run.
//!
//! `scripts/bench-peers` installs and starts the peers (Redis with `appendfsync always`, NATS
//! JetStream with file storage, a trivial HTTP server as the floor) and mmmq itself, each on
//! loopback with its data in a temporary directory, and calls this binary against each.

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::json;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum System {
    /// `POST /mmmq/messages` to a running `mmmq serve`.
    Mmmq,
    /// `XADD` to a Redis started with `appendfsync always`.
    Redis,
    /// A JetStream publish, waiting for the stream's ack.
    Nats,
    /// `POST` to the trivial HTTP server of `floor-server`: what the HTTP stack costs.
    Floor,
}

#[derive(Subcommand)]
enum Command {
    /// Durable produce against one system.
    Produce {
        #[arg(long, value_enum)]
        system: System,
        /// `http://127.0.0.1:PORT` (mmmq, floor), `redis://127.0.0.1:PORT`, `nats://127.0.0.1:PORT`.
        #[arg(long)]
        url: String,
        #[arg(long, value_delimiter = ',', default_value = "1,64")]
        producers: Vec<usize>,
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        #[arg(long, default_value_t = 1024)]
        message_bytes: usize,
    },
    /// A trivial HTTP server answering every POST with 200 `{"ack":"ACK"}`.
    FloorServer {
        #[arg(long)]
        port: u16,
    },
}

/// One producer's connection.
enum Conn {
    Http(reqwest::Client, String),
    Redis(redis::aio::MultiplexedConnection),
    Nats(async_nats::jetstream::Context),
}

impl Conn {
    async fn open(system: System, url: &str) -> anyhow::Result<Self> {
        Ok(match system {
            System::Mmmq | System::Floor => Self::Http(
                reqwest::Client::builder().pool_max_idle_per_host(1).build()?,
                format!("{url}/mmmq/messages"),
            ),
            System::Redis => Self::Redis(
                redis::Client::open(url)?
                    .get_multiplexed_async_connection()
                    .await?,
            ),
            System::Nats => {
                Self::Nats(async_nats::jetstream::new(async_nats::connect(url).await?))
            }
        })
    }

    async fn send(&mut self, payload: &str) -> anyhow::Result<()> {
        match self {
            Self::Http(client, url) => {
                let body = format!(r#"{{"topic":"bench","content":{{"pad":"{payload}"}}}}"#);
                let r = client
                    .post(url.as_str())
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await?;
                anyhow::ensure!(r.status() == 200, "answered {}", r.status());
                r.bytes().await?;
            }
            Self::Redis(con) => {
                let _: String = redis::cmd("XADD")
                    .arg("bench")
                    .arg("*")
                    .arg("pad")
                    .arg(payload)
                    .query_async(con)
                    .await?;
            }
            Self::Nats(js) => {
                js.publish("bench.p", payload.to_owned().into())
                    .await?
                    .await?;
            }
        }
        Ok(())
    }
}

fn percentile_us(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p) as usize).min(sorted.len() - 1);
    sorted[i].as_secs_f64() * 1e6
}

async fn produce(
    system: System,
    url: &str,
    producers: usize,
    seconds: u64,
    message_bytes: usize,
) -> anyhow::Result<serde_json::Value> {
    if let System::Nats = system {
        let js = async_nats::jetstream::new(async_nats::connect(url).await?);
        js.get_or_create_stream(async_nats::jetstream::stream::Config {
            name: "BENCH".into(),
            subjects: vec!["bench.>".into()],
            storage: async_nats::jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow::anyhow!("creating the stream: {e}"))?;
    }
    let payload = "x".repeat(message_bytes);
    let mut conns = Vec::with_capacity(producers);
    for _ in 0..producers {
        conns.push(Conn::open(system, url).await.context("connecting")?);
    }
    // One warm-up message per connection, so connection set-up is not measured.
    for c in &mut conns {
        c.send(&payload).await?;
    }
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut c| {
            let payload = payload.clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    c.send(&payload).await?;
                    lat.push(t.elapsed());
                }
                Ok::<_, anyhow::Error>(lat)
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_unstable();
    Ok(json!({
        "bench": "peers", "what": "produce", "system": format!("{system:?}").to_lowercase(),
        "producers": producers, "message_bytes": message_bytes,
        "msgs_per_s": (all.len() as f64 / elapsed).round(),
        "p50_us": percentile_us(&all, 0.5).round(), "p99_us": percentile_us(&all, 0.99).round(),
    }))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Produce {
            system,
            url,
            producers,
            seconds,
            message_bytes,
        } => {
            for p in producers {
                let line = produce(system, &url, p, seconds, message_bytes).await?;
                println!("{line}");
            }
        }
        Command::FloorServer { port } => {
            let app = axum::Router::new().route(
                "/mmmq/messages",
                axum::routing::post(|_body: axum::body::Bytes| async { r#"{"ack":"ACK"}"# }),
            );
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
            axum::serve(listener, app).await?;
        }
    }
    Ok(())
}
