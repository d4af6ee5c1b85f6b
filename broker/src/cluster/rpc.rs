//! The receiving end of Raft's traffic (docs/cluster.md, "Raft traffic"):
//! `POST /mmmq/internal/raft/{rpc}` with a postcard body `(group, request)`, answered with the
//! postcard of `Result<response, RaftError>`. The broker's guard has checked the token already.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use openraft::async_runtime::WatchReceiver;
use openraft::error::{ClientWriteError, Fatal, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::storage::RaftStateMachine;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::membership::MembersChange;
use super::network::{GroupId, SnapshotBytes};
use super::screen::{check_append, check_kinds, check_term, refused};
use super::types::{Applied, BrokerId, Command, Raft};

type SnapshotMeta = openraft::alias::SnapshotMetaOf<Raft>;
type Vote = openraft::alias::VoteOf<Raft>;

/// Why a write was not applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, thiserror::Error)]
pub enum WriteRefused {
    /// This broker does not lead the group; the leader, if known.
    #[error("not the leader (leader: {leader:?})")]
    NotLeader {
        /// The leader's id.
        leader: Option<BrokerId>,
    },
    /// The write failed for another reason.
    #[error("{0}")]
    Failed(String),
    /// The entry was appended but cut when this broker lost its leadership: it may still be
    /// committed by the next leader, or not (docs/cluster.md, "Topics and produce in a cluster").
    #[error("the entry was discarded on a change of leader; it may be committed or not")]
    Discarded,
    /// The group stopped on this broker while the write was under way (its disk refused): the
    /// other replicas may still commit what it had sent them.
    #[error("the group stopped during the write, its outcome is unknown: {0}")]
    Unknown(String),
    /// Nothing was written, and the same write may be tried again soon (a new leader that has
    /// not applied its term's first entry yet: docs/cluster.md, "Produce ids in a cluster").
    #[error("nothing was written, try again: {0}")]
    Retry(String),
}

/// What a group's Raft answers, whatever its state machine: the handler finds one by group.
#[async_trait::async_trait]
pub trait Endpoint: Send + Sync {
    /// `append`
    async fn append(
        &self,
        req: AppendEntriesRequest<Raft>,
    ) -> Result<AppendEntriesResponse<Raft>, RaftError<Raft>>;
    /// `vote`
    async fn vote(&self, req: VoteRequest<Raft>) -> Result<VoteResponse<Raft>, RaftError<Raft>>;
    /// `pre-vote`
    async fn pre_vote(&self, req: VoteRequest<Raft>)
    -> Result<VoteResponse<Raft>, RaftError<Raft>>;
    /// `snapshot`
    async fn snapshot(
        &self,
        vote: Vote,
        meta: SnapshotMeta,
        data: SnapshotBytes,
    ) -> Result<SnapshotResponse<Raft>, RaftError<Raft>>;
    /// `transfer-leader`
    async fn transfer_leader(
        &self,
        req: TransferLeaderRequest<Raft>,
    ) -> Result<TransferLeaderResponse<Raft>, RaftError<Raft>>;
    /// `write`: appends commands as one batch if this broker leads the group, and answers once
    /// a majority holds them and they are applied.
    async fn write(&self, commands: Vec<Command>) -> Result<Vec<Applied>, WriteRefused>;
    /// `members`: changes the group's members if this broker leads it (docs/cluster.md,
    /// "Membership").
    async fn change_members(&self, change: MembersChange) -> Result<(), WriteRefused>;
    /// The group as this broker sees it now.
    fn view(&self) -> GroupView;
    /// Stops the group on this broker.
    async fn stop(&self);
    /// Asks this replica to run for leader (a pre-vote first: refused while a majority still
    /// hears from a leader). See docs/cluster.md, "Liveness and elections".
    async fn elect(&self);
    /// The running Raft instance of a partition's group, for what needs more than these calls
    /// (a dispatcher's lease, docs/cluster.md, "Delivery in a cluster").
    fn partition_raft(&self) -> Option<super::supervise::PartitionRaft> {
        None
    }
    /// Retention on this replica of a partition: its whole segments before `offset` go through
    /// its group's purge; answers the new first offset if they went (docs/cluster.md,
    /// "Retention in a cluster"). Partition groups only.
    async fn purge_before(&self, offset: u64) -> Result<Option<u64>, String> {
        let _ = offset;
        Err("only a partition's group purges for retention".to_owned())
    }
}

/// A group as one broker sees it (`GET /mmmq/cluster`, metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupView {
    /// The leader this broker knows of.
    pub leader: Option<BrokerId>,
    /// The term.
    pub term: u64,
    /// This broker's last log index (`null`: empty).
    pub last_log_index: Option<u64>,
    /// The last index applied here.
    pub last_applied: Option<u64>,
    /// When this broker leads: each replica's last index it holds (`null`: none yet).
    pub matched: std::collections::BTreeMap<BrokerId, Option<u64>>,
    /// The voters.
    pub voters: Vec<BrokerId>,
}

#[async_trait::async_trait]
impl<SM> Endpoint for openraft::Raft<Raft, SM>
where
    SM: RaftStateMachine<Raft, SnapshotData = SnapshotBytes>,
{
    async fn append(
        &self,
        req: AppendEntriesRequest<Raft>,
    ) -> Result<AppendEntriesResponse<Raft>, RaftError<Raft>> {
        self.append_entries(req).await
    }

    async fn vote(&self, req: VoteRequest<Raft>) -> Result<VoteResponse<Raft>, RaftError<Raft>> {
        openraft::Raft::vote(self, req).await
    }

    async fn pre_vote(
        &self,
        req: VoteRequest<Raft>,
    ) -> Result<VoteResponse<Raft>, RaftError<Raft>> {
        openraft::Raft::pre_vote(self, req).await
    }

    async fn snapshot(
        &self,
        vote: Vote,
        meta: SnapshotMeta,
        data: SnapshotBytes,
    ) -> Result<SnapshotResponse<Raft>, RaftError<Raft>> {
        let snapshot = openraft::alias::SnapshotOf::<Raft, SnapshotBytes> {
            meta,
            snapshot: data,
        };
        self.install_full_snapshot(vote, snapshot)
            .await
            .map_err(RaftError::Fatal)
    }

    async fn transfer_leader(
        &self,
        req: TransferLeaderRequest<Raft>,
    ) -> Result<TransferLeaderResponse<Raft>, RaftError<Raft>> {
        self.handle_transfer_leader(req)
            .await
            .map_err(RaftError::Fatal)
    }

    async fn change_members(&self, change: MembersChange) -> Result<(), WriteRefused> {
        with_lease(self, || super::membership::change(self, change.clone())).await
    }

    fn view(&self) -> GroupView {
        let m = self.metrics().borrow_watched().clone();
        GroupView {
            // A leader removed from its group (a move) becomes a learner but keeps its own vote,
            // and openraft still names it: only a replica in the leader state leads.
            leader: m
                .current_leader
                .filter(|l| *l != m.id || m.state == openraft::ServerState::Leader),
            term: m.current_term,
            last_log_index: m.last_log_index,
            last_applied: m.last_applied.map(|l| l.index),
            matched: m
                .replication
                .unwrap_or_default()
                .into_iter()
                .map(|(id, l)| (id, l.map(|l| l.index)))
                .collect(),
            voters: m.membership_config.membership().voter_ids().collect(),
        }
    }

    async fn stop(&self) {
        let _ = self.shutdown().await;
    }

    async fn elect(&self) {
        if let Err(e) = self.trigger().elect(true).await {
            tracing::debug!(error = %e, "an election could not start");
        }
    }

    async fn write(&self, commands: Vec<Command>) -> Result<Vec<Applied>, WriteRefused> {
        with_lease(self, || write_once(self, commands.clone())).await
    }
}

/// Runs `op` (a write, a change of members) on `raft`, renewing its lease when it lapsed.
///
/// A partition group sends no heartbeats (docs/cluster.md, "Liveness and elections"), so a
/// leader that was idle for longer than its lease has no recent quorum ack, and openraft
/// refuses a write before appending it. A heartbeat renews the lease; `op` is tried again, for
/// at most [`LEASE_RENEWAL`].
pub(super) async fn with_lease<SM, T, F, Fut>(
    raft: &openraft::Raft<Raft, SM>,
    mut op: F,
) -> Result<T, WriteRefused>
where
    SM: RaftStateMachine<Raft, SnapshotData = SnapshotBytes>,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, WriteRefused>>,
{
    let renew_until = std::time::Instant::now() + LEASE_RENEWAL;
    let mut asked = None::<std::time::Instant>;
    loop {
        match op().await {
            Err(WriteRefused::NotLeader { leader: None })
                if leads(raft) && std::time::Instant::now() < renew_until =>
            {
                if asked.is_none_or(|at| at.elapsed() > LEASE_RENEWAL / 8) {
                    asked = Some(std::time::Instant::now());
                    if raft.trigger().heartbeat().await.is_err() {
                        return Err(WriteRefused::NotLeader { leader: None });
                    }
                }
                // A heartbeat round takes a few ms here; polling faster only burns the core
                // the pings share.
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            answer => return answer,
        }
    }
}

/// Whether a quorum acknowledged this leader within `lease` (or it is its group's only voter):
/// the others then do not elect another yet (openraft's leader lease).
pub(super) fn quorum_acked_within(
    m: &openraft::RaftMetrics<Raft>,
    lease: std::time::Duration,
) -> bool {
    let alone = m
        .membership_config
        .membership()
        .voter_ids()
        .nth(1)
        .is_none();
    alone
        || m.last_quorum_acked
            .as_ref()
            .is_some_and(|t| openraft::Instant::elapsed(&**t) < lease)
}

/// How long a leader whose lease lapsed tries to renew it before a write is refused.
const LEASE_RENEWAL: std::time::Duration = std::time::Duration::from_millis(800);

/// Whether this replica is its group's leader.
fn leads<SM>(raft: &openraft::Raft<Raft, SM>) -> bool
where
    SM: RaftStateMachine<Raft, SnapshotData = SnapshotBytes>,
{
    let m = raft.metrics().borrow_watched().clone();
    m.current_leader == Some(m.id) && m.state == openraft::ServerState::Leader
}

/// One `client_write_many` of `commands`: the applied results, or why not.
pub(super) async fn write_once<SM>(
    raft: &openraft::Raft<Raft, SM>,
    commands: Vec<Command>,
) -> Result<Vec<Applied>, WriteRefused>
where
    SM: RaftStateMachine<Raft, SnapshotData = SnapshotBytes>,
{
    let count = commands.len();
    {
        let mut results = raft
            .client_write_many(commands)
            .await
            .map_err(|e| WriteRefused::Failed(e.to_string()))?;
        let mut out = Vec::with_capacity(count);
        while let Some(result) = results.next().await {
            match result.map_err(|e| WriteRefused::Failed(e.to_string()))? {
                Ok(written) => out.push(written.response),
                // Refused before it was appended, after some of the batch was: the batch is
                // neither stored nor safe to send again.
                Err(ClientWriteError::ForwardToLeader(_)) if !out.is_empty() => {
                    return Err(WriteRefused::Discarded);
                }
                Err(ClientWriteError::ForwardToLeader(f)) => {
                    return Err(WriteRefused::NotLeader {
                        leader: f.leader_id,
                    });
                }
                Err(ClientWriteError::LogEntryDiscarded(_)) => return Err(WriteRefused::Discarded),
                Err(e) => return Err(WriteRefused::Failed(e.to_string())),
            }
        }
        if out.len() != count {
            // The group stopped before it answered every command (a storage error).
            return Err(WriteRefused::Failed(format!(
                "the group answered {} of {count} commands",
                out.len()
            )));
        }
        Ok(out)
    }
}

/// Finds the group a message is for.
pub trait Groups: Send + Sync + 'static {
    /// The group's endpoint on this broker, if it has a replica of it.
    fn endpoint(&self, group: &GroupId) -> Option<Arc<dyn Endpoint>>;
    /// The partition groups this broker leads, with their terms (a ping's answer).
    fn led(&self) -> Vec<(GroupId, u64)>;
    /// A write to `group` was refused here without naming a leader: if this broker leads the
    /// group, no quorum renewed its lease (docs/cluster.md, "Liveness and elections").
    fn refused_here(&self, group: &GroupId);
}

/// A body that does not decode is answered `400` with why.
fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<(GroupId, T), (StatusCode, String)> {
    postcard::from_bytes(body).map_err(|e| {
        (
            StatusCode::BAD_REQUEST,
            format!("a Raft message that does not decode: {e}"),
        )
    })
}

fn encode<T: Serialize>(answer: &Result<T, RaftError<Raft>>) -> Response {
    match postcard::to_stdvec(answer) {
        Ok(bytes) => ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// The group is not here (not yet created on this broker, or moved away): answered as a stopped
/// Raft, which the sender treats as a failed exchange and retries.
fn absent<T: Serialize>() -> Response {
    encode::<T>(&Err(RaftError::Fatal(Fatal::Stopped)))
}

/// A `write` or `members` answer: the postcard of `Result<_, WriteRefused>`.
fn encode_write<T: Serialize>(answer: &Result<T, WriteRefused>) -> Response {
    match postcard::to_stdvec(answer) {
        Ok(bytes) => ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// `POST /mmmq/internal/raft/{rpc}`.
pub async fn handle<G: Groups>(
    State(groups): State<Arc<G>>,
    Path(rpc): Path<String>,
    body: Bytes,
) -> Response {
    macro_rules! serve {
        ($req:ty, $resp:ty, |$ep:ident, $r:ident| $call:expr) => {
            serve!($req, $resp, |_g, _r| Ok(()), |$ep, $r| $call)
        };
        ($req:ty, $resp:ty, |$g:ident, $c:ident| $check:expr, |$ep:ident, $r:ident| $call:expr) => {{
            let (group, $r) = match decode::<$req>(&body) {
                Ok(x) => x,
                Err(refusal) => return refusal.into_response(),
            };
            let check = |$g: &GroupId, $c: &$req| -> Result<(), String> { $check };
            if let Err(why) = check(&group, &$r) {
                return refused(why);
            }
            match groups.endpoint(&group) {
                Some($ep) => encode::<$resp>(&$call.await),
                None => absent::<$resp>(),
            }
        }};
    }
    match rpc.as_str() {
        "append" => serve!(
            AppendEntriesRequest<Raft>,
            AppendEntriesResponse<Raft>,
            |g, r| check_append(g, r),
            |ep, r| ep.append(r)
        ),
        "vote" => serve!(
            VoteRequest<Raft>,
            VoteResponse<Raft>,
            |_g, r| check_term(r.vote.leader_id.term),
            |ep, r| ep.vote(r)
        ),
        "pre-vote" => serve!(
            VoteRequest<Raft>,
            VoteResponse<Raft>,
            |_g, r| check_term(r.vote.leader_id.term),
            |ep, r| ep.pre_vote(r)
        ),
        "snapshot" => serve!(
            (Vote, SnapshotMeta, SnapshotBytes),
            SnapshotResponse<Raft>,
            |_g, r| check_term(r.0.leader_id.term),
            |ep, r| ep.snapshot(r.0, r.1, r.2)
        ),
        "transfer-leader" => serve!(
            TransferLeaderRequest<Raft>,
            TransferLeaderResponse<Raft>,
            |ep, r| ep.transfer_leader(r)
        ),
        "write" => {
            let (group, commands) = match decode::<Vec<Command>>(&body) {
                Ok(x) => x,
                Err(refusal) => return refusal.into_response(),
            };
            if let Err(why) = check_kinds(&group, &commands) {
                return refused(why);
            }
            match groups.endpoint(&group) {
                Some(ep) => {
                    let answer = ep.write(commands).await;
                    if matches!(answer, Err(WriteRefused::NotLeader { leader: None })) {
                        groups.refused_here(&group);
                    }
                    encode_write(&answer)
                }
                None => {
                    encode_write::<Vec<Applied>>(&Err(WriteRefused::NotLeader { leader: None }))
                }
            }
        }
        "members" => {
            let (group, change) = match decode::<MembersChange>(&body) {
                Ok(x) => x,
                Err(refusal) => return refusal.into_response(),
            };
            match groups.endpoint(&group) {
                Some(ep) => encode_write(&ep.change_members(change).await),
                None => encode_write::<()>(&Err(WriteRefused::NotLeader { leader: None })),
            }
        }
        // docs/cluster.md, "Liveness and elections": a peer's ping.
        "ping" => match decode::<BrokerId>(&body) {
            Ok(_) => encode::<Vec<(GroupId, u64)>>(&Ok(groups.led())),
            Err(refusal) => refusal.into_response(),
        },
        other => (StatusCode::NOT_FOUND, format!("no Raft message {other:?}")).into_response(),
    }
}
