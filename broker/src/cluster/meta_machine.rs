//! The metadata group's state machine (docs/cluster.md, "Metadata"): it applies
//! [`MetaCommand`]s to a [`MetaState`] held in memory and publishes each new state to the broker,
//! which opens and closes partition groups to match. The state is small (brokers, topics,
//! placement), so a snapshot is all of it, written to `cluster/meta/snapshot` when openraft asks
//! for one; at boot the snapshot is loaded and the log after it applied again.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures_util::{Stream, TryStreamExt};
use openraft::alias::{LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::meta_state::{MetaCommand, MetaOutcome, MetaState};
use super::network::SnapshotBytes;
use super::types::{Applied, Command, Raft};
use crate::storage::vfs::{OsFs, replace_durably};

const SNAPSHOT_FILE: &str = "snapshot";

/// The snapshot file: the snapshot's meta and the state, as JSON (people read it when a cluster
/// misbehaves).
#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMetaOf<Raft>,
    state: MetaState,
}

struct Inner {
    applied: Option<LogIdOf<Raft>>,
    membership: StoredMembershipOf<Raft>,
    state: MetaState,
    snapshot: Option<(SnapshotMetaOf<Raft>, SnapshotBytes)>,
}

/// The metadata group's state machine. Cheap to clone (openraft takes one for snapshots).
#[derive(Clone)]
pub struct MetaMachine {
    inner: Arc<tokio::sync::Mutex<Inner>>,
    dir: PathBuf,
    published: watch::Sender<Arc<MetaState>>,
}

impl MetaMachine {
    /// Opens the machine in `dir` (`{root}/cluster/meta`), from its snapshot if there is one.
    /// Blocking.
    pub fn open(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let (applied, membership, state, snapshot) = match std::fs::read(dir.join(SNAPSHOT_FILE)) {
            Ok(bytes) => {
                let stored: StoredSnapshot = serde_json::from_slice(&bytes).map_err(|e| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{}: {e}", dir.join(SNAPSHOT_FILE).display()),
                    )
                })?;
                let meta = stored.meta.clone();
                (
                    meta.last_log_id,
                    meta.last_membership.clone(),
                    stored.state,
                    Some((meta, bytes)),
                )
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                (None, Default::default(), MetaState::default(), None)
            }
            Err(e) => return Err(e),
        };
        let (published, _) = watch::channel(Arc::new(state.clone()));
        Ok(Self {
            inner: Arc::new(tokio::sync::Mutex::new(Inner {
                applied,
                membership,
                state,
                snapshot,
            })),
            dir: dir.to_owned(),
            published,
        })
    }

    /// Every applied state, newest first: the broker follows it.
    pub fn subscribe(&self) -> watch::Receiver<Arc<MetaState>> {
        self.published.subscribe()
    }

    /// The state as applied so far on this broker.
    pub fn current(&self) -> Arc<MetaState> {
        self.published.borrow().clone()
    }

    async fn store(&self, meta: &SnapshotMetaOf<Raft>, state: &MetaState) -> io::Result<Vec<u8>> {
        let stored = StoredSnapshot {
            meta: meta.clone(),
            state: state.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&stored).map_err(io::Error::other)?;
        let path = self.dir.join(SNAPSHOT_FILE);
        let written = bytes.clone();
        tokio::task::spawn_blocking(move || replace_durably(&OsFs, &path, &written))
            .await
            .map_err(io::Error::other)?
            .map_err(io::Error::other)?;
        Ok(bytes)
    }
}

fn decode(bytes: &[u8]) -> Result<MetaCommand, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("a metadata entry does not decode: {e}"))
}

impl RaftSnapshotBuilder<Raft> for MetaMachine {
    type SnapshotData = SnapshotBytes;

    async fn build_snapshot(&mut self) -> Result<SnapshotOf<Raft, SnapshotBytes>, io::Error> {
        let (meta, state) = {
            let inner = self.inner.lock().await;
            let meta = SnapshotMetaOf::<Raft> {
                last_log_id: inner.applied,
                last_membership: inner.membership.clone(),
            };
            (meta, inner.state.clone())
        };
        let bytes = self.store(&meta, &state).await?;
        self.inner.lock().await.snapshot = Some((meta.clone(), bytes.clone()));
        Ok(SnapshotOf::<Raft, SnapshotBytes> {
            meta,
            snapshot: bytes,
        })
    }
}

impl RaftStateMachine<Raft> for MetaMachine {
    type SnapshotData = SnapshotBytes;
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogIdOf<Raft>>, StoredMembershipOf<Raft>), io::Error> {
        let inner = self.inner.lock().await;
        Ok((inner.applied, inner.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<Raft>, io::Error>> + Unpin + OptionalSend,
    {
        let mut inner = self.inner.lock().await;
        while let Some((entry, responder)) = entries.try_next().await? {
            inner.applied = Some(entry.log_id);
            let answer = match &entry.payload {
                EntryPayload::Normal(Command::Meta(bytes)) => {
                    let outcome = match decode(bytes) {
                        Ok(command) => inner.state.apply(&command),
                        Err(why) => MetaOutcome::Refused(why),
                    };
                    Applied::Meta(
                        serde_json::to_vec(&outcome)
                            .map_err(io::Error::other)?
                            .into(),
                    )
                }
                EntryPayload::Normal(Command::Message(_)) => Applied::Meta(
                    serde_json::to_vec(&MetaOutcome::Refused(
                        "a message entry in the metadata group".into(),
                    ))
                    .map_err(io::Error::other)?
                    .into(),
                ),
                EntryPayload::Membership(m) => {
                    inner.membership =
                        StoredMembershipOf::<Raft>::new(Some(entry.log_id), m.clone());
                    Applied::Nothing
                }
                EntryPayload::Blank => Applied::Nothing,
            };
            if let Some(responder) = responder {
                responder.send(answer);
            }
        }
        self.published.send_replace(Arc::new(inner.state.clone()));
        Ok(())
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<Raft>,
        snapshot: SnapshotBytes,
    ) -> Result<(), io::Error> {
        let stored: StoredSnapshot = serde_json::from_slice(&snapshot)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let bytes = self.store(meta, &stored.state).await?;
        let mut inner = self.inner.lock().await;
        inner.applied = meta.last_log_id;
        inner.membership = meta.last_membership.clone();
        inner.state = stored.state;
        inner.snapshot = Some((meta.clone(), bytes));
        self.published.send_replace(Arc::new(inner.state.clone()));
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<Raft, SnapshotBytes>>, io::Error> {
        let inner = self.inner.lock().await;
        Ok(inner
            .snapshot
            .as_ref()
            .map(|(meta, bytes)| SnapshotOf::<Raft, SnapshotBytes> {
                meta: meta.clone(),
                snapshot: bytes.clone(),
            }))
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }
}
