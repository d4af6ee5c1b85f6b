//! The partition groups this broker replicates (docs/cluster.md, "Topics and produce in a
//! cluster"): each runs on the partition's own segment log, shared with the topic registry's
//! readers; the replicas of a partition's first placement initialize its group, with the
//! placement's brokers as voters; a replica a move adds starts empty and waits for the leader
//! (docs/cluster.md, "Membership"); each runs under supervision (`super::supervise`).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::ids::PartitionIds;
use super::network::GroupId;
use super::node::{Cluster, ClusterError};
use super::rpc::Endpoint;
use super::supervise::{Opener, Supervised};
use super::types::BrokerId;
use crate::storage::{Log, Vfs};

impl Cluster {
    /// Runs partition `p` of `topic`'s group here, on `log`, if it does not run yet, under
    /// supervision (`super::supervise`: opened again after a storage error stops it). With
    /// `initialize`, an empty log is initialized with those voters (a replica of the partition's
    /// first placement); without, an empty log waits for the leader to add it.
    pub async fn serve_partition(
        &self,
        topic: &str,
        p: u32,
        log: Log,
        vfs: Arc<dyn Vfs>,
        ids: Arc<PartitionIds>,
        initialize: Option<&[BrokerId]>,
    ) -> Result<(), ClusterError> {
        let group = GroupId::Partition(topic.to_owned(), p);
        if self.inner.partitions.read().contains_key(&group) {
            return Ok(());
        }
        let failed = |e: &dyn std::fmt::Display| ClusterError::Failed(format!("{group}: {e}"));
        let opener = Opener {
            id: self.id(),
            config: self.inner.config.raft_config("partition"),
            router: self.inner.router.clone(),
            group: group.clone(),
            log,
            vfs,
            ids,
        };
        let raft = opener.open().await.map_err(|e| failed(&e))?;
        // Every replica initializes the group, with the same membership from the metadata:
        // openraft takes identical first entries as one, and a group whose first replica is
        // down still forms from the others.
        if let Some(replicas) = initialize
            && !raft.is_initialized().await.map_err(|e| failed(&e))?
        {
            let meta = self.metadata();
            let members: Option<BTreeMap<BrokerId, openraft::BasicNode>> = replicas
                .iter()
                .map(|b| {
                    let addr = meta.brokers.get(b)?.addr.clone();
                    Some((*b, openraft::BasicNode::new(addr)))
                })
                .collect();
            let Some(members) = members else {
                let _ = raft.shutdown().await;
                return Err(failed(&"a replica the metadata does not name"));
            };
            if let Err(e) = raft.initialize(members).await {
                // Another replica's identical first entry may have arrived first.
                tracing::debug!(%group, error = %e, "initializing a partition group");
            }
        }
        let series = self.inner.metrics.partition(topic, p);
        let endpoint: Arc<dyn Endpoint> = Supervised::start(raft, opener, series);
        self.inner.partitions.write().insert(group, endpoint);
        Ok(())
    }

    /// The leader of a partition as this broker knows it: its replica's view; without a
    /// replica, the peer whose last ping claimed it (docs/cluster.md, "Liveness and
    /// elections"), else the last leader a forward found.
    pub fn leader_of(&self, topic: &str, p: u32) -> Option<BrokerId> {
        let group = GroupId::Partition(topic.to_owned(), p);
        if let Some(ep) = self.inner.partitions.read().get(&group) {
            return ep.view().leader;
        }
        let alive = std::time::Duration::from_millis(self.inner.config.election_ms);
        self.inner
            .liveness
            .leader(&group, alive)
            .or_else(|| self.inner.hints.read().get(&group).copied())
    }

    /// Stops partition `p` of `topic`'s group here, if it runs, and deletes its files: the
    /// messages (the segment log starts over, empty) and the `raft/` directory. For a replica
    /// moved away; the log stays open, empty, as a partition's is on a broker without a replica.
    pub async fn release_partition(
        &self,
        topic: &str,
        p: u32,
        log: &Log,
        vfs: Arc<dyn Vfs>,
    ) -> Result<(), ClusterError> {
        let group = GroupId::Partition(topic.to_owned(), p);
        let running = self.inner.partitions.write().remove(&group);
        if let Some(ep) = running {
            ep.stop().await;
        }
        let raft_dir = log.dir().join(super::log_store::RAFT_DIR);
        let holds = {
            let (vfs, raft_dir) = (vfs.clone(), raft_dir.clone());
            tokio::task::spawn_blocking(move || vfs.is_dir(&raft_dir))
                .await
                .map_err(|e| ClusterError::Failed(e.to_string()))?
        };
        if !holds && log.durable_end() == log.first_offset() {
            return Ok(());
        }
        let failed = |e: &dyn std::fmt::Display| ClusterError::Failed(format!("{group}: {e}"));
        // The messages first: a power cut after them leaves `raft/` beside an empty log, which
        // the next release removes; the other order would leave log ids without `raft/`, which
        // no longer opens as a clustered log.
        log.reset(0).await.map_err(|e| failed(&e))?;
        tokio::task::spawn_blocking(move || {
            vfs.remove_dir_all(&raft_dir)?;
            vfs.sync_dir(
                raft_dir
                    .parent()
                    .expect("raft/ is in a partition's directory"),
            )
        })
        .await
        .map_err(|e| failed(&e))?
        .map_err(|e| failed(&e))?;
        tracing::info!(%group, "replica moved away: its group stopped and its files deleted");
        Ok(())
    }

    /// Stops every partition group of `topic` here.
    pub async fn stop_topic(&self, topic: &str) {
        let stopped: Vec<Arc<dyn Endpoint>> = {
            let mut groups = self.inner.partitions.write();
            let keys: Vec<GroupId> = groups
                .keys()
                .filter(|g| matches!(g, GroupId::Partition(t, _) if t == topic))
                .cloned()
                .collect();
            keys.iter().filter_map(|k| groups.remove(k)).collect()
        };
        for ep in stopped {
            ep.stop().await;
        }
    }
}

/// The header a forwarded request carries: the broker it was forwarded by. A broker that gets
/// one answers itself, never forwards again (one hop, no loops while leaders move).
pub const FORWARDED: &str = "x-mmmq-forwarded-by";

/// An answer of another broker, passed on as it came.
#[derive(Debug)]
pub struct Forwarded {
    /// Its status.
    pub status: u16,
    /// Its `Content-Type`.
    pub content_type: Option<String>,
    /// Its `Link` (a page of a list names the next).
    pub link: Option<String>,
    /// Its body.
    pub body: bytes::Bytes,
}

impl Cluster {
    /// Where a request about partition `p` of `topic` must go: `Some(leader)` when another
    /// broker leads it, `None` when this broker answers (it leads, or holds a replica while no
    /// leader is known).
    pub fn forward_target(&self, topic: &str, p: u32) -> Option<BrokerId> {
        match self.leader_of(topic, p) {
            Some(l) if l == self.id() => None,
            Some(l) => Some(l),
            None if self
                .inner
                .partitions
                .read()
                .contains_key(&GroupId::Partition(topic.to_owned(), p)) =>
            {
                None
            }
            // Not a replica and no leader known: ask a replica, which knows.
            None => self
                .metadata()
                .topics
                .get(topic)?
                .placement
                .get(p as usize)?
                .iter()
                .copied()
                .find(|b| *b != self.id()),
        }
    }

    /// Whether a request another broker forwarded here may be answered as a member's: refused,
    /// with why, when it is not a member's (without the members' secret) or names another
    /// cluster than this one.
    pub fn accepts_forwarded(
        &self,
        headers: &axum::http::HeaderMap,
    ) -> Result<(), super::identity::Refusal> {
        self.inner.router.identity().admit(headers)
    }

    /// Sends an HTTP request to another broker (one hop) and answers what it answered.
    pub async fn forward_http(
        &self,
        to: BrokerId,
        method: reqwest::Method,
        path_and_query: &str,
        body: Option<bytes::Bytes>,
        timeout: std::time::Duration,
    ) -> Result<Forwarded, ClusterError> {
        let router = &self.inner.router;
        let base = router
            .peer(to)
            .ok_or_else(|| ClusterError::Unreachable(to, "no address known".into()))?;
        let mut request = router
            .http()
            .request(method, format!("{base}{path_and_query}"))
            .header(FORWARDED, self.id().to_string())
            .timeout(timeout);
        // Checked by the broker it reaches, as Raft's messages are (`super::identity`).
        request = router.credentials(request);
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let unreachable = |e: reqwest::Error| ClusterError::Unreachable(to, e.to_string());
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let link = response
            .headers()
            .get(reqwest::header::LINK)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response.bytes().await.map_err(unreachable)?;
        Ok(Forwarded {
            status,
            content_type,
            link,
            body,
        })
    }
}
