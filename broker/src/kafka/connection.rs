//! One Kafka connection (docs/kafka.md, "Connections"): size-prefixed frames in, answers out in
//! the same order, SASL/PLAIN before anything else when the broker has an auth token.
//!
//! A frame this broker cannot read closes the connection and nothing else: one shorter than a
//! request header or longer than the frame limit, an unknown API key, a version not spoken (Kafka
//! closes there too; ApiVersions alone answers with the versions it speaks, KIP-511), a body that
//! does not decode. Nothing of such a frame was stored: a request is acted on only once it has
//! decoded whole. Bytes after a whole body are ignored, as Kafka ignores them, but for a produce's.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, RequestHeader, RequestKind, ResponseHeader, ResponseKind,
};
use kafka_protocol::protocol::{Encodable, decode_request_header_from_buffer};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::{Shared, admin, fetch, frames, groups, metadata, offsets, produce, sasl, versions};

/// Why a connection is closed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refused {
    #[error("frame of {0} bytes (limit {1})")]
    FrameSize(i64, usize),
    #[error("unknown API key {0}")]
    UnknownApi(i16),
    #[error("{0:?} version {1} is not spoken")]
    Version(ApiKey, i16),
    #[error("{0:?} before SASL authentication")]
    Unauthenticated(ApiKey),
    #[error("SASL authentication failed")]
    AuthFailed,
    #[error("malformed {0:?} request: {1}")]
    Malformed(ApiKey, String),
    #[error("malformed request header: {0}")]
    Header(String),
    #[error("encoding an answer: {0}")]
    Encode(String),
    #[error("waited past the limit for {0}")]
    Stalled(&'static str),
    #[error("a frame of {0} bytes waited past the limit for room in --max-inflight-body-bytes")]
    Budget(usize),

    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl Refused {
    /// The metric label of why (`mmmq_kafka_connections_closed_total{reason}`).
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Refused::FrameSize(..) => "frame_size",
            Refused::UnknownApi(_) | Refused::Version(..) => "version",
            Refused::Unauthenticated(_) => "unauthenticated",
            Refused::AuthFailed => "auth_failed",
            Refused::Malformed(..) | Refused::Header(_) => "malformed",
            Refused::Encode(_) => "encode",
            Refused::Stalled(_) => "timeout",
            Refused::Budget(_) => "budget",
            Refused::Io(_) => "io",
        }
    }
}

/// The largest frame read before a SASL login (Kafka's default `sasl.server.max.receive.size`).
const PRE_AUTH_MAX_FRAME: usize = 512 << 10;

/// What one connection knows about itself.
pub(crate) struct Session {
    /// The address the client connected to: what Metadata advertises when no address is set.
    pub local: SocketAddr,
    pub peer: SocketAddr,
    /// The client id of its latest request.
    pub client_id: String,
    /// SASL done, or not required.
    pub authenticated: bool,
    /// A SaslHandshake chose PLAIN (a SaslAuthenticate needs one first).
    pub(crate) handshake: bool,
    /// A SaslHandshake v0 was answered: the next frame is a bare SASL token.
    pub(crate) raw_sasl_next: bool,
    /// Close once the answer is written (a failed login).
    pub(crate) close_after_answer: bool,
}

/// Serves one connection until the client closes it, it sends what cannot be read, or `stop`.
pub(crate) async fn run(
    stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let Ok(local) = stream.local_addr() else {
        return;
    };
    let mut session = Session {
        local,
        peer,
        client_id: String::new(),
        authenticated: shared.auth_token.is_none(),
        handshake: false,
        raw_sasl_next: false,
        close_after_answer: false,
    };
    let (r, w) = stream.into_split();
    let mut r = BufReader::with_capacity(64 << 10, r);
    let mut w = BufWriter::with_capacity(64 << 10, w);
    let span = tracing::debug_span!("kafka", %peer);
    let _enter = span.enter();
    let mut limits = shared.limits;
    // A started frame may not stall longer than a connection may idle.
    limits.stall = limits.stall.min(shared.idle);
    let mut clock = frames::Clock::new();
    let outcome: Result<(), Refused> = async {
        loop {
            let deadline = clock.deadline(&limits, shared.idle, session.authenticated);
            let size = tokio::select! {
                size = frames::size(&mut r, deadline) => match size? {
                    frames::Next::Size(size) => size,
                    frames::Next::Done => return Ok(()),
                },
                _ = stop.cancelled() => return Ok(()),
            };
            clock.arrived();
            // Before a login only small frames are read (Kafka's `sasl.server.max.receive.size`):
            // an unauthenticated client cannot make the broker hold a large request.
            let limit = if session.authenticated {
                limits.max_frame
            } else {
                PRE_AUTH_MAX_FRAME.min(limits.max_frame)
            };
            if size > limit {
                return Err(Refused::FrameSize(size as i64, limit));
            }
            // Only a produce carries batches: any other request is at most a message's size
            // (`--max-body-bytes`), as HTTP's bodies are. Decoded, a request of many small
            // array elements takes many times its bytes, so the limit is what bounds the memory
            // a request can make the broker hold.
            let small = limits.max_record.min(limit);
            let mut head = [0u8; 2];
            let head: &[u8] = if size > small && !session.raw_sasl_next {
                tokio::time::timeout(limits.stall, r.read_exact(&mut head))
                    .await
                    .map_err(|_| Refused::Stalled("the rest of a frame"))??;
                if i16::from_be_bytes(head) != ApiKey::Produce as i16 {
                    return Err(Refused::FrameSize(size as i64, small));
                }
                &head
            } else {
                &[]
            };
            let frame = frames::read(
                &mut r,
                size,
                head,
                &shared.inflight,
                limits.max_inflight_bytes,
                limits.stall,
                (!session.authenticated).then(|| clock.login_by(&limits)),
            )
            .await?;
            let key = (frame.bytes.len() >= 2)
                .then(|| i16::from_be_bytes([frame.bytes[0], frame.bytes[1]]));
            let answer = if session.raw_sasl_next {
                session.raw_sasl_next = false;
                sasl::login(&shared, &mut session, &frame.bytes).await?;
                // An empty server token: done (Kafka's answer to a PLAIN login after v0).
                Some(framed(|_| Ok(()))?)
            } else {
                handle(&shared, &mut session, frame.bytes.clone()).await?
            };
            if key != Some(ApiKey::ApiVersions as i16) {
                clock.active();
            }
            let answered = async {
                if let Some(answer) = answer {
                    w.write_all(&answer).await?;
                }
                // More requests already buffered are answered first, then flushed together; a
                // request without an answer (`acks=0`) flushes the ones before it too.
                if r.buffer().is_empty() || session.close_after_answer {
                    w.flush().await?;
                }
                Ok::<_, std::io::Error>(())
            };
            tokio::time::timeout(shared.idle, answered)
                .await
                .map_err(|_| Refused::Stalled("the client to read an answer"))??;
            // The frame's share of the budget goes back once its answer is out.
            drop(frame);
            if session.close_after_answer {
                return Err(Refused::AuthFailed);
            }
        }
    }
    .await;
    let _ = w.flush().await;
    if let Err(e) = outcome {
        shared.broker.metrics().kafka.closed(e.reason());
        if let Some(suppressed) = shared.closing_log.allow() {
            tracing::warn!(%peer, error = %e, suppressed, "kafka: closing the connection");
        }
    }
}

/// Reads, answers and encodes one request; `None` for a request that gets no answer (a produce
/// with `acks=0`).
async fn handle(
    shared: &Shared,
    session: &mut Session,
    mut frame: Bytes,
) -> Result<Option<BytesMut>, Refused> {
    let (key, version, header) = parse_header(&mut frame)?;
    if let Some(id) = &header.client_id
        && session.client_id != id.as_str()
    {
        session.client_id = id.as_str().to_owned();
    }
    if key == ApiKey::ApiVersions && version > versions::max_of(ApiKey::ApiVersions) {
        // KIP-511: answered at v0 with the versions of ApiVersions itself; the client retries.
        let answer = ApiVersionsResponse::default()
            .with_error_code(ResponseError::UnsupportedVersion.code())
            .with_api_keys(versions::entries(false));
        return encode(
            key,
            0,
            header.correlation_id,
            &ResponseKind::ApiVersions(answer),
        )
        .map(Some);
    }
    if !versions::speaks(key, version) {
        return Err(Refused::Version(key, version));
    }
    if !session.authenticated
        && !matches!(
            key,
            ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate
        )
    {
        return Err(Refused::Unauthenticated(key));
    }
    let request = parse_body(key, version, &mut frame)?;
    let answer = match request {
        RequestKind::ApiVersions(_) => ResponseKind::ApiVersions(
            ApiVersionsResponse::default().with_api_keys(versions::entries(true)),
        ),
        RequestKind::SaslHandshake(r) => {
            ResponseKind::SaslHandshake(sasl::handshake(session, &r, version))
        }
        RequestKind::SaslAuthenticate(r) => {
            ResponseKind::SaslAuthenticate(sasl::authenticate(shared, session, &r).await)
        }
        RequestKind::Metadata(r) => {
            ResponseKind::Metadata(metadata::answer(shared, session, r, version).await)
        }
        RequestKind::Produce(r) => match produce::answer(shared, r, version).await {
            Some(a) => ResponseKind::Produce(a),
            None => return Ok(None),
        },
        RequestKind::Fetch(r) => ResponseKind::Fetch(fetch::answer(shared, r, version).await),
        RequestKind::ListOffsets(r) => {
            ResponseKind::ListOffsets(offsets::list(shared, r, version).await)
        }
        RequestKind::OffsetCommit(r) => {
            ResponseKind::OffsetCommit(groups::commit(shared, r, version).await)
        }
        RequestKind::OffsetFetch(r) => {
            ResponseKind::OffsetFetch(groups::fetch_offsets(shared, r, version).await)
        }
        RequestKind::FindCoordinator(r) => {
            ResponseKind::FindCoordinator(metadata::coordinator(shared, session, r, version))
        }
        RequestKind::JoinGroup(r) => {
            ResponseKind::JoinGroup(groups::join(shared, r, version, session).await)
        }
        RequestKind::SyncGroup(r) => ResponseKind::SyncGroup(groups::sync(shared, r).await),
        RequestKind::Heartbeat(r) => ResponseKind::Heartbeat(groups::heartbeat(shared, r)),
        RequestKind::LeaveGroup(r) => ResponseKind::LeaveGroup(groups::leave(shared, r, version)),
        RequestKind::ListGroups(r) => ResponseKind::ListGroups(groups::list(shared, r).await),
        RequestKind::DescribeGroups(r) => {
            ResponseKind::DescribeGroups(groups::describe(shared, r).await)
        }
        RequestKind::InitProducerId(r) => ResponseKind::InitProducerId(shared.producers.init(r)),
        RequestKind::CreateTopics(r) => {
            ResponseKind::CreateTopics(admin::create_topics(shared, r, version).await)
        }
        RequestKind::DeleteTopics(r) => {
            ResponseKind::DeleteTopics(admin::delete_topics(shared, r, version).await)
        }
        RequestKind::DescribeConfigs(r) => {
            ResponseKind::DescribeConfigs(admin::describe_configs(shared, r))
        }
        _ => return Err(Refused::Version(key, version)),
    };
    encode(key, version, header.correlation_id, &answer).map(Some)
}

/// A request's header: its API, version and header fields.
fn parse_header(frame: &mut Bytes) -> Result<(ApiKey, i16, RequestHeader), Refused> {
    if frame.len() < 8 {
        return Err(Refused::Header(format!("{} bytes", frame.len())));
    }
    let raw_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let key = ApiKey::try_from(raw_key).map_err(|()| Refused::UnknownApi(raw_key))?;
    let header =
        decode_request_header_from_buffer(frame).map_err(|e| Refused::Header(e.to_string()))?;
    Ok((key, version, header))
}

/// A request's body. Bytes after a body that decoded whole are logged and ignored, as Kafka's
/// broker ignores them (docs/kafka.md, "Bad input"): librdkafka 2.0.2 — Debian's, under kcat —
/// leaves some after ListGroups v4 and after OffsetFetch v6+ for all of a group's partitions
/// (it writes a 4-byte placeholder where a flexible version's array count is one byte). Not
/// after a produce's: what would be stored must be all the frame holds (a batch encoded for
/// another version than its header says can decode with bytes over).
fn parse_body(key: ApiKey, version: i16, frame: &mut Bytes) -> Result<RequestKind, Refused> {
    let request = RequestKind::decode(key, frame, version)
        .map_err(|e| Refused::Malformed(key, e.to_string()))?;
    if key == ApiKey::Produce && frame.has_remaining() {
        return Err(Refused::Malformed(
            key,
            format!("{} bytes after the produce", frame.remaining()),
        ));
    }
    if frame.has_remaining() {
        tracing::debug!(
            api = ?key,
            version,
            bytes = frame.remaining(),
            "kafka: bytes after a request's body ignored"
        );
    }
    Ok(request)
}

/// Reads one frame as a connection does, and a produce's record batches too (decompressed into
/// at most `max_batch` bytes all together, as a produce's), acting on nothing: what the fuzz target drives. The number
/// of records a produce carried.
pub(crate) fn read_only(frame: &[u8], max_batch: usize) -> Result<usize, String> {
    let mut frame = Bytes::copy_from_slice(frame);
    let (key, version, _) = parse_header(&mut frame).map_err(|e| e.to_string())?;
    if !versions::speaks(key, version) {
        return Err(Refused::Version(key, version).to_string());
    }
    let request = parse_body(key, version, &mut frame).map_err(|e| e.to_string())?;
    let RequestKind::Produce(produce) = request else {
        return Ok(0);
    };
    let mut records = 0;
    let budget = std::sync::atomic::AtomicUsize::new(max_batch);
    for t in produce.topic_data {
        for p in t.partition_data {
            let batches = super::records::decode(p.records.unwrap_or_default(), &budget)
                .map_err(|e| e.to_string())?;
            records += batches.iter().map(|b| b.payloads.len()).sum::<usize>();
        }
    }
    Ok(records)
}

/// A whole answer: size, header, body.
fn encode(
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &ResponseKind,
) -> Result<BytesMut, Refused> {
    let header_version = key.response_header_version(version);
    framed(|out| {
        ResponseHeader::default()
            .with_correlation_id(correlation_id)
            .encode(out, header_version)?;
        body.encode(out, version)
    })
}

/// Writes a size-prefixed frame.
fn framed(write: impl FnOnce(&mut BytesMut) -> anyhow::Result<()>) -> Result<BytesMut, Refused> {
    let mut out = BytesMut::with_capacity(256);
    out.put_i32(0);
    write(&mut out).map_err(|e| Refused::Encode(e.to_string()))?;
    let size = (out.len() - 4) as i32;
    out[..4].copy_from_slice(&size.to_be_bytes());
    Ok(out)
}
