//! A Kafka consumer group's state machine (docs/kafka.md, "Consumer groups"): members, phases,
//! generations; what a join, a leave or a missed session does to them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::{JoinGroupResponse, SyncGroupResponse};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::oneshot;

/// How often sessions are checked.
pub(super) const SESSION_CHECK: Duration = Duration::from_millis(250);
/// Session timeouts accepted (Kafka's `group.min/max.session.timeout.ms`).
/// How long an id handed out with `MEMBER_ID_REQUIRED` waits for its join, and a group
/// without members stays in memory.
pub(super) const PENDING_TTL: Duration = Duration::from_secs(300);
pub(super) const SESSION_TIMEOUT: std::ops::RangeInclusive<i32> = 1_000..=1_800_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl Phase {
    pub(super) fn name(self) -> &'static str {
        match self {
            Phase::Empty => "Empty",
            Phase::PreparingRebalance => "PreparingRebalance",
            Phase::CompletingRebalance => "CompletingRebalance",
            Phase::Stable => "Stable",
        }
    }
}

pub(super) struct Member {
    /// A static member's `group.instance.id` (KIP-345): the name it keeps across restarts.
    pub(super) instance_id: Option<String>,
    pub(super) client_id: String,
    pub(super) client_host: String,
    pub(super) session_timeout: Duration,
    pub(super) rebalance_timeout: Duration,
    pub(super) protocol_type: String,
    pub(super) protocols: Vec<(String, Bytes)>,
    pub(super) assignment: Bytes,
    pub(super) last_seen: Instant,
    pub(super) joining: Option<oneshot::Sender<JoinGroupResponse>>,
    pub(super) syncing: Option<oneshot::Sender<SyncGroupResponse>>,
}

impl Member {
    /// Answers the join or sync this member waits for, if any, with `error`.
    fn release(&mut self, error: ResponseError) {
        if let Some(tx) = self.joining.take() {
            let _ = tx.send(join_error(error));
        }
        if let Some(tx) = self.syncing.take() {
            let _ = tx.send(SyncGroupResponse::default().with_error_code(error.code()));
        }
    }
}

pub(super) struct Group {
    pub(super) phase: Phase,
    pub(super) generation: i32,
    pub(super) protocol_type: Option<String>,
    pub(super) protocol: Option<String>,
    pub(super) leader: Option<String>,
    pub(super) members: HashMap<String, Member>,
    /// Static members: each `group.instance.id` and the member id that holds it now.
    pub(super) statics: HashMap<String, String>,
    /// Ids handed out with `MEMBER_ID_REQUIRED`, not yet joined with, and when: forgotten after
    /// [`PENDING_TTL`] (a client that never came back).
    pub(super) pending: Vec<(String, Instant)>,
    /// The last join or commit: a group without members is forgotten [`PENDING_TTL`] after it
    /// (its commits stay on disk and serve it when it comes back).
    pub(super) last_active: Instant,
    /// When the running rebalance gives up on members that have not joined again.
    pub(super) rebalance_deadline: Option<Instant>,
}

impl Group {
    pub(super) fn new() -> Self {
        Group {
            phase: Phase::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: HashMap::new(),
            statics: HashMap::new(),
            pending: Vec::new(),
            last_active: Instant::now(),
            rebalance_deadline: None,
        }
    }

    /// Starts a rebalance: every member must join again.
    pub(super) fn prepare(&mut self) {
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
    pub(super) fn try_complete_join(&mut self) {
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
                    .with_group_instance_id(m.instance_id.clone().map(StrBytes::from_string))
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

    pub(super) fn remove(&mut self, id: &str) {
        if let Some(mut m) = self.members.remove(id) {
            // A member removed while it waits hears why.
            m.release(ResponseError::UnknownMemberId);
            if self.leader.as_deref() == Some(id) {
                self.leader = None;
            }
            if let Some(instance) = &m.instance_id {
                self.statics.remove(instance);
            }
            self.prepare();
            self.try_complete_join();
        }
        if self.members.is_empty() {
            self.protocol_type = None;
            self.protocol = None;
        }
    }

    /// Checks a member and generation of a sync, heartbeat or commit (and the static
    /// member's instance id it names, if any).
    pub(super) fn check(
        &self,
        member: &str,
        generation: i32,
        instance: Option<&str>,
    ) -> Result<(), ResponseError> {
        self.fenced(member, instance)?;
        if !self.members.contains_key(member) {
            return Err(ResponseError::UnknownMemberId);
        }
        if generation != self.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        Ok(())
    }

    /// `FENCED_INSTANCE_ID` when `instance` is held by another member id than `member` (a
    /// static member that was replaced by a newer instance of itself).
    pub(super) fn fenced(&self, member: &str, instance: Option<&str>) -> Result<(), ResponseError> {
        match instance.and_then(|i| self.statics.get(i)) {
            Some(holder) if holder != member => Err(ResponseError::FencedInstanceId),
            _ => Ok(()),
        }
    }

    /// A static member's new instance takes over its old member id's place (KIP-345): same
    /// assignment, same leadership; the old id is fenced, and what it waited for is answered
    /// with `FENCED_INSTANCE_ID`. Nothing rebalances by itself here: the caller decides.
    pub(super) fn replace_static(&mut self, instance: &str, old: &str, new: &str) {
        let Some(mut m) = self.members.remove(old) else {
            return;
        };
        m.release(ResponseError::FencedInstanceId);
        if self.leader.as_deref() == Some(old) {
            self.leader = Some(new.to_owned());
        }
        self.members.insert(new.to_owned(), m);
        self.statics.insert(instance.to_owned(), new.to_owned());
    }
}

pub(super) fn join_error(e: ResponseError) -> JoinGroupResponse {
    JoinGroupResponse::default()
        .with_error_code(e.code())
        .with_generation_id(-1)
}
