//! Raft's traffic between brokers: every group's messages to a peer go over one keep-alive HTTP
//! connection pool to that peer's own listener, under `/mmmq/internal/raft/` (docs/cluster.md,
//! "Raft traffic"). Bodies are postcard (binary serde), not JSON: an append carries messages.
//!
//! `openraft-multi` adapts this one [`Router`] into each group's network, so ten thousand
//! partitions share one client, one pool and one fault switch.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use openraft::OptionalSend;
use openraft::error::{
    NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft_multi::{GroupNetworkAdapter, GroupNetworkFactory, GroupRouter};
use parking_lot::RwLock;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::faults::Faults;
use super::identity::{CLUSTER_HEADER, Identity};
use super::secret::MEMBER_HEADER;
use super::types::{BrokerId, Raft};

/// The path prefix of Raft's traffic on a broker's HTTP listener.
pub const RAFT_PATH: &str = "/mmmq/internal/raft";

/// Which Raft group a message is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum GroupId {
    /// The metadata group: brokers, topics, placement, configuration.
    Meta,
    /// One partition of a topic.
    Partition(String, u32),
}

impl std::fmt::Display for GroupId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GroupId::Meta => f.write_str("meta"),
            GroupId::Partition(topic, p) => write!(f, "{topic}/{p}"),
        }
    }
}

/// The snapshot bytes every group's state machine sends (one type, since one router carries
/// them all).
pub type SnapshotBytes = Vec<u8>;

/// A snapshot on the wire.
pub type Snapshot = openraft::alias::SnapshotOf<Raft, SnapshotBytes>;

/// Sends Raft's messages to peers. Cheap to clone.
#[derive(Clone)]
pub struct Router {
    inner: Arc<RouterInner>,
}

struct RouterInner {
    http: reqwest::Client,
    /// Each peer's HTTP base address (`http://host:port`), from `--peers` and the metadata group.
    peers: RwLock<HashMap<BrokerId, String>>,
    token: Option<String>,
    faults: Faults,
    /// This broker's cluster id: every message carries it once known (docs/cluster.md, "The
    /// cluster's id").
    identity: Arc<Identity>,
    /// Peers that refused this broker's messages as another cluster's, with what they said:
    /// logged once, not at every retry, until a message to the peer goes through again.
    refusals: RwLock<HashMap<BrokerId, String>>,
}

/// Why a message did not get an answer.
#[derive(Debug, thiserror::Error)]
pub(super) enum SendError {
    #[error("no address known for broker {0}")]
    NoAddress(BrokerId),
    #[error("broker {0} is cut off (fault injection)")]
    CutOff(BrokerId),
    #[error("cannot reach broker {0}: {1}")]
    Connect(BrokerId, reqwest::Error),
    #[error("broker {0} answered {1}: {2}")]
    Status(BrokerId, reqwest::StatusCode, String),
    #[error("exchange with broker {0} failed: {1}")]
    Exchange(BrokerId, String),
    #[error("broker {0} refused the message: {1}")]
    OtherCluster(BrokerId, String),
}

impl SendError {
    /// Unreachable makes openraft back off; anything else is retried at once. A broker of
    /// another cluster is as good as unreachable: it refuses whatever is sent.
    fn into_rpc(self) -> RPCError<Raft> {
        match self {
            SendError::NoAddress(_)
            | SendError::CutOff(_)
            | SendError::Connect(..)
            | SendError::OtherCluster(..) => RPCError::Unreachable(Unreachable::new(&self)),
            _ => RPCError::Network(NetworkError::new(&self)),
        }
    }

    fn into_streaming(self) -> StreamingError<Raft> {
        match self.into_rpc() {
            RPCError::Unreachable(e) => StreamingError::Unreachable(e),
            RPCError::Network(e) => StreamingError::Network(e),
            other => StreamingError::Network(NetworkError::from_string(other)),
        }
    }
}

impl Router {
    /// A router that knows `peers` (broker id → `host:port` or `http://host:port`), its messages
    /// naming `identity`'s cluster.
    pub fn new(
        peers: &HashMap<BrokerId, String>,
        token: Option<String>,
        faults: Faults,
        identity: Arc<Identity>,
    ) -> Self {
        let http = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(90))
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(2))
            .build()
            .expect("a TLS-less HTTP client builds");
        let router = Self {
            inner: Arc::new(RouterInner {
                http,
                peers: RwLock::new(HashMap::new()),
                token,
                faults,
                identity,
                refusals: RwLock::new(HashMap::new()),
            }),
        };
        for (id, addr) in peers {
            router.set_peer(*id, addr);
        }
        router
    }

    /// Learns (or changes) a peer's address.
    pub fn set_peer(&self, id: BrokerId, addr: &str) {
        let base = if addr.starts_with("http://") || addr.starts_with("https://") {
            addr.trim_end_matches('/').to_owned()
        } else {
            format!("http://{addr}")
        };
        self.inner.peers.write().insert(id, base);
    }

    /// A peer's base address, if known.
    pub fn peer(&self, id: BrokerId) -> Option<String> {
        self.inner.peers.read().get(&id).cloned()
    }

    /// The fault switch of this broker's outgoing traffic.
    pub fn faults(&self) -> &Faults {
        &self.inner.faults
    }

    /// This broker's cluster id.
    pub fn identity(&self) -> &Arc<Identity> {
        &self.inner.identity
    }

    /// The shared HTTP client (forwarding to leaders uses the same pool).
    pub fn http(&self) -> &reqwest::Client {
        &self.inner.http
    }

    /// A `POST /mmmq/internal/raft/{rpc}` to peer `to` with a postcard `body`, as a member of
    /// the cluster it names; `None` when no address of `to` is known.
    pub fn internal_post(
        &self,
        to: BrokerId,
        rpc: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Option<reqwest::RequestBuilder> {
        let base = self.peer(to)?;
        let request = self
            .inner
            .http
            .post(format!("{base}{RAFT_PATH}/{rpc}"))
            .header("content-type", "application/octet-stream")
            .timeout(timeout)
            .body(body);
        Some(self.credentials(request))
    }

    /// The token and the cluster's id, on a request to a peer.
    /// The members' secret and the cluster's id, once known, on a request to a peer: what
    /// makes it a member's (docs/cluster.md, "Who may speak for the cluster"). The token is
    /// presented too, since every route of a broker with `--auth-token` asks for it; it admits
    /// nobody to `/mmmq/internal/*` on its own.
    pub fn credentials(&self, mut request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        if let Some(token) = &self.inner.token {
            request = request.bearer_auth(token);
        }
        if let Some(secret) = self.inner.identity.secret().known() {
            request = request.header(MEMBER_HEADER, secret);
        }
        if let Some(id) = self.inner.identity.known() {
            request = request.header(CLUSTER_HEADER, id);
        }
        request
    }

    /// Notes a peer's refusal of this broker's cluster: logged the first time, not at each
    /// retry (docs/cluster.md, "The cluster's id").
    fn refused(&self, peer: BrokerId, why: &str) {
        let mut refusals = self.inner.refusals.write();
        if refusals.get(&peer).is_none_or(|said| said != why) {
            tracing::error!(peer, "broker {peer} refuses this broker's messages: {why}");
            refusals.insert(peer, why.to_owned());
        }
    }

    /// Forgets a peer's refusal once a message went through: a new one is logged again.
    fn answered(&self, peer: BrokerId) {
        if self.inner.refusals.read().contains_key(&peer) {
            self.inner.refusals.write().remove(&peer);
        }
    }

    /// The auth token peers expect, if any.
    pub fn token(&self) -> Option<&str> {
        self.inner.token.as_deref()
    }

    /// Pings `peer` on behalf of `me`: the groups it leads, with their terms (docs/cluster.md,
    /// "Liveness and elections").
    pub(super) async fn ping(
        &self,
        peer: BrokerId,
        me: BrokerId,
        ttl: Duration,
    ) -> Result<Vec<(GroupId, u64)>, SendError> {
        match self.send(peer, "ping", &GroupId::Meta, &me, ttl).await? {
            Ok(leads) => Ok(leads),
            Err(e) => Err(SendError::Exchange(peer, e.to_string())),
        }
    }

    async fn send<Req, Resp>(
        &self,
        target: BrokerId,
        rpc: &str,
        group: &GroupId,
        req: &Req,
        ttl: Duration,
    ) -> Result<Result<Resp, RaftError<Raft>>, SendError>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
    {
        let base = self.peer(target).ok_or(SendError::NoAddress(target))?;
        if let Some(delay) = self.inner.faults.outgoing(target) {
            match delay {
                None => return Err(SendError::CutOff(target)),
                Some(d) => tokio::time::sleep(d).await,
            }
        }
        let body = postcard::to_stdvec(&(group, req))
            .map_err(|e| SendError::Exchange(target, e.to_string()))?;
        let request = self
            .inner
            .http
            .post(format!("{base}{RAFT_PATH}/{rpc}"))
            .timeout(ttl)
            .header("content-type", "application/octet-stream")
            .body(body);
        let response = self.credentials(request).send().await.map_err(|e| {
            if e.is_connect() {
                SendError::Connect(target, e)
            } else {
                SendError::Exchange(target, e.to_string())
            }
        })?;
        let status = response.status();
        // A 409 naming the peer's cluster: it belongs to another (its guard, in `identity`).
        let other_cluster = status == reqwest::StatusCode::CONFLICT
            && response.headers().contains_key(CLUSTER_HEADER);
        let bytes = response
            .bytes()
            .await
            .map_err(|e| SendError::Exchange(target, e.to_string()))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes).into_owned();
            if other_cluster {
                self.refused(target, &text);
                return Err(SendError::OtherCluster(target, text));
            }
            return Err(SendError::Status(target, status, text));
        }
        self.answered(target);
        postcard::from_bytes(&bytes).map_err(|e| SendError::Exchange(target, e.to_string()))
    }

    async fn call<Req, Resp>(
        &self,
        target: BrokerId,
        rpc: &str,
        group: GroupId,
        req: Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<Raft>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
    {
        match self
            .send(target, rpc, &group, &req, option.hard_ttl())
            .await
        {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(remote)) => Err(RPCError::Network(NetworkError::from_string(format!(
                "broker {target}, group {group}: {remote}"
            )))),
            Err(e) => Err(e.into_rpc()),
        }
    }
}

impl GroupRouter<Raft, GroupId> for Router {
    type SnapshotData = SnapshotBytes;

    async fn append_entries(
        &self,
        target: BrokerId,
        group_id: GroupId,
        rpc: AppendEntriesRequest<Raft>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<Raft>, RPCError<Raft>> {
        self.call(target, "append", group_id, rpc, &option).await
    }

    async fn vote(
        &self,
        target: BrokerId,
        group_id: GroupId,
        rpc: VoteRequest<Raft>,
        option: RPCOption,
    ) -> Result<VoteResponse<Raft>, RPCError<Raft>> {
        self.call(target, "vote", group_id, rpc, &option).await
    }

    async fn pre_vote(
        &self,
        target: BrokerId,
        group_id: GroupId,
        rpc: VoteRequest<Raft>,
        option: RPCOption,
    ) -> Result<VoteResponse<Raft>, RPCError<Raft>> {
        self.call(target, "pre-vote", group_id, rpc, &option).await
    }

    async fn full_snapshot(
        &self,
        target: BrokerId,
        group_id: GroupId,
        vote: openraft::alias::VoteOf<Raft>,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<Raft>, StreamingError<Raft>> {
        let req = (vote, snapshot.meta, snapshot.snapshot);
        let send = self.send::<_, SnapshotResponse<Raft>>(
            target,
            "snapshot",
            &group_id,
            &req,
            option.hard_ttl(),
        );
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            sent = send => match sent {
                Ok(Ok(resp)) => Ok(resp),
                Ok(Err(remote)) => Err(StreamingError::Network(NetworkError::from_string(
                    format!("broker {target}, group {group_id}: {remote}"),
                ))),
                Err(e) => Err(e.into_streaming()),
            },
        }
    }

    async fn transfer_leader(
        &self,
        target: BrokerId,
        group_id: GroupId,
        req: TransferLeaderRequest<Raft>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<Raft>, RPCError<Raft>> {
        self.call(target, "transfer-leader", group_id, req, &option)
            .await
    }

    fn backoff(&self) -> Option<Backoff> {
        // A peer that is down is retried every 200 ms: failover needs the others, not it.
        Some(Backoff::new(std::iter::repeat(Duration::from_millis(200))))
    }
}

/// One group's view of the [`Router`].
pub type NetworkFactory = GroupNetworkFactory<Router, GroupId>;

impl RaftNetworkFactory<Raft> for NetworkFactory {
    type Network = GroupNetworkAdapter<Raft, GroupId, Router>;

    async fn new_client(&mut self, target: BrokerId, node: &openraft::BasicNode) -> Self::Network {
        // Membership carries each broker's address: a broker added later is reachable at once.
        if self.factory.peer(target).is_none() {
            self.factory.set_peer(target, &node.addr);
        }
        GroupNetworkAdapter::new(self.factory.clone(), target, self.group_id.clone())
    }
}
