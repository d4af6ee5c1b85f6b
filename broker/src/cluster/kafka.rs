//! What Kafka's protocol needs of the cluster (docs/kafka.md, "In a cluster"): each broker's
//! Kafka address in the metadata, and writes made at a partition's leader only.
//!
//! A Kafka client sends a produce to the broker Metadata names as the partition's leader, and a
//! broker that does not lead it answers `NOT_LEADER_OR_FOLLOWER` rather than forward it: the
//! client refreshes its metadata and goes to the leader itself. Writing only here also keeps an
//! idempotent producer's sequence checks sound: they are made by the leader, in a term whose
//! first entry it applied (so every batch a previous leader committed is in its log), and the
//! batch is proposed on the condition that the term has not changed since.

use std::time::Duration;

use bytes::Bytes;
use openraft::async_runtime::WatchReceiver;

use super::delivery::LEASE_SHARE;
use super::meta_state::{MetaCommand, MetaOutcome};
use super::network::GroupId;
use super::node::Cluster;
use super::rpc::{WriteRefused, quorum_acked_within, with_lease, write_once};
use super::supervise::PartitionRaft;
use super::types::{Applied, BrokerId, Command};

/// Why a write at this broker, as a partition's leader, was not made or not answered.
#[derive(Debug, thiserror::Error)]
pub enum LeaderWriteError {
    /// This broker does not lead the partition (or no longer in the term the write was
    /// judged in): nothing was written.
    #[error("this broker does not lead the partition now")]
    NotLeader,
    /// The leader has not applied its term's first entry yet: nothing was written.
    #[error("{0}")]
    NotReady(String),
    /// The write may be stored or not (the leader lost its leadership mid-write, or no
    /// majority answered in time).
    #[error("{0}")]
    Unknown(String),
    /// Storage or Raft failed; nothing was acknowledged.
    #[error("{0}")]
    Failed(String),
}

impl Cluster {
    /// Keeps this broker's Kafka address `addr` in the metadata (`None`: it has no Kafka
    /// listener, and an address a run before announced is cleared): proposed once the broker
    /// is named there, again whenever the metadata shows another (docs/kafka.md, "In a
    /// cluster").
    pub fn announce_kafka(&self, addr: Option<String>) {
        let this = self.clone();
        tokio::spawn(async move {
            let me = this.id();
            let mut metadata = this.watch_metadata();
            loop {
                let wanted = metadata
                    .borrow()
                    .brokers
                    .get(&me)
                    .is_some_and(|b| b.kafka != addr);
                if wanted {
                    let command = MetaCommand::SetKafkaAddress {
                        id: me,
                        addr: addr.clone(),
                    };
                    match this.propose(command).await {
                        // Shown once this broker applies it: the metadata changes.
                        Ok(MetaOutcome::Done) => {}
                        Ok(other) => {
                            tracing::debug!(node = me, ?other, "announcing the Kafka address");
                        }
                        Err(e) => {
                            tracing::debug!(node = me, error = %e, "announcing the Kafka address, retrying");
                        }
                    }
                }
                let retry = tokio::time::sleep(if wanted {
                    Duration::from_millis(200)
                } else {
                    Duration::MAX
                });
                tokio::select! {
                    changed = metadata.changed() => if changed.is_err() { return },
                    _ = retry => {}
                    _ = this.inner.stop.cancelled() => return,
                }
            }
        });
    }

    /// Every broker with a Kafka listener, and its address, from the metadata.
    pub fn kafka_brokers(&self) -> Vec<(BrokerId, String)> {
        self.metadata()
            .brokers
            .iter()
            .filter_map(|(id, b)| Some((*id, b.kafka.clone()?)))
            .collect()
    }

    /// The replicas of partition `p` of `topic`, preferred leader first (empty if unknown).
    pub fn replicas_of(&self, topic: &str, p: u32) -> Vec<BrokerId> {
        self.metadata()
            .topics
            .get(topic)
            .and_then(|t| t.placement.get(p as usize).cloned())
            .unwrap_or_default()
    }

    /// Whether this broker leads partition `p` of `topic` as its replica sees it now.
    pub fn leads_partition(&self, topic: &str, p: u32) -> bool {
        self.raft_of(topic, p).is_some_and(|raft| {
            raft.metrics().borrow_watched().state == openraft::ServerState::Leader
        })
    }

    /// Whether this broker leads partition `p` of `topic` and applied its term's first entry,
    /// without waiting: its log then holds every message committed before.
    pub fn leads_ready(&self, topic: &str, p: u32) -> Result<(), LeaderWriteError> {
        let raft = self.raft_of(topic, p).ok_or(LeaderWriteError::NotLeader)?;
        let metrics = raft.metrics();
        let m = metrics.borrow_watched();
        if m.state != openraft::ServerState::Leader {
            return Err(LeaderWriteError::NotLeader);
        }
        if m.last_applied
            .is_some_and(|l| l.committed_leader_id().term == m.current_term)
        {
            Ok(())
        } else {
            Err(LeaderWriteError::NotReady(
                "the leader has not applied its term's first entry yet".into(),
            ))
        }
    }

    /// Confirms that this broker still leads partition `p` of `topic` in `term`: a quorum
    /// acknowledged it within the lease (renewed by a heartbeat if it lapsed), so no other
    /// broker leads it now. Asked before an answer a client acts on for good (an idempotent
    /// producer takes `OUT_OF_ORDER_SEQUENCE_NUMBER` as fatal), which a deposed leader, judging
    /// by the state of its old term, must not give.
    pub async fn confirm_leading(
        &self,
        topic: &str,
        p: u32,
        term: u64,
    ) -> Result<(), LeaderWriteError> {
        let raft = self.raft_of(topic, p).ok_or(LeaderWriteError::NotLeader)?;
        let lease = Duration::from_millis(self.inner.config.election_ms).mul_f64(LEASE_SHARE);
        with_lease(&raft, || async {
            let metrics = raft.metrics();
            let m = metrics.borrow_watched();
            if m.current_term != term {
                Err(WriteRefused::NotLeader {
                    leader: m.current_leader.filter(|l| *l != m.id),
                })
            } else if quorum_acked_within(&m, lease) {
                Ok(())
            } else {
                Err(WriteRefused::NotLeader { leader: None })
            }
        })
        .await
        .map_err(refused)
    }

    /// The term in which this broker leads partition `p` of `topic`, once it applied that
    /// term's first entry: from then on its log holds every message committed before.
    pub async fn leading_term(&self, topic: &str, p: u32) -> Result<u64, LeaderWriteError> {
        let raft = self.raft_of(topic, p).ok_or(LeaderWriteError::NotLeader)?;
        super::ids::term_applied(&raft).await.map_err(refused)
    }

    /// Appends `payloads` to partition `p` of `topic` as one batch at this broker, if it still
    /// leads the partition in `term`; answers their offsets once a majority of its replicas
    /// hold them. Never forwarded, and never given up by itself: a leader cut off from its
    /// followers answers once it hears from them again or a new leader deposes it (then the
    /// outcome is [`LeaderWriteError::Unknown`]), so a caller bounds its own wait.
    pub async fn write_in_term(
        &self,
        topic: &str,
        p: u32,
        term: u64,
        payloads: Vec<Bytes>,
    ) -> Result<Vec<u64>, LeaderWriteError> {
        let raft = self.raft_of(topic, p).ok_or(LeaderWriteError::NotLeader)?;
        let commands: Vec<Command> = payloads.into_iter().map(Command::Message).collect();
        let count = commands.len();
        let applied = with_lease(&raft, || async {
            if raft.metrics().borrow_watched().current_term != term {
                return Err(WriteRefused::NotLeader { leader: None });
            }
            write_once(&raft, commands.clone()).await
        })
        .await
        .map_err(|e| match e {
            // The group stopped under the write (its disk refused): the other replicas may
            // still commit what it sent them.
            WriteRefused::Failed(why) if raft.metrics().borrow_watched().running_state.is_err() => {
                LeaderWriteError::Unknown(why)
            }
            e => refused(e),
        })?;
        let offsets: Vec<u64> = applied
            .iter()
            .filter_map(|a| match a {
                Applied::Offset(o) => Some(*o),
                _ => None,
            })
            .collect();
        if offsets.len() != count {
            return Err(LeaderWriteError::Failed(format!(
                "{count} messages were applied as {applied:?}"
            )));
        }
        Ok(offsets)
    }

    /// The running Raft of partition `p` of `topic` on this broker, if it replicates it.
    fn raft_of(&self, topic: &str, p: u32) -> Option<PartitionRaft> {
        let group = GroupId::Partition(topic.to_owned(), p);
        self.inner.partitions_or_meta(&group)?.partition_raft()
    }
}

fn refused(e: WriteRefused) -> LeaderWriteError {
    match e {
        WriteRefused::NotLeader { .. } => LeaderWriteError::NotLeader,
        WriteRefused::Retry(why) => LeaderWriteError::NotReady(why),
        WriteRefused::Discarded => LeaderWriteError::Unknown(e.to_string()),
        WriteRefused::Unknown(why) => LeaderWriteError::Unknown(why),
        WriteRefused::Failed(why) => LeaderWriteError::Failed(why),
    }
}
