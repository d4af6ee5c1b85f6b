//! Kafka consumer groups, the classic protocol (docs/kafka.md, "Consumer groups"): the broker
//! keeps members and generations and hands the leader's assignment out; the clients assign.
//!
//! A group rebalances when a member joins, leaves or misses its session timeout: members
//! learn it from their heartbeat (`REBALANCE_IN_PROGRESS`) and join again; the join completes
//! once every member has, or at the rebalance timeout without those that did not. The first
//! member to join leads; its SyncGroup carries everyone's assignment. Committed offsets are the
//! group's committed offsets of HTTP's consumer groups (docs/topics-and-groups.md), the same
//! checkpoint files: a group's progress is one number per partition whichever protocol made it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::{
    DescribeGroupsRequest, DescribeGroupsResponse, GroupId, HeartbeatRequest, HeartbeatResponse,
    JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest,
    ListGroupsResponse, OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest,
    OffsetFetchResponse, SyncGroupRequest, SyncGroupResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use mmmq_core::{ConsumerId, Topic};
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::connection::Session;
use crate::groups::commit::{read_committed, write_committed};

/// How often sessions are checked.
const SESSION_CHECK: Duration = Duration::from_millis(250);
/// Session timeouts accepted (Kafka's `group.min/max.session.timeout.ms`).
const SESSION_TIMEOUT: std::ops::RangeInclusive<i32> = 1_000..=300_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Empty => "Empty",
            Phase::PreparingRebalance => "PreparingRebalance",
            Phase::CompletingRebalance => "CompletingRebalance",
            Phase::Stable => "Stable",
        }
    }
}

struct Member {
    client_id: String,
    client_host: String,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    protocol_type: String,
    protocols: Vec<(String, Bytes)>,
    assignment: Bytes,
    last_seen: Instant,
    joining: Option<oneshot::Sender<JoinGroupResponse>>,
    syncing: Option<oneshot::Sender<SyncGroupResponse>>,
}

struct Group {
    phase: Phase,
    generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    members: HashMap<String, Member>,
    /// Ids handed out with `MEMBER_ID_REQUIRED`, not yet joined with.
    pending: Vec<String>,
    /// When the running rebalance gives up on members that have not joined again.
    rebalance_deadline: Option<Instant>,
}

impl Group {
    fn new() -> Self {
        Group {
            phase: Phase::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: HashMap::new(),
            pending: Vec::new(),
            rebalance_deadline: None,
        }
    }

    /// Starts a rebalance: every member must join again.
    fn prepare(&mut self) {
        if self.members.is_empty() {
            self.phase = Phase::Empty;
            self.rebalance_deadline = None;
            return;
        }
        if self.phase != Phase::PreparingRebalance {
            let longest = self
                .members
                .values()
                .map(|m| m.rebalance_timeout)
                .max()
                .unwrap_or_default();
            self.phase = Phase::PreparingRebalance;
            self.rebalance_deadline = Some(Instant::now() + longest);
            // Members waiting for an assignment of the old generation will never get one.
            for m in self.members.values_mut() {
                if let Some(tx) = m.syncing.take() {
                    let _ = tx.send(
                        SyncGroupResponse::default()
                            .with_error_code(ResponseError::RebalanceInProgress.code()),
                    );
                }
            }
        }
    }

    /// Completes the join if every member has joined again.
    fn try_complete_join(&mut self) {
        if self.phase != Phase::PreparingRebalance
            || self.members.is_empty()
            || self.members.values().any(|m| m.joining.is_none())
        {
            return;
        }
        self.generation += 1;
        self.rebalance_deadline = None;
        if self
            .leader
            .as_ref()
            .is_none_or(|l| !self.members.contains_key(l))
        {
            self.leader = self.members.keys().min().cloned();
        }
        let leader = self.leader.clone().expect("a member leads");
        // The leader's first protocol that every member speaks.
        let protocol = self.members[&leader]
            .protocols
            .iter()
            .map(|(name, _)| name.clone())
            .find(|name| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(n, _)| n == name))
            });
        self.protocol = protocol.clone();
        self.phase = Phase::CompletingRebalance;
        let everyone: Vec<JoinGroupResponseMember> = self
            .members
            .iter()
            .map(|(id, m)| {
                let metadata = m
                    .protocols
                    .iter()
                    .find(|(n, _)| Some(n) == protocol.as_ref())
                    .map(|(_, md)| md.clone())
                    .unwrap_or_default();
                JoinGroupResponseMember::default()
                    .with_member_id(StrBytes::from_string(id.clone()))
                    .with_metadata(metadata)
            })
            .collect();
        let generation = self.generation;
        let protocol_type = self.protocol_type.clone();
        for (id, m) in self.members.iter_mut() {
            m.assignment = Bytes::new();
            m.last_seen = Instant::now();
            let Some(tx) = m.joining.take() else { continue };
            let answer = JoinGroupResponse::default()
                .with_generation_id(generation)
                .with_protocol_type(protocol_type.clone().map(StrBytes::from_string))
                .with_protocol_name(protocol.clone().map(StrBytes::from_string))
                .with_leader(StrBytes::from_string(leader.clone()))
                .with_member_id(StrBytes::from_string(id.clone()))
                .with_members(if *id == leader {
                    everyone.clone()
                } else {
                    Vec::new()
                });
            let _ = tx.send(answer);
        }
    }

    fn remove(&mut self, id: &str) {
        if let Some(mut m) = self.members.remove(id) {
            // A member removed while it waits hears why.
            if let Some(tx) = m.joining.take() {
                let _ = tx.send(join_error(ResponseError::UnknownMemberId));
            }
            if let Some(tx) = m.syncing.take() {
                let _ = tx.send(
                    SyncGroupResponse::default()
                        .with_error_code(ResponseError::UnknownMemberId.code()),
                );
            }
            if self.leader.as_deref() == Some(id) {
                self.leader = None;
            }
            self.prepare();
            self.try_complete_join();
        }
        if self.members.is_empty() {
            self.protocol_type = None;
            self.protocol = None;
        }
    }

    /// Checks a member and generation of a sync, heartbeat or commit.
    fn check(&self, member: &str, generation: i32) -> Result<(), ResponseError> {
        if !self.members.contains_key(member) {
            return Err(ResponseError::UnknownMemberId);
        }
        if generation != self.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        Ok(())
    }
}

fn join_error(e: ResponseError) -> JoinGroupResponse {
    JoinGroupResponse::default()
        .with_error_code(e.code())
        .with_generation_id(-1)
}

/// Every Kafka consumer group of this broker.
#[derive(Default)]
pub(crate) struct Coordinator {
    groups: Mutex<HashMap<String, Group>>,
}

/// Removes members past their session timeout and ends rebalances past their timeout.
pub(crate) async fn expire_sessions(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(SESSION_CHECK) => {}
            _ = stop.cancelled() => return,
        }
        let now = Instant::now();
        let mut groups = shared.groups.groups.lock();
        for (name, g) in groups.iter_mut() {
            let expired: Vec<String> = g
                .members
                .iter()
                .filter(|(_, m)| m.joining.is_none() && now > m.last_seen + m.session_timeout)
                .map(|(id, _)| id.clone())
                .collect();
            let late: Vec<String> = match g.rebalance_deadline {
                Some(d) if now > d => g
                    .members
                    .iter()
                    .filter(|(_, m)| m.joining.is_none())
                    .map(|(id, _)| id.clone())
                    .collect(),
                _ => Vec::new(),
            };
            for id in expired.into_iter().chain(late) {
                tracing::info!(group = %name, member = %id, "kafka: member removed (session timeout)");
                g.remove(&id);
            }
        }
    }
}

/// JoinGroup.
pub(crate) async fn join(
    shared: &Shared,
    request: JoinGroupRequest,
    version: i16,
    session: &Session,
) -> JoinGroupResponse {
    let group = request.group_id.as_str().to_owned();
    if ConsumerId::new(group.clone()).is_err() {
        return join_error(ResponseError::InvalidGroupId);
    }
    if !SESSION_TIMEOUT.contains(&request.session_timeout_ms) {
        return join_error(ResponseError::InvalidSessionTimeout);
    }
    let rx = {
        let mut groups = shared.groups.groups.lock();
        let g = groups.entry(group.clone()).or_insert_with(Group::new);
        let mut member = request.member_id.as_str().to_owned();
        if member.is_empty() {
            member = format!("{}-{}", session.client_id, uuid::Uuid::new_v4());
            if version >= 4 {
                // KIP-394: the member learns its id first and joins with it.
                g.pending.push(member.clone());
                return join_error(ResponseError::MemberIdRequired)
                    .with_member_id(StrBytes::from_string(member));
            }
        } else if !g.members.contains_key(&member) {
            match g.pending.iter().position(|p| *p == member) {
                Some(i) => {
                    g.pending.swap_remove(i);
                }
                None => return join_error(ResponseError::UnknownMemberId),
            }
        }
        let protocol_type = request.protocol_type.as_str().to_owned();
        let protocols: Vec<(String, Bytes)> = request
            .protocols
            .iter()
            .map(|p| (p.name.as_str().to_owned(), p.metadata.clone()))
            .collect();
        let compatible = g
            .members
            .iter()
            .filter(|(id, _)| **id != member)
            .all(|(_, m)| {
                m.protocol_type == protocol_type
                    && m.protocols
                        .iter()
                        .any(|(n, _)| protocols.iter().any(|(p, _)| p == n))
            });
        if protocols.is_empty() || !compatible {
            return join_error(ResponseError::InconsistentGroupProtocol)
                .with_member_id(StrBytes::from_string(member));
        }
        let (tx, rx) = oneshot::channel();
        let changed = match g.members.get_mut(&member) {
            Some(m) => {
                let changed = m.protocols != protocols;
                m.protocols = protocols;
                m.last_seen = Instant::now();
                if let Some(old) = m.joining.replace(tx) {
                    let _ = old.send(join_error(ResponseError::UnknownMemberId));
                }
                changed
            }
            None => {
                g.members.insert(
                    member.clone(),
                    Member {
                        client_id: session.client_id.clone(),
                        client_host: format!("/{}", session.peer.ip()),
                        session_timeout: Duration::from_millis(request.session_timeout_ms as u64),
                        rebalance_timeout: Duration::from_millis(
                            request.rebalance_timeout_ms.max(request.session_timeout_ms) as u64,
                        ),
                        protocol_type: protocol_type.clone(),
                        protocols,
                        assignment: Bytes::new(),
                        last_seen: Instant::now(),
                        joining: Some(tx),
                        syncing: None,
                    },
                );
                true
            }
        };
        g.protocol_type = Some(protocol_type);
        // Any join rebalances (a member whose protocols did not change still gets the new
        // generation: simpler than Kafka's shortcut, and as correct).
        let _ = changed;
        g.prepare();
        g.try_complete_join();
        rx
    };
    rx.await
        .unwrap_or_else(|_| join_error(ResponseError::UnknownMemberId))
}

/// SyncGroup.
pub(crate) async fn sync(shared: &Shared, request: SyncGroupRequest) -> SyncGroupResponse {
    let error = |e: ResponseError| SyncGroupResponse::default().with_error_code(e.code());
    let member = request.member_id.as_str().to_owned();
    let rx = {
        let mut groups = shared.groups.groups.lock();
        let Some(g) = groups.get_mut(request.group_id.as_str()) else {
            return error(ResponseError::UnknownMemberId);
        };
        if let Err(e) = g.check(&member, request.generation_id) {
            return error(e);
        }
        match g.phase {
            Phase::PreparingRebalance => return error(ResponseError::RebalanceInProgress),
            Phase::Stable => {
                let m = g.members.get_mut(&member).expect("checked");
                m.last_seen = Instant::now();
                return answer_sync(g, &member);
            }
            Phase::Empty => return error(ResponseError::UnknownMemberId),
            Phase::CompletingRebalance => {}
        }
        if g.leader.as_deref() == Some(member.as_str()) {
            for a in &request.assignments {
                if let Some(m) = g.members.get_mut(a.member_id.as_str()) {
                    m.assignment = a.assignment.clone();
                }
            }
            g.phase = Phase::Stable;
            let waiting: Vec<String> = g
                .members
                .iter()
                .filter(|(_, m)| m.syncing.is_some())
                .map(|(id, _)| id.clone())
                .collect();
            for id in waiting {
                let answer = answer_sync(g, &id);
                if let Some(tx) = g.members.get_mut(&id).and_then(|m| m.syncing.take()) {
                    let _ = tx.send(answer);
                }
            }
            let m = g.members.get_mut(&member).expect("checked");
            m.last_seen = Instant::now();
            return answer_sync(g, &member);
        }
        let (tx, rx) = oneshot::channel();
        let m = g.members.get_mut(&member).expect("checked");
        m.last_seen = Instant::now();
        m.syncing = Some(tx);
        rx
    };
    rx.await
        .unwrap_or_else(|_| error(ResponseError::RebalanceInProgress))
}

fn answer_sync(g: &Group, member: &str) -> SyncGroupResponse {
    SyncGroupResponse::default()
        .with_protocol_type(g.protocol_type.clone().map(StrBytes::from_string))
        .with_protocol_name(g.protocol.clone().map(StrBytes::from_string))
        .with_assignment(g.members[member].assignment.clone())
}

/// Heartbeat: keeps the member's session; tells it when to join again.
pub(crate) fn heartbeat(shared: &Shared, request: HeartbeatRequest) -> HeartbeatResponse {
    let mut groups = shared.groups.groups.lock();
    let code = match groups.get_mut(request.group_id.as_str()) {
        None => ResponseError::UnknownMemberId.code(),
        Some(g) => match g.check(request.member_id.as_str(), request.generation_id) {
            Err(e) => e.code(),
            Ok(()) => {
                if let Some(m) = g.members.get_mut(request.member_id.as_str()) {
                    m.last_seen = Instant::now();
                }
                if g.phase == Phase::PreparingRebalance {
                    ResponseError::RebalanceInProgress.code()
                } else {
                    0
                }
            }
        },
    };
    HeartbeatResponse::default().with_error_code(code)
}

/// LeaveGroup: the member (v0–2) or members (v3+) leave; the others rebalance.
pub(crate) fn leave(
    shared: &Shared,
    request: LeaveGroupRequest,
    version: i16,
) -> LeaveGroupResponse {
    let mut groups = shared.groups.groups.lock();
    let Some(g) = groups.get_mut(request.group_id.as_str()) else {
        return LeaveGroupResponse::default()
            .with_error_code(ResponseError::UnknownMemberId.code());
    };
    if version < 3 {
        let id = request.member_id.as_str();
        if !g.members.contains_key(id) {
            return LeaveGroupResponse::default()
                .with_error_code(ResponseError::UnknownMemberId.code());
        }
        g.remove(id);
        return LeaveGroupResponse::default();
    }
    let members = request
        .members
        .iter()
        .map(|m| {
            let id = m.member_id.as_str();
            let code = if g.members.contains_key(id) {
                g.remove(id);
                0
            } else {
                ResponseError::UnknownMemberId.code()
            };
            MemberResponse::default()
                .with_member_id(m.member_id.clone())
                .with_group_instance_id(m.group_instance_id.clone())
                .with_error_code(code)
        })
        .collect();
    LeaveGroupResponse::default().with_members(members)
}

/// ListGroups: the Kafka groups this broker coordinates.
pub(crate) fn list(shared: &Shared, request: ListGroupsRequest) -> ListGroupsResponse {
    let groups = shared.groups.groups.lock();
    let listed = groups
        .iter()
        .filter(|(_, g)| {
            request.states_filter.is_empty()
                || request
                    .states_filter
                    .iter()
                    .any(|s| s.as_str().eq_ignore_ascii_case(g.phase.name()))
        })
        .map(|(name, g)| {
            ListedGroup::default()
                .with_group_id(GroupId(StrBytes::from_string(name.clone())))
                .with_protocol_type(StrBytes::from_string(
                    g.protocol_type.clone().unwrap_or_else(|| "consumer".into()),
                ))
                .with_group_state(StrBytes::from_static_str(g.phase.name()))
        })
        .collect();
    ListGroupsResponse::default().with_groups(listed)
}

/// DescribeGroups.
pub(crate) fn describe(shared: &Shared, request: DescribeGroupsRequest) -> DescribeGroupsResponse {
    let groups = shared.groups.groups.lock();
    let described = request
        .groups
        .into_iter()
        .map(|id| {
            let Some(g) = groups.get(id.as_str()) else {
                return DescribedGroup::default()
                    .with_group_id(id)
                    .with_group_state(StrBytes::from_static_str("Dead"));
            };
            let members = g
                .members
                .iter()
                .map(|(mid, m)| {
                    let metadata = m
                        .protocols
                        .iter()
                        .find(|(n, _)| Some(n) == g.protocol.as_ref())
                        .map(|(_, md)| md.clone())
                        .unwrap_or_default();
                    DescribedGroupMember::default()
                        .with_member_id(StrBytes::from_string(mid.clone()))
                        .with_client_id(StrBytes::from_string(m.client_id.clone()))
                        .with_client_host(StrBytes::from_string(m.client_host.clone()))
                        .with_member_metadata(metadata)
                        .with_member_assignment(m.assignment.clone())
                })
                .collect();
            DescribedGroup::default()
                .with_group_id(id)
                .with_group_state(StrBytes::from_static_str(g.phase.name()))
                .with_protocol_type(StrBytes::from_string(
                    g.protocol_type.clone().unwrap_or_default(),
                ))
                .with_protocol_data(StrBytes::from_string(
                    g.protocol.clone().unwrap_or_default(),
                ))
                .with_members(members)
        })
        .collect();
    DescribeGroupsResponse::default().with_groups(described)
}

/// OffsetCommit: a member of the current generation's offsets, or a standalone consumer's
/// (generation −1, no member) for a group with no members.
pub(crate) async fn commit(
    shared: &Shared,
    request: OffsetCommitRequest,
    _version: i16,
) -> OffsetCommitResponse {
    let group = request.group_id.as_str().to_owned();
    let refused = {
        let groups = shared.groups.groups.lock();
        match groups.get(&group) {
            _ if ConsumerId::new(group.clone()).is_err() => Some(ResponseError::InvalidGroupId),
            Some(g) if !g.members.is_empty() || request.generation_id_or_member_epoch >= 0 => {
                match g.check(
                    request.member_id.as_str(),
                    request.generation_id_or_member_epoch,
                ) {
                    Err(e) => Some(e),
                    // As Kafka's: a member of the current generation commits while the group
                    // prepares a rebalance (its commit on revoke), not while the new
                    // generation's assignment is pending.
                    Ok(()) if g.phase == Phase::CompletingRebalance => {
                        Some(ResponseError::RebalanceInProgress)
                    }
                    Ok(()) => None,
                }
            }
            None if request.generation_id_or_member_epoch >= 0 => {
                Some(ResponseError::IllegalGeneration)
            }
            _ => None,
        }
    };
    let id = ConsumerId::new(group.clone()).ok();
    let mut topics = Vec::with_capacity(request.topics.len());
    for t in request.topics {
        let found = Topic::new(t.name.as_str())
            .ok()
            .and_then(|name| shared.broker.registry().get(&name));
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in t.partitions {
            let code = match (refused, &id) {
                (Some(e), _) => e.code(),
                (None, None) => ResponseError::InvalidGroupId.code(),
                (None, Some(id)) => {
                    let partition = found.as_ref().and_then(|f| {
                        u32::try_from(p.partition_index)
                            .ok()
                            .and_then(|n| f.partition(n))
                    });
                    match partition {
                        None => ResponseError::UnknownTopicOrPartition.code(),
                        Some(_) if p.committed_offset < 0 => ResponseError::OffsetOutOfRange.code(),
                        Some(part) => {
                            let (id, offset) = (id.clone(), p.committed_offset as u64);
                            let written = tokio::task::spawn_blocking(move || {
                                write_committed(&part, &id, offset)
                            })
                            .await
                            .expect("commit task panicked");
                            match written {
                                Ok(()) => 0,
                                Err(e) => {
                                    tracing::warn!(group = %group, error = %e, "kafka: commit failed");
                                    ResponseError::KafkaStorageError.code()
                                }
                            }
                        }
                    }
                }
            };
            partitions.push(
                OffsetCommitResponsePartition::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(code),
            );
        }
        topics.push(
            OffsetCommitResponseTopic::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    OffsetCommitResponse::default().with_topics(topics)
}

/// OffsetFetch (v1–7): the group's committed offsets; −1 where it has none. No topics named
/// (v2+): every partition it committed in.
pub(crate) async fn fetch_offsets(
    shared: &Shared,
    request: OffsetFetchRequest,
    _version: i16,
) -> OffsetFetchResponse {
    let Ok(id) = ConsumerId::new(request.group_id.as_str()) else {
        return OffsetFetchResponse::default()
            .with_error_code(ResponseError::InvalidGroupId.code());
    };
    let registry = shared.broker.registry();
    let asked: Vec<(TopicName, Vec<i32>)> = match request.topics {
        Some(topics) => topics
            .into_iter()
            .map(|t| (t.name, t.partition_indexes))
            .collect(),
        None => registry
            .all()
            .into_iter()
            .filter(|t| !t.topic.is_internal())
            .map(|t| {
                (
                    TopicName(StrBytes::from_string(t.topic.as_str().to_owned())),
                    (0..t.partition_count() as i32).collect(),
                )
            })
            .collect(),
    };
    let mut topics = Vec::with_capacity(asked.len());
    for (name, partitions) in asked {
        let found = Topic::new(name.as_str())
            .ok()
            .and_then(|n| registry.get(&n));
        let mut out = Vec::with_capacity(partitions.len());
        for index in partitions {
            let answer = OffsetFetchResponsePartition::default()
                .with_partition_index(index)
                .with_committed_offset(-1)
                .with_committed_leader_epoch(-1)
                .with_metadata(Some(StrBytes::default()));
            let Some(p) = found
                .as_ref()
                .and_then(|f| u32::try_from(index).ok().and_then(|n| f.partition(n)))
            else {
                out.push(answer.with_error_code(ResponseError::UnknownTopicOrPartition.code()));
                continue;
            };
            let id = id.clone();
            let read = tokio::task::spawn_blocking(move || read_committed(&p, &id))
                .await
                .expect("offset fetch task panicked");
            out.push(match read {
                Ok(Some(offset)) => answer.with_committed_offset(offset as i64),
                Ok(None) => answer,
                Err(_) => answer.with_error_code(ResponseError::KafkaStorageError.code()),
            });
        }
        topics.push(
            OffsetFetchResponseTopic::default()
                .with_name(name)
                .with_partitions(out),
        );
    }
    OffsetFetchResponse::default().with_topics(topics)
}

/// Kafka's groups as `GET /mmmq/groups` shows them: members with the partitions their
/// assignment names (the consumer protocol's assignment, which clients write and the broker
/// reads only for this), each partition's committed offset and lag.
pub(crate) struct Statuses(pub Arc<Shared>);

/// One member as the lock saw it: id, time since it was last heard, session timeout,
/// assignment.
type MemberView = (String, Duration, Duration, Vec<(String, u32)>);

#[async_trait::async_trait]
impl crate::groups::KafkaGroups for Statuses {
    async fn statuses(&self) -> Vec<mmmq_core::GroupStatus> {
        let now = Instant::now();
        let views: Vec<(String, Vec<MemberView>)> = {
            let groups = self.0.groups.groups.lock();
            groups
                .iter()
                .map(|(name, g)| {
                    let members = g
                        .members
                        .iter()
                        .map(|(id, m)| {
                            (
                                id.clone(),
                                now.saturating_duration_since(m.last_seen),
                                m.session_timeout,
                                assigned(&m.assignment),
                            )
                        })
                        .collect();
                    (name.clone(), members)
                })
                .collect()
        };
        let mut out = Vec::with_capacity(views.len());
        for (name, members) in views {
            out.push(status_of(&self.0, name, members).await);
        }
        out
    }
}

/// The partitions a consumer-protocol assignment names (empty if it is not one).
fn assigned(assignment: &Bytes) -> Vec<(String, u32)> {
    use kafka_protocol::messages::ConsumerProtocolAssignment;
    use kafka_protocol::protocol::Decodable;
    let mut b = assignment.clone();
    if b.len() < 2 {
        return Vec::new();
    }
    let version = i16::from_be_bytes([b[0], b[1]]).min(3);
    bytes::Buf::advance(&mut b, 2);
    match ConsumerProtocolAssignment::decode(&mut b, version) {
        Ok(a) => a
            .assigned_partitions
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .filter_map(|p| Some((t.topic.as_str().to_owned(), u32::try_from(*p).ok()?)))
            })
            .collect(),
        Err(_) => Vec::new(),
    }
}

async fn status_of(
    shared: &Shared,
    name: String,
    members: Vec<MemberView>,
) -> mmmq_core::GroupStatus {
    use mmmq_core::{GroupMember, GroupPartition, TopicPartition};
    let mut topics: Vec<String> = members
        .iter()
        .flat_map(|m| m.3.iter().map(|(t, _)| t.clone()))
        .collect();
    topics.sort();
    topics.dedup();
    let mut partitions = Vec::new();
    let id = ConsumerId::new(name.clone()).ok();
    for m in &members {
        for (topic, p) in &m.3 {
            let found = Topic::new(topic.as_str())
                .ok()
                .and_then(|t| shared.broker.registry().get(&t))
                .and_then(|t| t.partition(*p));
            let Some(part) = found else { continue };
            let next_offset = part.log.next_offset();
            let committed = match &id {
                Some(id) => {
                    let (part2, id) = (part.clone(), id.clone());
                    tokio::task::spawn_blocking(move || read_committed(&part2, &id))
                        .await
                        .expect("read task panicked")
                        .ok()
                        .flatten()
                        .unwrap_or(0)
                }
                None => 0,
            };
            partitions.push(GroupPartition {
                topic: topic.clone(),
                topic_id: Some(part.topic_id),
                partition: *p,
                owner: Some(m.0.clone()),
                committed,
                next_offset,
                lag: next_offset.saturating_sub(committed),
                skipped: 0,
            });
        }
    }
    partitions.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    mmmq_core::GroupStatus {
        group: name,
        protocol: Some("kafka".into()),
        pattern: topics.join(","),
        members: members
            .into_iter()
            .map(|(member, ago, session, assignment)| GroupMember {
                member,
                last_poll_ms_ago: ago.as_millis() as u64,
                session_timeout_ms: session.as_millis() as u64,
                assignment: assignment
                    .into_iter()
                    .map(|(topic, partition)| TopicPartition {
                        topic,
                        partition,
                        topic_id: None,
                    })
                    .collect(),
            })
            .collect(),
        partitions,
    }
}
