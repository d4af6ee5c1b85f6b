//! The metadata group's state machine (docs/cluster.md, "Metadata"): it applies
//! [`MetaCommand`]s to a [`MetaState`] held in memory and publishes each new state to the broker,
//! which opens and closes partition groups to match. The state is small (brokers, topics,
//! placement), so a snapshot is all of it, written to `cluster/meta/snapshot` when openraft asks
//! for one; at boot the snapshot is loaded and the log after it applied again.
//!
//! The cluster's id is taken here, before the state that names it is published: metadata that
//! names another cluster than the one this broker keeps stops the group (docs/cluster.md, "The
//! cluster's id"), so the broker never acts on it (deleting its replicas, say).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures_util::{Stream, TryStreamExt};
use openraft::alias::{LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::identity::Identity;
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
    identity: Arc<Identity>,
}

impl MetaMachine {
    /// Opens the machine in `dir` (`{root}/cluster/meta`), from its snapshot if there is one,
    /// for a broker of `identity`'s cluster (refused if the snapshot names another). Blocking.
    pub fn open(dir: &Path, identity: Arc<Identity>) -> io::Result<Self> {
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
        if let Some(id) = &state.cluster_id {
            identity.adopt(id)?;
        }
        if let Some(secret) = &state.member_secret {
            identity.secret().adopt(&secret.0)?;
        }
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
            identity,
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

    /// Takes the cluster's id the metadata names, before the state naming it is applied: an
    /// error (another cluster's metadata) stops the group.
    async fn adopt(&self, id: &str) -> io::Result<()> {
        let identity = self.identity.clone();
        let id = id.to_owned();
        let adopted = tokio::task::spawn_blocking(move || identity.adopt(&id))
            .await
            .map_err(io::Error::other)?;
        adopted.map_err(|e| {
            tracing::error!(error = %e, "the metadata names another cluster; the metadata group stops");
            e.into()
        })
    }

    /// Takes the members' secret the metadata gives. Never fatal: a secret that cannot be kept
    /// on disk is logged, and this broker goes on taking any internal request until it is.
    async fn adopt_secret(&self, secret: &str) -> io::Result<()> {
        let identity = self.identity.clone();
        let secret = secret.to_owned();
        let adopted = tokio::task::spawn_blocking(move || identity.secret().adopt(&secret))
            .await
            .map_err(io::Error::other)?;
        if let Err(e) = adopted {
            tracing::error!(error = %e, "cannot keep the members' secret");
        }
        Ok(())
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
            let command = match &entry.payload {
                EntryPayload::Normal(Command::Meta(bytes)) => Some(decode(bytes)),
                _ => None,
            };
            if let Some(Ok(MetaCommand::SetClusterId { id })) = &command
                && inner.state.cluster_id.is_none()
            {
                self.adopt(id).await?;
            }
            if let Some(Ok(MetaCommand::SetMemberSecret { secret })) = &command
                && inner.state.member_secret.is_none()
            {
                self.adopt_secret(&secret.0).await?;
            }
            inner.applied = Some(entry.log_id);
            let answer = match &entry.payload {
                EntryPayload::Normal(Command::Meta(_)) => {
                    let outcome = match command.expect("decoded above") {
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
        if let Some(id) = &stored.state.cluster_id {
            self.adopt(id).await?;
        }
        if let Some(secret) = &stored.state.member_secret {
            self.adopt_secret(&secret.0).await?;
        }
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

#[cfg(test)]
mod tests {
    use openraft::entry::RaftEntry;

    use super::*;
    use crate::cluster::log_store::log_id;

    type Entry = openraft::alias::EntryOf<Raft>;

    fn set_id(index: u64, id: &str) -> Entry {
        let command = serde_json::to_vec(&MetaCommand::SetClusterId { id: id.into() }).unwrap();
        Entry::new_normal(log_id(1, index), Command::Meta(command.into()))
    }

    async fn apply(machine: &mut MetaMachine, entries: &[Entry]) -> io::Result<()> {
        let items: Vec<_> = entries.iter().map(|e| Ok((e.clone(), None))).collect();
        machine.apply(futures_util::stream::iter(items)).await
    }

    fn identity(dir: &Path) -> Arc<Identity> {
        Arc::new(Identity::open(dir).unwrap())
    }

    /// A broker takes the id its metadata names, keeps it, and stops at metadata that names
    /// another cluster before anything of it is published (docs/cluster.md, "The cluster's id").
    #[tokio::test]
    async fn the_metadata_names_the_cluster_once_and_another_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let (root, meta) = (tmp.path(), tmp.path().join("meta"));
        let mut machine = MetaMachine::open(&meta, identity(root)).unwrap();
        apply(&mut machine, &[set_id(1, "aaaa"), set_id(2, "bbbb")])
            .await
            .unwrap();
        assert_eq!(machine.current().cluster_id.as_deref(), Some("aaaa"));
        assert_eq!(identity(root).known().as_deref(), Some("aaaa"));
        // The same broker's metadata from another cluster: refused, nothing published.
        let elsewhere = tmp.path().join("elsewhere");
        let mut other = MetaMachine::open(&elsewhere, identity(root)).unwrap();
        let err = apply(&mut other, &[set_id(1, "cccc")]).await.unwrap_err();
        assert!(err.to_string().contains("belongs to cluster aaaa"), "{err}");
        assert_eq!(other.current().cluster_id, None);
        // A snapshot naming another cluster stops the broker at boot.
        let snapshot = machine.build_snapshot().await.unwrap();
        let fresh = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(fresh.path().join("meta")).unwrap();
        std::fs::copy(
            meta.join(SNAPSHOT_FILE),
            fresh.path().join("meta").join(SNAPSHOT_FILE),
        )
        .unwrap();
        std::fs::write(fresh.path().join("id"), "dddd\n").unwrap();
        let refused = MetaMachine::open(&fresh.path().join("meta"), identity(fresh.path()));
        let err = refused.err().expect("refused");
        assert!(err.to_string().contains("names cluster aaaa"), "{err}");
        // ... and a broker that knew none takes it from the snapshot it installs.
        let new = tempfile::tempdir().unwrap();
        let mut joined = MetaMachine::open(&new.path().join("meta"), identity(new.path())).unwrap();
        joined
            .install_snapshot(&snapshot.meta, snapshot.snapshot)
            .await
            .unwrap();
        assert_eq!(identity(new.path()).known().as_deref(), Some("aaaa"));
    }
}
