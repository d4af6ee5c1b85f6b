//! Supervision of a partition's group on this broker (docs/cluster.md, "A disk that refuses
//! writes"). openraft stops a group for good on a storage error (a write or fsync the disk
//! refused); left so, the replica would be lost to its partition until the broker restarts. A
//! task per group watches openraft's metrics channel: it keeps the group's metrics
//! (`super::metrics`) and, when the group stops on an error, opens it again from its files after
//! a backoff — the log store recovers what is durable, so its memory matches the disk — until
//! that works, so that once the disk takes writes again the replica rejoins and catches up.
//!
//! While the group is down the broker answers for it as for a group it does not hold: Raft's
//! messages are refused as from a stopped node, a write is answered "not the leader", and its
//! view names no leader, so writes through this broker go to another replica.

use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::error::{Fatal, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use parking_lot::{Mutex, RwLock};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::ids::PartitionIds;
use super::log_store::SegmentLogStore;
use super::machine::PartitionMachine;
use super::membership::MembersChange;
use super::metrics::GroupSeries;
use super::network::{GroupId, NetworkFactory, Router, SnapshotBytes};
use super::rpc::{Endpoint, GroupView, WriteRefused};
use super::types::{Applied, BrokerId, Command, GroupKind, Raft};
use crate::storage::{Log, Vfs};

/// A partition's Raft on this broker.
pub type PartitionRaft = openraft::Raft<Raft, PartitionMachine>;

type SnapshotMeta = openraft::alias::SnapshotMetaOf<Raft>;
type Vote = openraft::alias::VoteOf<Raft>;

/// The first wait before a stopped group is opened again: at least the segment log's
/// `retry_after` (1 s), before which a log poisoned by the failure refuses appends anyway.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between two attempts while the disk still refuses.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What opens a partition's group on its log, the first time and after each stop.
pub(super) struct Opener {
    pub(super) id: BrokerId,
    pub(super) config: Arc<openraft::Config>,
    pub(super) router: Router,
    pub(super) group: GroupId,
    pub(super) log: Log,
    pub(super) vfs: Arc<dyn Vfs>,
    /// The topic's produce ids (docs/cluster.md, "Produce ids in a cluster").
    pub(super) ids: Arc<PartitionIds>,
}

impl Opener {
    /// Opens the group from its files: the log store recovers what is durable, the state
    /// machine its last applied state, and Raft starts on them.
    pub(super) async fn open(&self) -> Result<PartitionRaft, String> {
        let store =
            SegmentLogStore::on_log(self.log.clone(), self.vfs.clone(), GroupKind::Partition)
                .await
                .map_err(|e| e.to_string())?;
        let mut machine = PartitionMachine::open(&store)
            .await
            .map_err(|e| e.to_string())?;
        // The window's ids of what was applied, read in the background once (a leader decides on
        // ids only once they are: `PartitionIds`), so that a restart does not wait for every
        // partition's window to be read before its groups elect.
        let (ids, group) = (self.ids.clone(), self.group.clone());
        if !ids.restored() {
            tokio::task::spawn_blocking(move || {
                let mut tries = 0;
                while let Err(error) = ids.restore() {
                    tries += 1;
                    tracing::error!(%group, %error, tries, "cannot read the partition's produce ids from its log; writes with ids are refused until it can");
                    // Tried again while the group uses them (it holds the other references).
                    if Arc::strong_count(&ids) == 1 {
                        return;
                    }
                    std::thread::sleep(std::time::Duration::from_secs(5));
                }
            });
        }
        machine.remember_ids(self.ids.clone());
        let network = NetworkFactory::new(self.router.clone(), self.group.clone());
        openraft::Raft::new(self.id, self.config.clone(), network, store, machine)
            .await
            .map_err(|e| e.to_string())
    }
}

/// A partition's group under supervision: the endpoint the broker routes its traffic to.
pub(super) struct Supervised {
    /// The running Raft; `None` while the group is being opened again.
    raft: RwLock<Option<PartitionRaft>>,
    /// The topic's produce ids: a write with ids is decided here when this replica leads.
    ids: Arc<PartitionIds>,
    stop: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Supervised {
    /// Supervises `raft`, opened by `opener`, its metrics in `series`.
    pub(super) fn start(raft: PartitionRaft, opener: Opener, series: GroupSeries) -> Arc<Self> {
        let this = Arc::new(Self {
            raft: RwLock::new(Some(raft.clone())),
            ids: opener.ids.clone(),
            stop: CancellationToken::new(),
            task: Mutex::new(None),
        });
        let task = tokio::spawn(supervise(this.clone(), raft, opener, series));
        *this.task.lock() = Some(task);
        this
    }

    /// The Raft if it runs.
    fn running(&self) -> Option<PartitionRaft> {
        let raft = self.raft.read().clone()?;
        let ok = raft.metrics().borrow_watched().running_state.is_ok();
        ok.then_some(raft)
    }
}

/// The error a group that is down answers Raft's messages with (as an absent group does).
fn down<T>() -> Result<T, RaftError<Raft>> {
    Err(RaftError::Fatal(Fatal::Stopped))
}

/// Watches the group until it stops (the error why) or supervision ends (`None`).
async fn watch(
    raft: &PartitionRaft,
    series: &mut GroupSeries,
    stop: &CancellationToken,
) -> Option<String> {
    let mut rx = raft.metrics();
    loop {
        {
            let m = rx.borrow_watched();
            series.observe(&m);
            if let Err(fatal) = &m.running_state {
                return Some(fatal.to_string());
            }
        }
        tokio::select! {
            changed = rx.changed() => if changed.is_err() {
                return Some("its task ended".to_owned());
            },
            _ = stop.cancelled() => return None,
        }
    }
}

async fn supervise(
    this: Arc<Supervised>,
    mut raft: PartitionRaft,
    opener: Opener,
    mut series: GroupSeries,
) {
    let (topic, partition) = match &opener.group {
        GroupId::Partition(t, p) => (t.clone(), *p),
        GroupId::Meta => (String::new(), 0),
    };
    loop {
        let stopped = watch(&raft, &mut series, &this.stop).await;
        this.raft.write().take();
        let _ = raft.shutdown().await;
        let Some(why) = stopped.filter(|_| !this.stop.is_cancelled()) else {
            series.remove();
            return;
        };
        series.stopped();
        tracing::error!(%topic, partition, error = %why, "partition group stopped; opening it again from its files");
        let mut backoff = FIRST_BACKOFF;
        raft = loop {
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = this.stop.cancelled() => {
                    series.remove();
                    return;
                }
            }
            match opener.open().await {
                Ok(raft) => break raft,
                Err(error) => {
                    tracing::warn!(%topic, partition, %error, retry_in_ms = MAX_BACKOFF.min(backoff * 2).as_millis() as u64, "partition group does not open yet");
                    backoff = MAX_BACKOFF.min(backoff * 2);
                }
            }
        };
        {
            let mut slot = this.raft.write();
            if !this.stop.is_cancelled() {
                *slot = Some(raft.clone());
            }
        }
        tracing::info!(%topic, partition, "partition group running again");
    }
}

#[async_trait::async_trait]
impl Endpoint for Supervised {
    async fn append(
        &self,
        req: AppendEntriesRequest<Raft>,
    ) -> Result<AppendEntriesResponse<Raft>, RaftError<Raft>> {
        match self.running() {
            Some(r) => Endpoint::append(&r, req).await,
            None => down(),
        }
    }

    async fn vote(&self, req: VoteRequest<Raft>) -> Result<VoteResponse<Raft>, RaftError<Raft>> {
        match self.running() {
            Some(r) => Endpoint::vote(&r, req).await,
            None => down(),
        }
    }

    async fn pre_vote(
        &self,
        req: VoteRequest<Raft>,
    ) -> Result<VoteResponse<Raft>, RaftError<Raft>> {
        match self.running() {
            Some(r) => Endpoint::pre_vote(&r, req).await,
            None => down(),
        }
    }

    async fn snapshot(
        &self,
        vote: Vote,
        meta: SnapshotMeta,
        data: SnapshotBytes,
    ) -> Result<SnapshotResponse<Raft>, RaftError<Raft>> {
        match self.running() {
            Some(r) => Endpoint::snapshot(&r, vote, meta, data).await,
            None => down(),
        }
    }

    async fn transfer_leader(
        &self,
        req: TransferLeaderRequest<Raft>,
    ) -> Result<TransferLeaderResponse<Raft>, RaftError<Raft>> {
        match self.running() {
            Some(r) => Endpoint::transfer_leader(&r, req).await,
            None => down(),
        }
    }

    async fn write(&self, commands: Vec<Command>) -> Result<Vec<Applied>, WriteRefused> {
        let Some(r) = self.running() else {
            return Err(WriteRefused::NotLeader { leader: None });
        };
        match self.ids.write(&r, commands).await {
            // The group stopped under the write (its disk refused): the other replicas may
            // still commit what it sent them.
            Err(WriteRefused::Failed(why))
                if r.metrics().borrow_watched().running_state.is_err() =>
            {
                Err(WriteRefused::Unknown(why))
            }
            other => other,
        }
    }

    fn partition_raft(&self) -> Option<PartitionRaft> {
        self.running()
    }

    fn view(&self) -> GroupView {
        match self.running() {
            Some(r) => Endpoint::view(&r),
            None => GroupView::default(),
        }
    }

    async fn change_members(&self, change: MembersChange) -> Result<(), WriteRefused> {
        match self.running() {
            Some(r) => Endpoint::change_members(&r, change).await,
            None => Err(WriteRefused::NotLeader { leader: None }),
        }
    }

    async fn elect(&self) {
        if let Some(r) = self.running() {
            Endpoint::elect(&r).await;
        }
    }

    async fn purge_before(&self, offset: u64) -> Result<Option<u64>, String> {
        match self.running() {
            Some(r) => super::retention::purge_before(&r, offset).await,
            None => Ok(None),
        }
    }

    async fn stop(&self) {
        self.stop.cancel();
        let task = self.task.lock().take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}
