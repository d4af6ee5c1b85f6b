//! Pull groups in a cluster (contract §13; docs/cluster.md, "Pull groups in a cluster"). Every
//! group call is answered by one broker, the group coordinator: the metadata group's leader
//! (the HTTP layer forwards the calls there). It keeps members, ownership and positions in
//! memory as one broker does; commits go into the replicated metadata, so a coordinator that
//! takes over (the metadata group elected another leader) starts each partition at the group's
//! committed offset, and members carry on by polling it. It reads a partition from its own
//! replica when it holds one (a replica shows only what a majority acknowledged), else through
//! the partition's leader.

use std::time::Duration;

use mmmq_core::Envelope;

use super::{GroupError, Groups, Key};
use crate::cluster::meta_state::{GroupOffset, MetaCommand, MetaOutcome};
use crate::cluster::node::{Cluster, ClusterError};

/// How long a read through another broker may take (well within the time the broker that
/// forwarded the poll waits for it).
const REMOTE_READ: Duration = Duration::from_secs(2);

impl Groups {
    /// Makes this broker's groups a cluster member's (once).
    pub fn attach_cluster(&self, cluster: Cluster) {
        let _ = self.cluster.set(cluster);
    }

    /// The cluster, when this broker is a member.
    pub(super) fn cluster(&self) -> Option<&Cluster> {
        self.cluster.get()
    }

    /// Refuses a group call on a broker that does not coordinate the groups now (a call
    /// forwarded here as leadership moved, or a long poll that outlived it: `503`, the member
    /// tries again and reaches the coordinator). A coordinator that took over in a new term of
    /// the metadata group starts with no group in memory: what it held from an earlier term
    /// (members, positions, commits) may be older than what the coordinator in between did.
    /// Called at the start of every group call, and of every round of a poll.
    pub(super) fn follow_coordinator(&self) -> Result<(), GroupError> {
        let Some(cluster) = self.cluster() else {
            return Ok(());
        };
        let (_, term) = cluster.coordinator();
        if !cluster.coordinates() {
            return Err(ClusterError::NoLeader {
                group: "pull groups' coordinator (the metadata group's leader)".into(),
                leader: None,
            }
            .into());
        }
        let mut served = self.served_term.lock();
        if *served != term {
            *served = term;
            self.groups.lock().clear();
        }
        Ok(())
    }

    /// `group`'s committed next offset of `key` from the metadata (0: none).
    pub(super) fn committed_in_metadata(cluster: &Cluster, group: &str, key: &Key) -> u64 {
        cluster
            .metadata()
            .committed(group, key.0.as_str(), &key.1.to_string(), key.2)
            .unwrap_or(0)
    }

    /// Commits `offsets` of `group` through the metadata group; `member` is named in a refusal
    /// (the topic went away meanwhile).
    pub(super) async fn commit_in_metadata(
        cluster: &Cluster,
        group: &str,
        member: &str,
        offsets: &[(Key, u64)],
    ) -> Result<(), GroupError> {
        let command = MetaCommand::CommitGroup {
            group: group.to_owned(),
            offsets: offsets
                .iter()
                .map(|(k, offset)| GroupOffset {
                    topic: k.0.to_string(),
                    topic_id: k.1.to_string(),
                    partition: k.2,
                    offset: *offset,
                    metadata: None,
                })
                .collect(),
        };
        match cluster.propose_here(command).await? {
            MetaOutcome::Done | MetaOutcome::TopicExists | MetaOutcome::Each(_) => Ok(()),
            MetaOutcome::Refused(_) => {
                let (k, _) = offsets.first().expect("a refused commit has offsets");
                Err(GroupError::NotOwner {
                    member: member.to_owned(),
                    topic: k.0.to_string(),
                    partition: k.2,
                })
            }
        }
    }
}

/// Up to `max` messages of partition `key` from `from`, read through the broker that leads it
/// (this broker holds no replica of it), and the offset to read next (past entries the pull
/// left out: corrupt ones, or those retention deleted).
pub(super) async fn read_remote(
    cluster: &Cluster,
    key: &Key,
    from: u64,
    max: usize,
) -> Result<(Vec<Envelope>, Option<u64>), GroupError> {
    let (topic, _, p) = key;
    let Some(target) = cluster.forward_target(topic.as_str(), *p) else {
        return Ok((Vec::new(), None));
    };
    // Topic names are `[A-Za-z0-9._-]`: nothing to escape.
    let path = format!("/mmmq/topics/{topic}/messages?partition={p}&from={from}&max={max}");
    let answer = cluster
        .forward_http(target, reqwest::Method::GET, &path, None, REMOTE_READ)
        .await?;
    if answer.status != 200 {
        return Err(ClusterError::Failed(format!(
            "reading {topic}/{p} through broker {target}: HTTP {} {}",
            answer.status,
            String::from_utf8_lossy(&answer.body)
        ))
        .into());
    }
    #[derive(serde::Deserialize)]
    struct Pulled {
        messages: Vec<Envelope>,
        next: Option<u64>,
    }
    let pulled: Pulled = serde_json::from_slice(&answer.body).map_err(|e| {
        GroupError::from(ClusterError::Failed(format!(
            "reading {topic}/{p} through broker {target}: {e}"
        )))
    })?;
    Ok((pulled.messages, pulled.next))
}
