//! The cluster's id (docs/cluster.md, "The cluster's id"): drawn once when a cluster forms, kept
//! in its metadata and, on each member, in `{root}/cluster/id`. Every Raft message a broker sends
//! carries it (the [`CLUSTER_HEADER`] header), and a broker that knows its id refuses a message
//! that names another: a broker of another cluster (overlapping `--peers`, an `add-broker` with
//! the wrong address) never gets to vote, append or write here, nor this cluster there.
//!
//! A broker that does not know its id yet (a new broker, before its metadata reached it) sends
//! none and refuses nothing: it adopts the id its metadata brings. A message without an id is
//! taken (a new broker's), so the id guards against brokers of another formed cluster.
//!
//! Naming a new cluster is `Cluster::name_cluster`'s (run by each broker's announcement loop
//! in `node`); taking the id from the metadata is the metadata's state machine's.

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use parking_lot::{Mutex, RwLock};

use super::meta_state::{MetaCommand, MetaOutcome};
use super::node::{Cluster, ClusterError};
use super::secret::MemberSecret;
use crate::storage::vfs::{OsFs, replace_durably};

/// The header every internal message carries, once its sender knows its cluster's id; a
/// refusal answers with the refusing broker's.
pub const CLUSTER_HEADER: &str = "x-mmmq-cluster";

/// The file, in `{root}/cluster/`, that holds the id once this broker learnt it.
const ID_FILE: &str = "id";

/// How many other clusters' ids a broker remembers having logged (a log line each).
const LOGGED_FOREIGN: usize = 16;

/// Why an id could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The metadata names another cluster than the one this broker belongs to.
    #[error(
        "this broker belongs to cluster {mine} (its {}), its metadata names cluster {theirs}: \
         refusing to join another cluster (is this root dir another cluster's?)",
        path.display()
    )]
    Conflict {
        /// The id this broker keeps.
        mine: String,
        /// The metadata's.
        theirs: String,
        /// Where this broker keeps it.
        path: PathBuf,
    },
    /// The id file could not be read or written.
    #[error("{}: {reason}", path.display())]
    Storage {
        /// The id file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

impl From<IdentityError> for io::Error {
    fn from(e: IdentityError) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, e.to_string())
    }
}

/// Why an internal message is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// It names another cluster than this broker's (`409`, this broker's id in
    /// [`CLUSTER_HEADER`]).
    #[error("this broker belongs to cluster {mine}, the message to cluster {theirs}")]
    OtherCluster {
        /// The refusing broker's cluster.
        mine: String,
        /// The cluster the message named.
        theirs: String,
    },
    /// It is not a member's (`403`): without the members' secret, or naming no cluster where
    /// this broker knows its own (docs/cluster.md, "Who may speak for the cluster").
    #[error("internal traffic is for members of this cluster only: {0}")]
    NotMember(&'static str),
}

/// This broker's cluster id, as far as it knows it.
pub struct Identity {
    path: PathBuf,
    /// The members' secret (`super::secret`).
    secret: MemberSecret,
    known: RwLock<Option<String>>,
    /// The other clusters whose messages were refused and logged here.
    logged: Mutex<HashSet<String>>,
}

impl Identity {
    /// Reads the id kept in `dir` (`{root}/cluster`), if any. Blocking.
    pub fn open(dir: &Path) -> Result<Self, IdentityError> {
        Self::open_with(dir, None)
    }

    /// As [`Identity::open`], with the members' secret given by the operator
    /// (`--cluster-secret-file`) rather than the one the metadata brings.
    pub fn open_with(dir: &Path, secret: Option<&str>) -> Result<Self, IdentityError> {
        let secret = MemberSecret::open(dir, secret)?;
        let path = dir.join(ID_FILE);
        let known = read_kept(&path, valid, |id| format!("not a cluster id: {id:?}"))?;
        Ok(Self {
            path,
            secret,
            known: RwLock::new(known),
            logged: Mutex::new(HashSet::new()),
        })
    }

    /// The id, once this broker knows it.
    pub fn known(&self) -> Option<String> {
        self.known.read().clone()
    }

    /// Takes `id`, the one the metadata names: written durably to the id file before it is
    /// used, so that a broker never forgets which cluster it joined. Refused when this broker
    /// keeps another. Blocking (an fsync, the first time); called by the metadata's state
    /// machine only, one call at a time, so the file is written outside the lock that every
    /// message's check takes.
    pub fn adopt(&self, id: &str) -> Result<(), IdentityError> {
        match self.known() {
            Some(mine) if mine == id => return Ok(()),
            Some(mine) => {
                return Err(IdentityError::Conflict {
                    mine,
                    theirs: id.to_owned(),
                    path: self.path.clone(),
                });
            }
            None => {}
        }
        if !valid(id) {
            return Err(IdentityError::Storage {
                path: self.path.clone(),
                reason: format!("the metadata names no valid cluster id: {id:?}"),
            });
        }
        let line = format!("{id}\n");
        replace_durably(&OsFs, &self.path, line.as_bytes()).map_err(|e| {
            IdentityError::Storage {
                path: self.path.clone(),
                reason: e.to_string(),
            }
        })?;
        tracing::info!(cluster = id, "this broker belongs to cluster {id}");
        *self.known.write() = Some(id.to_owned());
        Ok(())
    }

    /// The members' secret.
    pub fn secret(&self) -> &MemberSecret {
        &self.secret
    }

    /// Whether a message naming `theirs` (its header, if any) is taken: refused when this
    /// broker knows its id and the message names another, or none (a broker that knows none
    /// yet, a cluster forming or a broker just added, takes any).
    pub fn check(&self, theirs: Option<&str>) -> Result<(), Refusal> {
        match (self.known.read().as_deref(), theirs) {
            (Some(mine), Some(theirs)) if mine != theirs => Err(Refusal::OtherCluster {
                mine: mine.to_owned(),
                theirs: theirs.to_owned(),
            }),
            (Some(_), None) => Err(Refusal::NotMember("the message names no cluster")),
            _ => Ok(()),
        }
    }

    /// Whether an internal request with `headers` is a member's of this cluster: the cluster's
    /// id first (another cluster's broker is told so, and the id is no secret: `GET
    /// /mmmq/cluster` shows it), then the members' secret (a client's token never passes). A
    /// header that is not text names no cluster this broker could belong to.
    pub fn admit(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let theirs = headers
            .get(CLUSTER_HEADER)
            .map(|v| v.to_str().unwrap_or("(not text)"));
        let admitted = self.secret.admits(headers);
        match self.check(theirs) {
            // A member that has the secret but has not applied the id yet (it was committed
            // while it lagged): its votes must count, or a cluster that just formed could be
            // left without a leader.
            Err(Refusal::NotMember(_)) if admitted && self.secret.known().is_some() => {}
            checked => checked?,
        }
        if !admitted {
            return Err(Refusal::NotMember("without the members' secret"));
        }
        Ok(())
    }

    /// Logs a refusal of another cluster once per cluster (its sender retries every few
    /// hundred ms); a non-member's at debug level (counted by the guard's answer, not logged
    /// at every probe).
    fn log_once(&self, refusal: &Refusal) {
        match refusal {
            Refusal::OtherCluster { mine, theirs } => {
                let mut logged = self.logged.lock();
                if logged.len() < LOGGED_FOREIGN && logged.insert(theirs.clone()) {
                    tracing::warn!(
                        %mine,
                        %theirs,
                        "refusing the Raft messages of another cluster: {refusal}"
                    );
                }
            }
            Refusal::NotMember(_) => tracing::debug!("{refusal}"),
        }
    }
}

impl Identity {
    /// [`Identity::open`] off the executor, for [`Cluster::start`].
    pub(super) async fn load(
        dir: &Path,
        secret: Option<String>,
    ) -> Result<Arc<Self>, ClusterError> {
        let dir = dir.to_owned();
        tokio::task::spawn_blocking(move || Identity::open_with(&dir, secret.as_deref()))
            .await
            .map_err(|e| ClusterError::Failed(e.to_string()))?
            .map(Arc::new)
            .map_err(|e| ClusterError::Failed(e.to_string()))
    }
}

impl Cluster {
    /// Proposes the cluster's id: the one this broker keeps if it has one (its metadata was
    /// lost), else a new one. Applied, it is taken by every broker as its metadata reaches it.
    pub(super) async fn name_cluster(&self) -> Result<(), ClusterError> {
        let id = match self.cluster_id() {
            Some(id) => id,
            None => new_id().map_err(|e| ClusterError::Failed(e.to_string()))?,
        };
        match self.propose(MetaCommand::SetClusterId { id }).await? {
            // Refused: another broker's id was applied first.
            MetaOutcome::Done | MetaOutcome::Refused(_) => Ok(()),
            MetaOutcome::TopicExists | MetaOutcome::Each(_) => {
                unreachable!("not a topic or positions command")
            }
        }
    }

    /// Proposes the members' secret (docs/cluster.md, "Who may speak for the cluster"): this
    /// broker's if it has one (`--cluster-secret-file`, or the metadata was lost), else a new
    /// one; the first applied stays. A cluster formed before there were secrets gets one too.
    pub(super) async fn give_secret(&self) -> Result<(), ClusterError> {
        let secret = match self.inner.router.identity().secret().known() {
            Some(secret) => secret,
            None => new_secret().map_err(|e| ClusterError::Failed(e.to_string()))?,
        };
        let secret = super::secret::SecretText(secret);
        match self
            .propose(MetaCommand::SetMemberSecret { secret })
            .await?
        {
            MetaOutcome::Done | MetaOutcome::Refused(_) => Ok(()),
            MetaOutcome::TopicExists | MetaOutcome::Each(_) => {
                unreachable!("not a topic or positions command")
            }
        }
    }
}

/// What a file of `{root}/cluster/` keeps (the id, the members' secret): its first line, trimmed,
/// `None` when there is no file, an error naming the file when it holds something `valid`
/// refuses (`why` says what, without echoing a secret).
pub(super) fn read_kept(
    path: &Path,
    valid: fn(&str) -> bool,
    why: impl FnOnce(&str) -> String,
) -> Result<Option<String>, IdentityError> {
    match std::fs::read_to_string(path) {
        Ok(text) if valid(text.trim()) => Ok(Some(text.trim().to_owned())),
        Ok(text) => Err(IdentityError::Storage {
            path: path.to_owned(),
            reason: why(text.trim()),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(IdentityError::Storage {
            path: path.to_owned(),
            reason: e.to_string(),
        }),
    }
}

/// A new cluster's id: 128 random bits, in hex.
pub fn new_id() -> io::Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| io::Error::other(format!("no randomness: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A new members' secret: 256 random bits, in hex.
pub fn new_secret() -> io::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| io::Error::other(format!("no randomness: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// An id goes in a header and a file: a few printable characters, no spaces.
fn valid(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// The guard of `/mmmq/internal/*`: a request that is not a member's is answered `403`; one
/// naming another cluster than this broker's `409` with why, and the refusing broker's id in
/// [`CLUSTER_HEADER`] (which tells its sender this is a refusal of its cluster, not another
/// conflict).
pub async fn guard(
    State(identity): State<Arc<Identity>>,
    request: Request,
    next: Next,
) -> Response {
    match identity.admit(request.headers()) {
        Ok(()) => next.run(request).await,
        Err(refusal) => {
            identity.log_once(&refusal);
            match &refusal {
                Refusal::OtherCluster { mine, .. } => (
                    StatusCode::CONFLICT,
                    [(CLUSTER_HEADER, mine.clone())],
                    refusal.to_string(),
                )
                    .into_response(),
                Refusal::NotMember(_) => {
                    (StatusCode::FORBIDDEN, refusal.to_string()).into_response()
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "identity_tests.rs"]
mod tests;
