//! Kafka's wire protocol (docs/kafka.md): `serve --kafka-listen ADDR` lets unmodified Kafka
//! clients produce to and consume from the same topics as HTTP.
//!
//! One task per connection reads size-prefixed frames, answers each in order (Kafka's clients
//! pipeline requests and match answers by order as well as by correlation id), and closes the
//! connection, and only it, at the first frame it cannot read: a malformed frame, one over
//! [`Limits::max_frame`], an API or version it does not speak. The codec is the
//! `kafka-protocol` crate, generated from Kafka's own message schemas.
//!
//! # Layout
//! - `versions`: which APIs and versions are spoken, and the answer to ApiVersions.
//! - `connection`: one connection's loop and the dispatch of a request to its handler;
//!   `frames`: reading frames within the listener's budgets (time, memory); `sasl`: the login.
//! - `metadata`, `produce`, `fetch`, `offsets`, `admin`: the data APIs.
//! - `groups`: the classic consumer-group protocol, committed offsets shared with HTTP's groups.
//! - `producers`: idempotent producers' ids and sequence numbers.
//! - `records`: stored messages to record batches and back; `compression`: bounded
//!   decompression of produced batches.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use mmmq_core::Topic;

use kafka_protocol::ResponseError;

use crate::broker::Broker;
use crate::cluster::kafka::LeaderWriteError;
use crate::topics::{Partition, TopicLog};

mod admin;
mod compression;
mod connection;
mod fetch;
mod frames;
mod groups;
mod metadata;
mod offsets;
mod produce;
mod producers;
mod records;
mod sasl;
mod scan;
mod versions;

/// What the Kafka listener is configured with (`serve --kafka-listen`).
#[derive(Debug, Clone)]
pub struct KafkaSettings {
    /// Where to listen (`127.0.0.1:9092`; port 0 picks one).
    pub listen: String,
    /// The `host:port` Metadata names for this broker; `None`: the address each client
    /// connected to.
    pub advertised: Option<String>,
    /// How long a connection may go without a whole request before it is closed (Kafka's
    /// `connections.max.idle.ms`, 10 minutes): also the time a started frame has to arrive,
    /// and an answer to be taken. Clients connect again when they need to.
    pub idle: std::time::Duration,
}

/// Limits of one connection.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The largest frame read; a larger one closes the connection (Kafka's
    /// `socket.request.max.bytes`).
    pub max_frame: usize,
    /// Most connections at once; more wait to be accepted.
    pub max_connections: usize,
    /// The largest record stored (`--max-body-bytes`, as for a message over HTTP); a larger one
    /// is refused with `MESSAGE_TOO_LARGE`.
    pub max_record: usize,
    /// Most connections from one client address (`--max-connections-per-ip`); more are closed
    /// at once.
    pub max_connections_per_ip: usize,
    /// Time a new connection has to send its first frame's size (`--first-byte-timeout-ms`).
    pub first_byte: std::time::Duration,
    /// Time from the connect to a completed SASL login, with `--auth-token`
    /// (`--header-timeout-ms`).
    pub login: std::time::Duration,
    /// Longest a started frame may go without a byte, and a frame may wait for room in the
    /// budget (`--header-timeout-ms`).
    pub stall: std::time::Duration,
    /// Bytes of frames being read or answered at once, over every connection
    /// (`--max-inflight-body-bytes`).
    pub max_inflight_bytes: usize,
}

/// What every connection shares.
pub(crate) struct Shared {
    pub broker: Arc<Broker>,
    pub advertised: Option<(String, i32)>,
    pub auth_token: Option<String>,
    pub limits: Limits,
    pub groups: groups::Coordinator,
    pub producers: producers::Producers,
    /// Producers' states read back from the partitions' logs.
    pub scans: Arc<scan::Scans>,
    /// This broker's node id in Metadata (its cluster node id; 0 alone).
    pub node_id: i32,
    /// [`KafkaSettings::idle`].
    pub idle: std::time::Duration,
    /// The frame budget ([`Limits::max_inflight_bytes`]): one permit a byte.
    pub inflight: Arc<tokio::sync::Semaphore>,
    /// Connections held per client address.
    pub per_address: Arc<crate::listen::PerAddress>,
    /// Closed connections' log lines (a client looping on garbage would fill the log).
    pub closing_log: crate::listen::LogLimit,
}

impl Shared {
    /// The topic a request names, if it exists (a name mmmq refuses names none).
    pub(crate) fn topic(&self, name: &str) -> Option<Arc<TopicLog>> {
        Topic::new(name)
            .ok()
            .and_then(|t| self.broker.registry().get(&t))
    }
}

/// Whether this broker answers reads of partition `p` of `topic`: always alone; in a cluster,
/// only as its leader (Kafka's clients read and write at the leader Metadata names; others
/// answer `NOT_LEADER_OR_FOLLOWER`), once it applied its term's first entry (before, its log
/// may end short of what the previous leader showed as the end, and a client at that end
/// would be told its offset is out of range: `LEADER_NOT_AVAILABLE`, retried).
pub(crate) fn serves_reads(
    shared: &Shared,
    topic: &str,
    p: &Partition,
) -> Result<(), ResponseError> {
    match shared.broker.cluster() {
        None => Ok(()),
        Some(c) => c.leads_ready(topic, p.number).map_err(|e| match e {
            LeaderWriteError::NotReady(_) => ResponseError::LeaderNotAvailable,
            _ => ResponseError::NotLeaderOrFollower,
        }),
    }
}

/// `host:port` split, the port a number.
fn host_port(addr: &str) -> Option<(String, i32)> {
    let (host, port) = addr.rsplit_once(':')?;
    Some((host.to_owned(), i32::from(port.parse::<u16>().ok()?)))
}

/// Partition `index` of `topic`, if both exist.
pub(crate) fn partition_of(topic: Option<&Arc<TopicLog>>, index: i32) -> Option<Arc<Partition>> {
    topic?.partition(u32::try_from(index).ok()?)
}

/// The Kafka address a cluster member names in the metadata (docs/kafka.md, "In a cluster"):
/// `--kafka-advertised`, else the listener's address, its host taken from the broker's own
/// `--peers` entry when it listens on every interface (`0.0.0.0:9092`).
fn announced(advertised: Option<&(String, i32)>, local: SocketAddr, http: &str) -> String {
    if let Some((host, port)) = advertised {
        return format!("{host}:{port}");
    }
    if !local.ip().is_unspecified() {
        return local.to_string();
    }
    let host = http
        .trim_start_matches("http://")
        .rsplit_once(':')
        .map_or("127.0.0.1", |(h, _)| h);
    format!("{host}:{}", local.port())
}

/// Why the Kafka listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// `--kafka-advertised` is not `host:port`.
    #[error("--kafka-advertised {0:?} is not host:port")]
    BadAdvertised(String),
}

/// Reads one request frame (without its size) as a connection does, and a produce's record
/// batches, acting on nothing: the fuzz target's entry (`fuzz/fuzz_targets/kafka_request.rs`).
/// The number of records a produce carried, or why the frame would close its connection.
pub fn read_request(frame: &[u8], max_batch: usize) -> Result<usize, String> {
    connection::read_only(frame, max_batch)
}

/// Serves Kafka clients on `listener` until `stop` is cancelled.
pub async fn serve(
    listener: TcpListener,
    broker: Arc<Broker>,
    settings: KafkaSettings,
    limits: Limits,
    stop: CancellationToken,
) -> Result<(), KafkaError> {
    let mut advertised = match &settings.advertised {
        None => None,
        Some(a) => Some(host_port(a).ok_or_else(|| KafkaError::BadAdvertised(a.clone()))?),
    };
    let node_id = broker.cluster().map_or(0, |c| c.id() as i32);
    if let Some(cluster) = broker.cluster() {
        let local = listener
            .local_addr()
            .map_err(|e| KafkaError::BadAdvertised(e.to_string()))?;
        let addr = announced(advertised.as_ref(), local, cluster.addr());
        // Metadata names this broker as the others do.
        advertised = host_port(&addr);
        cluster.announce_kafka(Some(addr));
    }
    let shared = Arc::new(Shared {
        auth_token: broker.config().auth_token.clone(),
        producers: producers::Producers::new(node_id as u64),
        scans: Arc::default(),
        idle: settings.idle,
        inflight: Arc::new(tokio::sync::Semaphore::new(
            limits
                .max_inflight_bytes
                .min(tokio::sync::Semaphore::MAX_PERMITS),
        )),
        per_address: crate::listen::PerAddress::new(limits.max_connections_per_ip),
        closing_log: crate::listen::LogLimit::new(std::time::Duration::from_secs(10)),
        groups: groups::Coordinator::default(),
        broker,
        advertised,
        limits,
        node_id,
    });
    shared
        .broker
        .groups()
        .show_kafka_groups(Arc::new(groups::Statuses(shared.clone())));
    tokio::spawn(groups::expire_sessions(shared.clone(), stop.clone()));
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.expect("never closed"),
            _ = stop.cancelled() => return Ok(()),
        };
        let (stream, peer): (_, SocketAddr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors, say: wait a little rather than spin.
                    tracing::warn!(error = %e, "kafka: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => return Ok(()),
        };
        // Taken in accept order, as HTTP's: past the cap the connection is closed at once
        // (Kafka's `max.connections.per.ip`), its `--max-connections` slot given back.
        let Some(share) = shared.per_address.take(peer.ip()) else {
            shared.broker.metrics().kafka.connections_refused.inc();
            if let Some(suppressed) = shared.closing_log.allow() {
                tracing::warn!(%peer, suppressed, cap = limits.max_connections_per_ip,
                    "kafka: too many connections from one address (--max-connections-per-ip)");
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let metrics = &shared.broker.metrics().kafka;
            metrics.connections_open.inc();
            connection::run(stream, peer, shared.clone(), stop).await;
            shared.broker.metrics().kafka.connections_open.dec();
            drop(share);
            drop(permit);
        });
    }
}
