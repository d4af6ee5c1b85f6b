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
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{
    DescribeGroupsRequest, DescribeGroupsResponse, GroupId, HeartbeatRequest, HeartbeatResponse,
    JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest,
    ListGroupsResponse, SyncGroupRequest, SyncGroupResponse,
};
use kafka_protocol::protocol::StrBytes;
use mmmq_core::ConsumerId;
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::kafka::Shared;
use crate::kafka::connection::Session;

mod offsets;
mod state;
mod status;

pub(crate) use offsets::{commit, fetch_offsets};
use state::{Group, Member, PENDING_TTL, Phase, SESSION_CHECK, SESSION_TIMEOUT, join_error};
pub(crate) use status::Statuses;

/// The name a Kafka group's commits are stored under (docs/kafka.md, "Consumer groups"): a
/// group id that is a valid consumer id (`[A-Za-z0-9._-]`) of at most 240 characters is its
/// own, so HTTP's group of that name shares its offsets; any other (Kafka takes any string,
/// the empty one too for commits) is spelled with `_` for each other character, cut to 200,
/// and `.k` and 16 hex digits of its SHA-256 appended, so that two ids never share a name by
/// accident. (240: a checkpoint's temporary file, `{name}.checkpoint.tmp`, must still fit
/// the file system's 255-byte names.)
pub(crate) fn store_id(group: &str) -> ConsumerId {
    if group.len() <= MAX_OWN_NAME
        && let Ok(id) = ConsumerId::new(group)
    {
        return id;
    }
    use sha2::Digest;
    let readable: String = group
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(200)
        .collect();
    let digest = sha2::Sha256::digest(group.as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    ConsumerId::new(format!("{readable}.k{hex}")).expect("valid characters, 218 at most")
}

/// Whether `name` is one [`store_id`] made from a Kafka id (`….k` and 16 hex digits).
pub(crate) fn is_mapped(name: &str) -> bool {
    name.len() >= 18
        && name.as_bytes()[name.len() - 18..name.len() - 16] == *b".k"
        && name[name.len() - 16..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The longest group id stored under its own name (see [`store_id`]): a consumer id's.
const MAX_OWN_NAME: usize = mmmq_core::MAX_CONSUMER_ID_LEN;

/// Every Kafka consumer group of this broker.
#[derive(Default)]
pub(crate) struct Coordinator {
    groups: Mutex<HashMap<String, Group>>,
    /// In a cluster: the metadata group's term this broker last coordinated in.
    served_term: Mutex<u64>,
}

impl Coordinator {
    /// Whether this broker answers group calls now (docs/kafka.md, "In a cluster"): alone,
    /// always; in a cluster, while it coordinates the groups (the metadata group's leader, as
    /// for HTTP's groups), else `NOT_COORDINATOR` and the client asks FindCoordinator again. A
    /// coordinator that takes over in a new term starts with no group in memory (what it held
    /// from an earlier term is older than what the coordinator in between did): members learn
    /// it from their next call and join again; commits are in the metadata.
    pub(crate) fn serving(&self, shared: &Shared) -> Result<(), ResponseError> {
        let Some(cluster) = shared.broker.cluster() else {
            return Ok(());
        };
        if !cluster.coordinates() {
            return Err(ResponseError::NotCoordinator);
        }
        let (_, term) = cluster.coordinator();
        let mut served = self.served_term.lock();
        if *served != term {
            *served = term;
            self.groups.lock().clear();
        }
        Ok(())
    }
}

/// Removes members past their session timeout and ends rebalances past their timeout; forgets
/// pending member ids and memberless groups after [`PENDING_TTL`], and producers' idle states
/// (`Producers::forget_idle`) and unused scans of the logs (`Scans::forget_unused`) once a
/// minute.
pub(crate) async fn expire_sessions(shared: Arc<Shared>, stop: CancellationToken) {
    let mut next_sweep = Instant::now();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(SESSION_CHECK) => {}
            _ = stop.cancelled() => return,
        }
        let now = Instant::now();
        if now >= next_sweep {
            next_sweep = now + Duration::from_secs(60);
            shared.producers.forget_idle();
            shared.scans.forget_unused();
        }
        let mut groups = shared.groups.groups.lock();
        groups.retain(|_, g| {
            g.pending.retain(|(_, at)| now < *at + PENDING_TTL);
            !g.members.is_empty() || !g.pending.is_empty() || now < g.last_active + PENDING_TTL
        });
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
    // As Kafka: a member needs a group id (commits and fetches take the empty one).
    if group.is_empty() {
        return join_error(ResponseError::InvalidGroupId);
    }
    if let Err(e) = shared.groups.serving(shared) {
        return join_error(e);
    }
    if !SESSION_TIMEOUT.contains(&request.session_timeout_ms) {
        return join_error(ResponseError::InvalidSessionTimeout);
    }
    let rx = {
        let mut groups = shared.groups.groups.lock();
        let g = groups.entry(group.clone()).or_insert_with(Group::new);
        g.last_active = Instant::now();
        let instance = request
            .group_instance_id
            .as_ref()
            .map(|i| i.as_str().to_owned())
            .filter(|i| !i.is_empty());
        let mut member = request.member_id.as_str().to_owned();
        // A static member's new instance (KIP-345) takes its old member id's place.
        let mut replacing = None;
        if member.is_empty() {
            member = format!("{}-{}", session.client_id, uuid::Uuid::new_v4());
            match &instance {
                Some(i) => replacing = g.statics.get(i).cloned(),
                None if version >= 4 => {
                    // KIP-394: the member learns its id first and joins with it.
                    g.pending.push((member.clone(), Instant::now()));
                    return join_error(ResponseError::MemberIdRequired)
                        .with_member_id(StrBytes::from_string(member));
                }
                None => {}
            }
        } else if let Err(e) = g.fenced(&member, instance.as_deref()) {
            return join_error(e).with_member_id(StrBytes::from_string(member));
        } else if !g.members.contains_key(&member) {
            match g.pending.iter().position(|(p, _)| *p == member) {
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
            .filter(|(id, _)| **id != member && Some(*id) != replacing.as_ref())
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
        if let (Some(i), Some(old)) = (&instance, &replacing) {
            let leader = g.leader.clone().unwrap_or_default();
            g.replace_static(i, old, &member);
            let m = g.members.get_mut(&member).expect("replaced");
            m.client_id = session.client_id.clone();
            m.client_host = format!("/{}", session.peer.ip());
            m.last_seen = Instant::now();
            m.protocols = protocols.clone();
            m.protocol_type = protocol_type.clone();
            // The new instance's timeouts, as Kafka takes them.
            m.session_timeout = Duration::from_millis(request.session_timeout_ms as u64);
            m.rebalance_timeout = Duration::from_millis(
                request.rebalance_timeout_ms.max(request.session_timeout_ms) as u64,
            );
            let keeps_protocol = g
                .protocol
                .as_ref()
                .is_some_and(|p| protocols.iter().any(|(n, _)| n == p));
            if g.phase == Phase::Stable && keeps_protocol {
                // As Kafka: no rebalance; the new instance syncs and gets the old one's
                // assignment. The leader named is the one before (the old id if it led), so
                // that the new instance does not assign a stable group.
                return JoinGroupResponse::default()
                    .with_generation_id(g.generation)
                    .with_protocol_type(g.protocol_type.clone().map(StrBytes::from_string))
                    .with_protocol_name(g.protocol.clone().map(StrBytes::from_string))
                    .with_leader(StrBytes::from_string(leader))
                    .with_member_id(StrBytes::from_string(member));
            }
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
                if let Some(i) = &instance {
                    g.statics.insert(i.clone(), member.clone());
                }
                g.members.insert(
                    member.clone(),
                    Member {
                        instance_id: instance.clone(),
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
    if let Err(e) = shared.groups.serving(shared) {
        return error(e);
    }
    let rx = {
        let mut groups = shared.groups.groups.lock();
        let Some(g) = groups.get_mut(request.group_id.as_str()) else {
            return error(ResponseError::UnknownMemberId);
        };
        if let Err(e) = g.check(
            &member,
            request.generation_id,
            request.group_instance_id.as_ref().map(|i| i.as_str()),
        ) {
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
    if let Err(e) = shared.groups.serving(shared) {
        return HeartbeatResponse::default().with_error_code(e.code());
    }
    let mut groups = shared.groups.groups.lock();
    let code = match groups.get_mut(request.group_id.as_str()) {
        None => ResponseError::UnknownMemberId.code(),
        Some(g) => match g.check(
            request.member_id.as_str(),
            request.generation_id,
            request.group_instance_id.as_ref().map(|i| i.as_str()),
        ) {
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
    if let Err(e) = shared.groups.serving(shared) {
        return LeaveGroupResponse::default().with_error_code(e.code());
    }
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
            let instance = m.group_instance_id.as_ref().map(|i| i.as_str());
            // A static member may leave by its instance id alone (KIP-345: the admin's
            // "remove members").
            let id = match (m.member_id.as_str(), instance) {
                ("", Some(i)) => g.statics.get(i).cloned().unwrap_or_default(),
                (id, _) => id.to_owned(),
            };
            let code = match g.fenced(&id, instance) {
                Err(e) => e.code(),
                Ok(()) if g.members.contains_key(&id) => {
                    g.remove(&id);
                    0
                }
                Ok(()) => ResponseError::UnknownMemberId.code(),
            };
            MemberResponse::default()
                .with_member_id(m.member_id.clone())
                .with_group_instance_id(m.group_instance_id.clone())
                .with_error_code(code)
        })
        .collect();
    LeaveGroupResponse::default().with_members(members)
}

/// ListGroups: the Kafka groups this broker coordinates, and, as Kafka lists them, every group
/// that only has commits (`Empty`, no protocol type).
pub(crate) async fn list(shared: &Shared, request: ListGroupsRequest) -> ListGroupsResponse {
    if shared.groups.serving(shared).is_err() {
        // Kafka's admin clients ask every broker and merge: this one coordinates none.
        return ListGroupsResponse::default();
    }
    let committed = offsets::groups_with_commits(shared).await;
    let wanted = |state: &str| {
        request.states_filter.is_empty()
            || request
                .states_filter
                .iter()
                .any(|s| s.as_str().eq_ignore_ascii_case(state))
    };
    let groups = shared.groups.groups.lock();
    let idle = committed
        .into_iter()
        .filter(|name| !groups.contains_key(name) && wanted(Phase::Empty.name()))
        .map(|name| {
            ListedGroup::default()
                .with_group_id(GroupId(StrBytes::from_string(name)))
                .with_protocol_type(StrBytes::default())
                .with_group_state(StrBytes::from_static_str(Phase::Empty.name()))
        });
    let listed = groups
        .iter()
        .filter(|(_, g)| wanted(g.phase.name()))
        .map(|(name, g)| {
            ListedGroup::default()
                .with_group_id(GroupId(StrBytes::from_string(name.clone())))
                .with_protocol_type(StrBytes::from_string(
                    g.protocol_type.clone().unwrap_or_else(|| "consumer".into()),
                ))
                .with_group_state(StrBytes::from_static_str(g.phase.name()))
        })
        .chain(idle)
        .collect();
    ListGroupsResponse::default().with_groups(listed)
}

/// DescribeGroups: a group in memory as it stands; one that only has commits `Empty`, as
/// ListGroups lists it (and as Kafka describes it); any other `Dead`.
pub(crate) async fn describe(
    shared: &Shared,
    request: DescribeGroupsRequest,
) -> DescribeGroupsResponse {
    let serving = shared.groups.serving(shared);
    let mut with_commits = std::collections::HashSet::new();
    if serving.is_ok() {
        for id in &request.groups {
            let known = shared.groups.groups.lock().contains_key(id.as_str());
            if !known && offsets::has_commits(shared, &store_id(id.as_str())).await {
                with_commits.insert(id.as_str().to_owned());
            }
        }
    }
    let groups = shared.groups.groups.lock();
    let described = request
        .groups
        .into_iter()
        .map(|id| {
            if let Err(e) = serving {
                return DescribedGroup::default()
                    .with_group_id(id)
                    .with_error_code(e.code());
            }
            let Some(g) = groups.get(id.as_str()) else {
                let state = if with_commits.contains(id.as_str()) {
                    Phase::Empty.name()
                } else {
                    "Dead"
                };
                return DescribedGroup::default()
                    .with_group_id(id)
                    .with_group_state(StrBytes::from_static_str(state));
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
                        .with_group_instance_id(m.instance_id.clone().map(StrBytes::from_string))
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
