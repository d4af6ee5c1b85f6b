//! mmmq next to its peers, with one load model: P producers, each with its own connection and
//! exactly one message in flight, for a fixed time; latency is from send to the durable
//! acknowledgement. One JSON line per run.
//!
//! `e2e` measures the same producers with a consumer attached: a no-op HTTP consumer that mmmq
//! pushes to (batched delivery, docs/dispatchers.md, "Dispatchers"), a Redis consumer group (`XREADGROUP` + `XACK`), a
//! JetStream pull consumer with explicit acks, a RabbitMQ consumer with manual acks. Latency is
//! from send to receipt by the consumer. Through a WebAssembly plugin (`mmmq-plugin`) it reports
//! whether the plugin kept up instead.
//!
//! `scripts/bench-peers` installs and starts the peers (Redis with `appendfsync always`, NATS
//! JetStream with file storage, RabbitMQ with a durable queue and publisher confirms, a trivial
//! HTTP server as the floor) and mmmq itself, each on
//! loopback with its data in a temporary directory, and calls this binary against each.

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::json;

mod batched;
mod consumers;

use consumers::{
    Received, http_consumer, nats_consumer, now_us, rabbit_consumer, redis_consumer, stamped,
};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum System {
    /// `POST /mmmq/messages` to a running `mmmq serve`.
    Mmmq,
    /// mmmq with a no-op WebAssembly plugin as the consumer (e2e only: its `dispatchers.json`
    /// has a plugin dispatcher `bench-plugin` on topic `bench`).
    MmmqPlugin,
    /// `XADD` to a Redis started with `appendfsync always`.
    Redis,
    /// A JetStream publish, waiting for the stream's ack.
    Nats,
    /// A persistent message to a durable RabbitMQ queue, waiting for the publisher confirm.
    Rabbitmq,
    /// `POST` to the trivial HTTP server of `floor-server`: what the HTTP stack costs.
    Floor,
}

#[derive(Subcommand)]
enum Command {
    /// Durable produce against one system.
    Produce {
        #[arg(long, value_enum)]
        system: System,
        /// `http://127.0.0.1:PORT` (mmmq, floor), `redis://127.0.0.1:PORT`, `nats://127.0.0.1:PORT`,
        /// `amqp://127.0.0.1:PORT/%2f` (RabbitMQ).
        #[arg(long)]
        url: String,
        #[arg(long, value_delimiter = ',', default_value = "1,64")]
        producers: Vec<usize>,
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        #[arg(long, default_value_t = 1024)]
        message_bytes: usize,
        /// The server's process: when given, the line also says how much CPU the server spent
        /// and how many context switches it made per message (what bounds a rate on a shared
        /// machine, where the load generator and the server split the same cores).
        #[arg(long)]
        server_pid: Option<u32>,
    },
    /// Produce with a consumer attached; counts and times what the consumer receives.
    E2e {
        #[arg(long, value_enum)]
        system: System,
        #[arg(long)]
        url: String,
        #[arg(long, value_delimiter = ',', default_value = "16")]
        producers: Vec<usize>,
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        #[arg(long, default_value_t = 1024)]
        message_bytes: usize,
        /// mmmq only: where this process listens as the HTTP consumer its `dispatchers.json` names.
        #[arg(long)]
        consumer_port: Option<u16>,
    },
    /// Durable produce with many messages in flight per connection, batched by the client:
    /// Redis pipelines, JetStream asynchronous publishes (the load model of a Kafka producer).
    Batched {
        #[arg(long, value_enum)]
        system: System,
        #[arg(long)]
        url: String,
        #[arg(long, value_delimiter = ',', default_value = "1,8")]
        producers: Vec<usize>,
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        #[arg(long, default_value_t = 1024)]
        message_bytes: usize,
        /// Messages per pipeline (Redis) or published before their acks are awaited (NATS).
        #[arg(long, default_value_t = 1000)]
        window: usize,
    },
    /// A trivial HTTP server answering every POST with 200 `{"ack":"ACK"}`.
    FloorServer {
        #[arg(long)]
        port: u16,
    },
}

/// One producer's connection.
enum Conn {
    /// A bare HTTP/1.1 connection (hyper's client, no pool, no redirects): the lightest client
    /// there is, so that the machine's two cores go to the server, not to the load generator.
    Http(
        hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>,
        String,
    ),
    Redis(redis::aio::MultiplexedConnection),
    Nats(async_nats::jetstream::Context),
    Rabbit(lapin::Channel),
}

/// The durable queue every RabbitMQ producer publishes to.
const RABBIT_QUEUE: &str = "bench";

/// A channel on its own connection, with the durable queue declared.
async fn rabbit_channel(url: &str) -> anyhow::Result<lapin::Channel> {
    let connection =
        lapin::Connection::connect(url, lapin::ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel
        .queue_declare(
            RABBIT_QUEUE,
            lapin::options::QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await?;
    // Dropping the connection handle would close it; the bench process exits instead.
    std::mem::forget(connection);
    Ok(channel)
}

impl Conn {
    async fn open(system: System, url: &str) -> anyhow::Result<Self> {
        Ok(match system {
            System::Mmmq | System::MmmqPlugin | System::Floor => {
                let authority = url
                    .strip_prefix("http://")
                    .context("an http:// URL")?
                    .trim_end_matches('/')
                    .to_owned();
                let stream = tokio::net::TcpStream::connect(&authority).await?;
                stream.set_nodelay(true)?;
                let (sender, connection) =
                    hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                        .await?;
                tokio::spawn(connection);
                Self::Http(sender, authority)
            }
            System::Redis => Self::Redis(
                redis::Client::open(url)?
                    .get_multiplexed_async_connection()
                    .await?,
            ),
            System::Nats => Self::Nats(async_nats::jetstream::new(async_nats::connect(url).await?)),
            System::Rabbitmq => {
                let channel = rabbit_channel(url).await?;
                channel
                    .confirm_select(lapin::options::ConfirmSelectOptions::default())
                    .await?;
                Self::Rabbit(channel)
            }
        })
    }

    async fn send(&mut self, payload: &str) -> anyhow::Result<()> {
        match self {
            Self::Http(sender, authority) => {
                let body = format!(r#"{{"topic":"bench","content":{{"pad":"{payload}"}}}}"#);
                let request = hyper::Request::post("/mmmq/messages")
                    .header(hyper::header::HOST, authority.as_str())
                    .header(hyper::header::CONTENT_TYPE, "application/json")
                    .body(http_body_util::Full::new(bytes::Bytes::from(body)))?;
                sender.ready().await?;
                let response = sender.send_request(request).await?;
                let status = response.status();
                let body = http_body_util::BodyExt::collect(response.into_body()).await?;
                anyhow::ensure!(status == 200, "answered {status}: {:?}", body.to_bytes());
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
            Self::Rabbit(channel) => {
                let confirm = channel
                    .basic_publish(
                        "",
                        RABBIT_QUEUE,
                        lapin::options::BasicPublishOptions::default(),
                        payload.as_bytes(),
                        // 2: persistent.
                        lapin::BasicProperties::default().with_delivery_mode(2),
                    )
                    .await?
                    .await?;
                anyhow::ensure!(confirm.is_ack(), "RabbitMQ did not confirm: {confirm:?}");
            }
        }
        Ok(())
    }
}

/// The system as named on the command line (`mmmq-plugin`, `rabbitmq`, …).
fn system_name(system: System) -> String {
    system
        .to_possible_value()
        .expect("no variant is skipped")
        .get_name()
        .to_owned()
}

fn percentile_us(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p) as usize).min(sorted.len() - 1);
    sorted[i].as_secs_f64() * 1e6
}

/// Creates the JetStream stream the producers write to (idempotent).
async fn nats_stream(url: &str) -> anyhow::Result<async_nats::jetstream::stream::Stream> {
    let js = async_nats::jetstream::new(async_nats::connect(url).await?);
    js.get_or_create_stream(async_nats::jetstream::stream::Config {
        name: "BENCH".into(),
        subjects: vec!["bench.>".into()],
        storage: async_nats::jetstream::stream::StorageType::File,
        ..Default::default()
    })
    .await
    .map_err(|e| anyhow::anyhow!("creating the stream: {e}"))
}

/// P producers in a closed loop for `seconds`; returns every send-to-ack latency and the time
/// the measured window took.
async fn run_producers(
    system: System,
    url: &str,
    producers: usize,
    seconds: u64,
    message_bytes: usize,
    received: Option<&Received>,
    server_pid: Option<u32>,
) -> anyhow::Result<(Vec<Duration>, f64, Option<ProcUsage>)> {
    let mut conns = Vec::with_capacity(producers);
    for _ in 0..producers {
        conns.push(Conn::open(system, url).await.context("connecting")?);
    }
    // One warm-up message per connection, so connection set-up is not measured.
    for c in &mut conns {
        c.send(&stamped(message_bytes)).await?;
    }
    let server_before = server_pid
        .map(|pid| ProcUsage::read(pid).map(|usage| (pid, usage)))
        .transpose()?;
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    if let Some(r) = received {
        let from = now_us();
        *r.window.lock().unwrap() = (from, from + seconds * 1_000_000);
    }
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    c.send(&stamped(message_bytes)).await?;
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
    let server = server_before
        .map(|(pid, before)| ProcUsage::read(pid).map(|now| now.since(&before)))
        .transpose()?;
    all.sort_unstable();
    Ok((all, elapsed, server))
}

/// A process's CPU time and context switches, from `/proc`.
struct ProcUsage {
    cpu: Duration,
    switches: u64,
}

impl ProcUsage {
    /// CPU time includes threads that have exited (`/proc/PID/stat`); switches are summed over
    /// the live threads (`/proc/PID/task/*/status`), so a thread that exits mid-run is missed.
    fn read(pid: u32) -> anyhow::Result<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .with_context(|| format!("reading /proc/{pid}/stat"))?;
        // Fields after the command name (which may hold spaces) start at `state`, field 3;
        // utime and stime are fields 14 and 15, in clock ticks of 1/100 s on Linux.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .context("malformed /proc/PID/stat")?
            .1
            .split_whitespace()
            .collect();
        let field = |i: usize| -> anyhow::Result<u64> {
            Ok(fields.get(i).context("short /proc/PID/stat")?.parse()?)
        };
        let ticks = field(11)? + field(12)?;
        let mut switches = 0;
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
            let Ok(status) = std::fs::read_to_string(task?.path().join("status")) else {
                continue; // the thread exited meanwhile
            };
            switches += status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>();
        }
        Ok(Self {
            cpu: Duration::from_millis(ticks * 10),
            switches,
        })
    }

    fn since(&self, before: &Self) -> Self {
        Self {
            cpu: self.cpu.saturating_sub(before.cpu),
            switches: self.switches.saturating_sub(before.switches),
        }
    }
}

async fn produce(
    system: System,
    url: &str,
    producers: usize,
    seconds: u64,
    message_bytes: usize,
    server_pid: Option<u32>,
) -> anyhow::Result<serde_json::Value> {
    if let System::Nats = system {
        nats_stream(url).await?;
    }
    let (all, elapsed, server) = run_producers(
        system,
        url,
        producers,
        seconds,
        message_bytes,
        None,
        server_pid,
    )
    .await?;
    let mut line = json!({
        "bench": "peers", "what": "produce", "system": system_name(system),
        "producers": producers, "message_bytes": message_bytes,
        "msgs_per_s": (all.len() as f64 / elapsed).round(),
        "p50_us": percentile_us(&all, 0.5).round(), "p99_us": percentile_us(&all, 0.99).round(),
    });
    if let Some(u) = server {
        let messages = all.len().max(1) as f64;
        line["server_cores"] = json!((u.cpu.as_secs_f64() / elapsed * 100.0).round() / 100.0);
        line["server_cpu_us_per_msg"] =
            json!((u.cpu.as_secs_f64() * 1e7 / messages).round() / 10.0);
        line["server_switches_per_msg"] =
            json!((u.switches as f64 * 100.0 / messages).round() / 100.0);
    }
    Ok(line)
}

/// Messages the plugin dispatcher `bench-plugin` has acknowledged, from `GET /mmmq/dispatchers`.
async fn plugin_delivered(http: &reqwest::Client, url: &str) -> anyhow::Result<u64> {
    let status: serde_json::Value = http
        .get(format!("{url}/mmmq/dispatchers"))
        .send()
        .await?
        .json()
        .await?;
    status
        .as_array()
        .and_then(|ds| ds.iter().find(|d| d["consumerId"] == "bench-plugin"))
        .and_then(|d| d["delivered"].as_u64())
        .context("no dispatcher bench-plugin in GET /mmmq/dispatchers")
}

/// Produce while a no-op plugin consumes: a plugin's receipt cannot be timed from outside, so
/// this shows whether it keeps up — what it had acknowledged when the producers stopped, and how
/// long it took to acknowledge the rest.
async fn plugin_e2e(
    url: &str,
    producers: usize,
    seconds: u64,
    message_bytes: usize,
) -> anyhow::Result<serde_json::Value> {
    let http = reqwest::Client::new();
    let before = plugin_delivered(&http, url).await?;
    let (produced, elapsed, _) = run_producers(
        System::MmmqPlugin,
        url,
        producers,
        seconds,
        message_bytes,
        None,
        None,
    )
    .await?;
    let total = (produced.len() + producers) as u64;
    let at_end = plugin_delivered(&http, url).await? - before;
    let stopped = Instant::now();
    while plugin_delivered(&http, url).await? - before < total {
        anyhow::ensure!(
            stopped.elapsed() < Duration::from_secs(60),
            "the plugin did not catch up"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(json!({
        "bench": "peers", "what": "e2e", "system": system_name(System::MmmqPlugin),
        "producers": producers, "message_bytes": message_bytes,
        "produced_per_s": (produced.len() as f64 / elapsed).round(),
        "behind_when_producers_stopped": total - at_end.min(total),
        "caught_up_ms": (stopped.elapsed().as_secs_f64() * 1e3).round(),
    }))
}

/// Produce with a consumer attached: the consumer's rate and latency inside the window.
async fn e2e(
    system: System,
    url: &str,
    producers: usize,
    seconds: u64,
    message_bytes: usize,
    consumer_port: Option<u16>,
) -> anyhow::Result<serde_json::Value> {
    let received = std::sync::Arc::new(Received::default());
    let consumer = {
        let (url, r) = (url.to_owned(), received.clone());
        match system {
            System::Mmmq => {
                let port = consumer_port.context("mmmq needs --consumer-port")?;
                tokio::spawn(async move { http_consumer(port, r).await })
            }
            System::MmmqPlugin => return plugin_e2e(&url, producers, seconds, message_bytes).await,
            System::Redis => tokio::spawn(async move { redis_consumer(&url, r).await }),
            System::Nats => tokio::spawn(async move { nats_consumer(&url, r).await }),
            System::Rabbitmq => tokio::spawn(async move { rabbit_consumer(&url, r).await }),
            System::Floor => anyhow::bail!("the floor has no consumer"),
        }
    };
    // Let the consumer subscribe before the first message.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (produced, elapsed, _) = run_producers(
        system,
        url,
        producers,
        seconds,
        message_bytes,
        Some(&received),
        None,
    )
    .await?;
    // What was sent inside the window and arrives within a second after it counts towards
    // latency; only what arrived inside the window counts towards the rate.
    tokio::time::sleep(Duration::from_secs(1)).await;
    consumer.abort();
    let to = received.window.lock().unwrap().1;
    let times = std::mem::take(&mut *received.times.lock().unwrap());
    let delivered = times.iter().filter(|(_, at)| *at <= to).count();
    let mut lat: Vec<Duration> = times
        .iter()
        .map(|(sent, at)| Duration::from_micros(at - sent))
        .collect();
    lat.sort_unstable();
    Ok(json!({
        "bench": "peers", "what": "e2e", "system": system_name(system),
        "producers": producers, "message_bytes": message_bytes,
        "produced_per_s": (produced.len() as f64 / elapsed).round(),
        "delivered_per_s": (delivered as f64 / elapsed).round(),
        "p50_us": percentile_us(&lat, 0.5).round(), "p99_us": percentile_us(&lat, 0.99).round(),
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
            server_pid,
        } => {
            for p in producers {
                let line = produce(system, &url, p, seconds, message_bytes, server_pid).await?;
                println!("{line}");
            }
        }
        Command::E2e {
            system,
            url,
            producers,
            seconds,
            message_bytes,
            consumer_port,
        } => {
            for p in producers {
                let line = e2e(system, &url, p, seconds, message_bytes, consumer_port).await?;
                println!("{line}");
            }
        }
        Command::Batched {
            system,
            url,
            producers,
            seconds,
            message_bytes,
            window,
        } => {
            for p in producers {
                let line =
                    batched::batched(system, &url, p, seconds, message_bytes, window).await?;
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
