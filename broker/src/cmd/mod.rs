//! The commands of the `mmmq` binary: their flags, and what each one runs.
//!
//! # Layout
//! - this module: the command line ([`Cli`]), `serve`, `inspect` and `plugin`, which hand over to
//!   the library at once.
//! - `client`: `produce`, `tail`, `topics`, `dispatchers`, over `mmmq-client`.
//! - `cluster`: `mmmq cluster status`.
//! - `plugin`: `mmmq plugin …` (`deploy`: the commands on deployed plugins; `replay`).
//! - `shell`: `completions` and `man`, generated from [`Cli`].
//! - `table`: how tables and `--json` lines are printed (used by `client`, `deploy`, `dlq`).
//! - `bench`: `mmmq bench`, one file per benchmark.

mod bench;
mod client;
mod cluster;
mod deploy;
mod dlq;
mod plugin;
mod replay;
mod shell;
mod table;
mod topic;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use mmmq::config::{ServeConfig, defaults};
use mmmq::storage::{FlushMode, OsFs, Vfs};

/// `mmmq --version`: the version, the plugin worlds this binary runs, and the SDK a new plugin
/// (`mmmq plugin new`) is built with. (`-V` prints the version alone.)
static LONG_VERSION: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{}
plugin worlds: {}
plugin SDK: mmmq-plugin-sdk {}",
        env!("CARGO_PKG_VERSION"),
        mmmq::plugin::SERVED_WORLDS.join(", "),
        mmmq::plugin::scaffold::SDK_VERSION,
    )
});

#[derive(Parser)]
#[command(
    name = "mmmq",
    version,
    long_version = LONG_VERSION.as_str(),
    about = "A durable message broker with WebAssembly handlers"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the broker.
    Serve(Box<ServeArgs>),
    /// Produce one message (JSON from the argument, or one per line of stdin); prints receipts.
    Produce {
        /// The topic.
        #[arg(long)]
        topic: String,
        /// An optional key.
        #[arg(long)]
        key: Option<String>,
        /// An idempotency id: producing it again within the topic's dedupe window stores nothing
        /// (with stdin, line N gets `ID-N`). Without it each message gets a fresh one.
        #[arg(long)]
        id: Option<String>,
        /// The content as JSON; without it, one message per line of stdin.
        json: Option<String>,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Print a topic's messages as JSON lines (pull API).
    Tail {
        /// The topic.
        #[arg(long)]
        topic: String,
        /// The partition (offsets are per partition).
        #[arg(long, default_value_t = 0)]
        partition: u32,
        /// First offset.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Keep waiting for new messages.
        #[arg(long)]
        follow: bool,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// The broker's topics as a table.
    Topics {
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Create, configure, show or delete one topic.
    Topic {
        #[command(subcommand)]
        what: topic::TopicCommand,
    },
    /// A cluster of brokers: its brokers and partitions.
    Cluster {
        #[command(subcommand)]
        what: cluster::ClusterCommand,
    },
    /// A dispatcher's dead letters, and delivering them again (redrive).
    Dlq {
        #[command(subcommand)]
        what: dlq::DlqCommand,
    },
    /// The broker's pull consumer groups: members, partitions and lag.
    Groups {
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// The broker's dispatchers and their status as a table.
    Dispatchers {
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Make the broker re-read `dispatchers.json` and its plugin files; prints what changed.
    Reload {
        /// JSON instead of lines.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Read a topic directory offline and print every entry and a summary; exits 1 on corruption.
    Inspect {
        /// A topic directory (`{root}/topics/{topic}`), a `topics/` directory or a root dir.
        dir: PathBuf,
        /// Print offsets, sizes and CRC status but not payloads.
        #[arg(long)]
        no_payload: bool,
    },
    /// Tools for WebAssembly handlers.
    Plugin {
        #[command(subcommand)]
        what: plugin::PluginCommand,
    },
    /// Print a shell completion script (e.g. `mmmq completions bash > /etc/bash_completion.d/mmmq`).
    Completions(shell::CompletionsArgs),
    /// Print the man page (`mmmq man | man -l -`), or write all pages with --out-dir.
    Man(shell::ManArgs),
    /// Benchmarks that print JSON lines.
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
}

#[derive(clap::Args)]
struct BrokerArg {
    /// The broker's URL.
    #[arg(long = "broker", env = "MMMQ_BROKER", default_value = mmmq_client::DEFAULT_BROKER)]
    url: String,
    /// Bearer token, when the broker requires one (prefer the environment variable: a flag's
    /// value is visible to every local user in /proc/PID/cmdline).
    #[arg(long, env = "MMMQ_AUTH_TOKEN", hide_env_values = true)]
    auth_token: Option<String>,
}

impl BrokerArg {
    fn conn(&self) -> client::Conn {
        client::Conn {
            url: self.url.clone(),
            token: self.auth_token.clone(),
        }
    }
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Where topics, checkpoints and dispatchers.json live.
    #[arg(long, env = "MMMQ_ROOT_DIR", default_value = defaults::ROOT_DIR)]
    root_dir: PathBuf,
    /// Address to listen on (port 0 picks a free port; the log says which).
    #[arg(long, env = "MMMQ_LISTEN", default_value = defaults::LISTEN)]
    listen: String,
    /// A new segment starts when the tail has reached this size (a soft cap).
    #[arg(long, env = "MMMQ_SEGMENT_MAX_BYTES", default_value_t = defaults::SEGMENT_MAX_BYTES)]
    segment_max_bytes: u64,
    /// Largest message body accepted; a batch may be 32 times this.
    #[arg(long, env = "MMMQ_MAX_BODY_BYTES", default_value_t = defaults::MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// When a produce is acknowledged: group (group commit, durable), per-append (durable, slow),
    /// none (no fsync: survives a crash of mmmq, not of the machine).
    #[arg(long, env = "MMMQ_FLUSH", default_value = defaults::FLUSH)]
    flush: FlushMode,
    /// Require `Authorization: Bearer <token>` on every endpoint but /healthz and the dashboard's
    /// page. Prefer the environment variable: a flag's value is visible to every local user (in
    /// /proc/PID/cmdline and `ps`).
    #[arg(long, env = "MMMQ_AUTH_TOKEN", hide_env_values = true)]
    auth_token: Option<String>,
    /// Host names (comma-separated) the broker answers besides loopback ones; with it, or while
    /// listening on a loopback address, a request for any other Host is refused (403), so a
    /// DNS-rebinding web page reads nothing.
    #[arg(long, env = "MMMQ_ALLOWED_HOSTS", value_delimiter = ',')]
    allowed_hosts: Vec<String>,
    /// Most topics producers may create; producing to a new topic past it is refused with 403.
    #[arg(long, env = "MMMQ_MAX_TOPICS", default_value_t = defaults::MAX_TOPICS)]
    max_topics: usize,
    /// Partitions (1–1024) of a topic created without a configuration (by its first produce).
    #[arg(long, env = "MMMQ_DEFAULT_PARTITIONS", default_value_t = 1)]
    default_partitions: u32,
    /// Retention of a topic created without a configuration, in milliseconds, or `forever`
    /// (default 14 days).
    #[arg(long, env = "MMMQ_DEFAULT_RETENTION_MS", default_value = "1209600000", value_parser = topic::parse_retention)]
    default_retention_ms: topic::Retention,
    /// How often retention deletes expired segments (it also runs at boot).
    #[arg(long, env = "MMMQ_RETENTION_CHECK_MS", default_value_t = defaults::RETENTION_CHECK_MS)]
    retention_check_ms: u64,
    /// Most concurrent client connections; more wait to be accepted.
    #[arg(long, env = "MMMQ_MAX_CONNECTIONS", default_value_t = defaults::MAX_CONNECTIONS)]
    max_connections: usize,
    /// Most concurrent connections from one client address; past it a connection gets 503.
    #[arg(long, env = "MMMQ_MAX_CONNECTIONS_PER_IP", default_value_t = defaults::MAX_CONNECTIONS_PER_IP)]
    max_connections_per_ip: usize,
    /// Time a new connection has to send its first byte before it is closed.
    #[arg(long, env = "MMMQ_FIRST_BYTE_TIMEOUT_MS", default_value_t = defaults::FIRST_BYTE_TIMEOUT_MS)]
    first_byte_timeout_ms: u64,
    /// Request body bytes being received or held at once, over all requests (plugin uploads
    /// included); past it a request gets 503 with Retry-After.
    #[arg(long, env = "MMMQ_MAX_INFLIGHT_BODY_BYTES", default_value_t = defaults::MAX_INFLIGHT_BODY_BYTES)]
    max_inflight_body_bytes: usize,
    /// Time a client has to send a request's headers, and to start its next request on a
    /// kept-alive connection (slow or idle connections are closed).
    #[arg(long, env = "MMMQ_HEADER_TIMEOUT_MS", default_value_t = defaults::HEADER_TIMEOUT_MS)]
    header_timeout_ms: u64,
    /// Time a request has to send its body and be answered (408 past it).
    #[arg(long, env = "MMMQ_REQUEST_TIMEOUT_MS", default_value_t = defaults::REQUEST_TIMEOUT_MS)]
    request_timeout_ms: u64,
    /// Most segment files held open at once, over all topics (the least recently used are closed
    /// and reopened on their next use). Default: the descriptor limit minus --max-connections
    /// and 512 more for everything else, but at least a quarter of the limit.
    #[arg(long, env = "MMMQ_MAX_OPEN_FILES")]
    max_open_files: Option<usize>,
    /// Most produce ids remembered over all topics (about 130 bytes each); past it the topic
    /// that claims a new id forgets its oldest before their dedupWindowMs ends (a warning and
    /// the mmmq_produce_ids_forgotten_early metric say so).
    #[arg(long, env = "MMMQ_MAX_PRODUCE_IDS", default_value_t = defaults::MAX_PRODUCE_IDS)]
    max_produce_ids: usize,
    /// Most pull consumer groups held at once; a new group's first poll past it is refused
    /// with 503 (a group without members is forgotten 10 minutes after its last poll).
    #[arg(long, env = "MMMQ_MAX_GROUPS", default_value_t = defaults::MAX_GROUPS)]
    max_groups: usize,
    /// Most partitions over all topics; creating or growing a topic past it is refused with 403.
    #[arg(long, env = "MMMQ_MAX_PARTITIONS", default_value_t = defaults::MAX_PARTITIONS)]
    max_partitions: usize,
    /// Also speak Kafka's wire protocol on this address (port 0 picks a free port; the log says
    /// which): Kafka clients produce to and consume from the same topics (docs/kafka.md).
    #[arg(long, env = "MMMQ_KAFKA_LISTEN")]
    kafka_listen: Option<String>,
    /// The `host:port` Kafka clients are told to reach this broker at (Metadata); default: the
    /// address each client connected to.
    #[arg(long, env = "MMMQ_KAFKA_ADVERTISED", requires = "kafka_listen")]
    kafka_advertised: Option<String>,
    /// A Kafka connection without a whole request for this long is closed (Kafka's
    /// `connections.max.idle.ms`); a frame must arrive and an answer be read within it too.
    #[arg(
        long,
        env = "MMMQ_KAFKA_IDLE_MS",
        default_value_t = 600_000,
        requires = "kafka_listen"
    )]
    kafka_idle_ms: u64,
    #[command(flatten)]
    cluster: cluster::ClusterFlags,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// The broker embedded in-process: produce without HTTP, a backlog drained by a no-op Rust
    /// handler, and produce-to-handler latency.
    Embedded(bench::embedded::EmbeddedBench),
    /// WebAssembly handlers: the cost of one call (reused instance and instance per message) and a
    /// backlog drained through a no-op plugin next to a no-op HTTP consumer. Build the plugin
    /// first: cargo build --profile plugin --target wasm32-wasip2 -p noop
    Plugin(bench::plugin::PluginBench),
    /// The router example (0.2.0, one emit per message): call cost, a 1,000,000 backlog drained
    /// next to the no-op plugin, deploy-to-serving latency. Build both first: cargo build
    /// --profile plugin --target wasm32-wasip2 -p router -p noop
    Router(bench::router::RouterBench),
    /// The broker over HTTP: durable produce, batch produce, and end to end through a no-op HTTP
    /// consumer, next to the storage engine alone.
    Http(bench::http::HttpBench),
    /// The segment store alone: appends/s under each flush mode and appender count, with the raw
    /// disk measured in the same run.
    Storage(bench::storage::StorageBench),
    /// A boot with a large stored log: time until the broker is ready.
    Boot(bench::boot::BootBench),
    /// Many idle topics, each with a dispatcher: resident memory and threads.
    Topics(bench::topics::TopicsBench),
    /// Delivery through a slow consumer with maxInFlight lanes, and pull consumer groups.
    Consume(bench::consume::ConsumeBench),
    /// Many stored messages: resident memory after boot and while reading the oldest.
    Memory(bench::memory::MemoryBench),
    /// The id window of idempotent produce: memory and time per id at a rate over a window.
    Dedup(bench::dedup::DedupBench),
    /// Produce without end into a topic with small segments and a small retentionBytes: disk use
    /// and resident memory over time.
    Soak(bench::soak::SoakBench),
    /// Brokers of this binary as a cluster on 127.0.0.1: replicated produce next to a single
    /// broker, failover after SIGKILLs of a leader, the idle cost of many partition groups.
    Cluster(bench::cluster::ClusterBench),
}

/// Runs the command.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve(args) => {
            raise_fd_limit();
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(serve(*args))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Inspect { dir, no_payload } => {
            let vfs: Arc<dyn Vfs> = Arc::new(OsFs);
            let options = mmmq::inspect::InspectOptions { no_payload };
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let summary = match mmmq::inspect::run(&vfs, &dir, &options, &mut out) {
                Ok(summary) => summary,
                // `mmmq inspect … | head` is normal use, not an error.
                Err(mmmq::inspect::InspectError::Output(e))
                    if e.kind() == std::io::ErrorKind::BrokenPipe =>
                {
                    return Ok(ExitCode::SUCCESS);
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot inspect {}", dir.display()));
                }
            };
            Ok(if summary.is_clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Produce {
            topic,
            key,
            id,
            json,
            broker,
        } => {
            let rt = tokio::runtime::Runtime::new()?;
            let mut out = std::io::stdout();
            rt.block_on(client::produce(
                &broker.conn(),
                (&topic, key.as_deref(), id.as_deref()),
                json.as_deref(),
                &mut out,
            ))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Tail {
            topic,
            partition,
            from,
            follow,
            broker,
        } => {
            let rt = tokio::runtime::Runtime::new()?;
            let mut out = std::io::stdout();
            let at = (topic.as_str(), partition);
            match rt.block_on(client::tail(&broker.conn(), at, from, follow, &mut out)) {
                Err(client::CliError::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
                other => other?,
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Topics { json, broker } => {
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(client::topics(&broker.conn(), json, &mut std::io::stdout()))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Topic { what } => topic::run(what),
        Command::Cluster { what } => cluster::run(what),
        Command::Completions(args) => {
            shell::completions(&args, &mut std::io::stdout())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Man(args) => {
            shell::man(&args, &mut std::io::stdout())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Dlq { what } => dlq::run(what),
        Command::Groups { json, broker } => {
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(client::groups(&broker.conn(), json, &mut std::io::stdout()))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Reload { json, broker } => {
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(client::reload(&broker.conn(), json, &mut std::io::stdout()))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Dispatchers { json, broker } => {
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(client::dispatchers(
                &broker.conn(),
                json,
                &mut std::io::stdout(),
            ))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin { what } => plugin::run(what),
        Command::Bench { what } => {
            raise_fd_limit();
            let rt = tokio::runtime::Runtime::new()?;
            let out = &mut std::io::stdout();
            rt.block_on(async {
                match what {
                    BenchCommand::Embedded(cfg) => bench::embedded::run(cfg, out).await,
                    BenchCommand::Plugin(cfg) => bench::plugin::run(cfg, out).await,
                    BenchCommand::Router(cfg) => bench::router::run(cfg, out).await,
                    BenchCommand::Http(cfg) => bench::http::run(cfg, out).await,
                    BenchCommand::Storage(cfg) => bench::storage::run(cfg, out).await,
                    BenchCommand::Boot(cfg) => bench::boot::run(cfg, out).await,
                    BenchCommand::Topics(cfg) => bench::topics::run(cfg, out).await,
                    BenchCommand::Cluster(cfg) => bench::cluster::run(cfg, out).await,
                    BenchCommand::Memory(cfg) => bench::memory::run(cfg, out).await,
                    BenchCommand::Consume(cfg) => bench::consume::run(cfg, out).await,
                    BenchCommand::Soak(cfg) => bench::soak::run(cfg, out).await,
                    BenchCommand::Dedup(cfg) => bench::dedup::run(cfg, out),
                }
            })?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

impl ServeArgs {
    /// The settings these flags ask for (checked by [`ServeConfig::validate`] when the broker
    /// opens).
    fn config(&self) -> anyhow::Result<ServeConfig> {
        let mut config = ServeConfig::new(&self.root_dir).with_flush(self.flush);
        config.segment_max_bytes = self.segment_max_bytes;
        config.max_body_bytes = self.max_body_bytes;
        config.auth_token = self.auth_token.clone().filter(|t| !t.is_empty());
        config.max_topics = self.max_topics;
        config.max_produce_ids = self.max_produce_ids;
        config.max_groups = self.max_groups;
        config.max_open_files = self.max_open_files;
        config.allowed_hosts = self.allowed_hosts.clone();
        config.http.max_connections = self.max_connections;
        config.http.max_connections_per_ip = self.max_connections_per_ip;
        config.http.first_byte_timeout = Duration::from_millis(self.first_byte_timeout_ms);
        config.http.max_inflight_body_bytes = self.max_inflight_body_bytes;
        config.http.header_read_timeout = Duration::from_millis(self.header_timeout_ms);
        config.http.request_timeout = Duration::from_millis(self.request_timeout_ms);
        config.topic_defaults.partitions = self.default_partitions;
        config.topic_defaults.retention_ms = self.default_retention_ms.0;
        config.retention_check = Duration::from_millis(self.retention_check_ms);
        config.max_partitions = self.max_partitions;
        config.cluster = self.cluster.settings(&self.listen)?;
        config.kafka = self
            .kafka_listen
            .clone()
            .map(|listen| mmmq::kafka::KafkaSettings {
                listen,
                advertised: self.kafka_advertised.clone(),
                idle: Duration::from_millis(self.kafka_idle_ms.max(1)),
            });
        Ok(config)
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let config = args.config()?;
    // Refused before the port is taken, so a typo is one clear line, not a half-started broker.
    config.validate()?;
    // So is a broken dispatchers.json.
    let root = args.root_dir.clone();
    tokio::task::spawn_blocking(move || mmmq::config::read_dispatchers(&root)).await??;
    let shutdown = shutdown_signal();
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, root_dir = %args.root_dir.display(), "listening");
    mmmq::server::run(listener, config, shutdown).await?;
    Ok(())
}

/// SIGINT or SIGTERM. The handlers are installed here, before the port is announced, not when
/// the future is first polled: a signal sent as soon as the broker listens must stop it cleanly,
/// not end it by the default action.
fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    }
}

/// Each topic holds a few files open; the default soft limit (often 1,024) is too low for many
/// topics. Raising the soft limit to the hard limit needs no privilege; a privileged process (root
/// in a container, CAP_SYS_RESOURCE) may also raise the hard limit, up to the kernel's `nr_open`.
fn raise_fd_limit() {
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(0);
    if nr_open > 0 && rlimit::setrlimit(rlimit::Resource::NOFILE, nr_open, nr_open).is_ok() {
        tracing::debug!(limit = nr_open, "file descriptor limit");
        return;
    }
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => tracing::debug!(limit = n, "file descriptor limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the file descriptor limit"),
    }
}
