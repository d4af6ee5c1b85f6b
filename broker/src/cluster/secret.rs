//! The members' secret (docs/cluster.md, "Who may speak for the cluster"): what makes a request
//! to `/mmmq/internal/*` a member's. A client's token never does: every producer has that one,
//! and with it could replace a group's voters or write into the metadata.
//!
//! The secret is drawn by the broker that names the cluster and replicated in the metadata with
//! its id (or given to every broker by `--cluster-secret-file`, which also covers the seconds
//! while a cluster forms). Each member keeps it in `{root}/cluster/secret` (mode 0600) and
//! presents it on every internal request ([`MEMBER_HEADER`]); a broker that knows it refuses
//! every internal request without it. A broker that knows none yet (a cluster forming, a broker
//! just added, before its metadata reached it) has nothing to guard and takes what comes: the
//! metadata it is sent is how it learns the secret.
//!
//! The secret travels in the clear without TLS, as every message between brokers does; on a
//! network that others can read, brokers talk TLS (contract §16).

use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use axum::http::HeaderMap;
use parking_lot::RwLock;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::identity::IdentityError;

/// The header every internal request carries once its sender knows the secret.
pub const MEMBER_HEADER: &str = "x-mmmq-member";

/// The file, in `{root}/cluster/`, that keeps the secret once this broker learnt it.
const SECRET_FILE: &str = "secret";

/// Shortest secret accepted from `--cluster-secret-file`: 128 bits as hex.
pub const MIN_SECRET_LEN: usize = 32;

/// Longest secret (it goes in a header).
const MAX_SECRET_LEN: usize = 256;

/// The secret as the metadata holds it: its `Debug` never shows it (commands and states are
/// logged at debug level).
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct SecretText(pub String);

impl std::fmt::Debug for SecretText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretText(…)")
    }
}

#[derive(Clone)]
struct Known {
    text: String,
    digest: [u8; 32],
}

impl Known {
    fn new(text: &str) -> Self {
        Self {
            text: text.to_owned(),
            digest: Sha256::digest(text.as_bytes()).into(),
        }
    }
}

/// This broker's copy of the secret, as far as it has one.
pub struct MemberSecret {
    path: PathBuf,
    /// Given by `--cluster-secret-file`: the metadata's is then not taken (a different one is a
    /// misconfiguration, logged).
    explicit: bool,
    known: RwLock<Option<Known>>,
}

impl std::fmt::Debug for MemberSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret itself: this may end up in a log.
        f.debug_struct("MemberSecret")
            .field("known", &self.known.read().is_some())
            .field("explicit", &self.explicit)
            .finish()
    }
}

/// Whether `secret` may be one: printable ASCII without spaces, of a length a header carries.
pub fn valid(secret: &str) -> bool {
    (1..=MAX_SECRET_LEN).contains(&secret.len()) && secret.bytes().all(|b| b.is_ascii_graphic())
}

impl MemberSecret {
    /// The secret given (`--cluster-secret-file`'s first line), or the one kept in `dir`
    /// (`{root}/cluster`), if any. Blocking.
    pub fn open(dir: &Path, given: Option<&str>) -> Result<Self, IdentityError> {
        let path = dir.join(SECRET_FILE);
        // The metadata's snapshots and log hold the secret too: the directory is this user's.
        if dir.is_dir() {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        }
        if let Some(given) = given {
            return Ok(Self {
                path,
                explicit: true,
                known: RwLock::new(Some(Known::new(given))),
            });
        }
        let known = super::identity::read_kept(&path, valid, |_| "not a cluster secret".into())?
            .map(|text| Known::new(&text));
        Ok(Self {
            path,
            explicit: false,
            known: RwLock::new(known),
        })
    }

    /// The secret, once known: what this broker presents, and what the metadata is given when
    /// this broker names the cluster.
    pub fn known(&self) -> Option<String> {
        self.known.read().as_ref().map(|k| k.text.clone())
    }

    /// Takes the metadata's secret: kept durably (0600) before it is used, so that a restart
    /// guards from its first request. A broker given its own keeps that one. Blocking.
    pub fn adopt(&self, secret: &str) -> Result<(), IdentityError> {
        if let Some(mine) = self.known() {
            if mine != secret {
                // Never fatal: the metadata must still apply. Its members refuse this one.
                tracing::error!(
                    "the cluster's metadata holds another members' secret than this broker's \
                     --cluster-secret-file: give every broker the same file"
                );
            }
            return Ok(());
        }
        if !valid(secret) {
            return Err(IdentityError::Storage {
                path: self.path.clone(),
                reason: "the metadata holds no valid members' secret".into(),
            });
        }
        // Guarding from now on, whether or not the file can be written: a broker that could
        // not keep it would otherwise take anyone's requests until its restart.
        *self.known.write() = Some(Known::new(secret));
        tracing::info!("this broker holds the members' secret of its cluster");
        write_private(&self.path, secret).map_err(|e| IdentityError::Storage {
            path: self.path.clone(),
            reason: e.to_string(),
        })
    }

    /// Whether a request with `headers` is a member's: always when this broker knows no secret
    /// (it has nothing to guard yet), else only with the secret, compared in constant time.
    pub fn admits(&self, headers: &HeaderMap) -> bool {
        let Some(known) = &*self.known.read() else {
            return true;
        };
        let given = headers
            .get(MEMBER_HEADER)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        let given: [u8; 32] = Sha256::digest(given).into();
        given.ct_eq(&known.digest).into()
    }
}

/// Reads `--cluster-secret-file`: its first line, checked.
pub fn read_secret_file(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--cluster-secret-file {}: {e}", path.display()))?;
    let secret = text.lines().next().unwrap_or_default().trim();
    if secret.len() < MIN_SECRET_LEN || !valid(secret) {
        return Err(format!(
            "--cluster-secret-file {}: its first line must be {MIN_SECRET_LEN} to {MAX_SECRET_LEN} \
             printable characters without spaces (make one with `mmmq cluster secret`)",
            path.display()
        ));
    }
    Ok(secret.to_owned())
}

/// Writes `secret` to `path` readable by this user only, durably (a temporary file renamed over
/// it, then the directory synced).
fn write_private(path: &Path, secret: &str) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    writeln!(file, "{secret}")?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn with(secret: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(s) = secret {
            h.insert(MEMBER_HEADER, s.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_broker_that_knows_the_secret_admits_only_requests_that_carry_it() {
        let tmp = tempfile::tempdir().unwrap();
        let secret = MemberSecret::open(tmp.path(), None).unwrap();
        assert!(secret.admits(&with(None)), "nothing to guard yet");
        secret.adopt("s3cret-s3cret").unwrap();
        assert!(secret.admits(&with(Some("s3cret-s3cret"))));
        assert!(!secret.admits(&with(None)));
        assert!(!secret.admits(&with(Some("s3cret-s3cre"))));
        assert!(!secret.admits(&with(Some("other"))));
    }

    #[test]
    fn the_secret_is_kept_private_and_survives_a_restart_and_a_given_one_wins() {
        let tmp = tempfile::tempdir().unwrap();
        MemberSecret::open(tmp.path(), None)
            .unwrap()
            .adopt("from-the-metadata")
            .unwrap();
        let file = tmp.path().join(SECRET_FILE);
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        let again = MemberSecret::open(tmp.path(), None).unwrap();
        assert_eq!(again.known().as_deref(), Some("from-the-metadata"));
        let given = MemberSecret::open(tmp.path(), Some("given-by-the-operator")).unwrap();
        given.adopt("from-the-metadata").unwrap();
        assert_eq!(given.known().as_deref(), Some("given-by-the-operator"));
        assert!(!given.admits(&with(Some("from-the-metadata"))));
    }

    #[test]
    fn a_command_that_gives_the_secret_never_shows_it() {
        let command = crate::cluster::meta_state::MetaCommand::SetMemberSecret {
            secret: SecretText("do-not-log-me".into()),
        };
        let entry =
            crate::cluster::types::Command::Meta(serde_json::to_vec(&command).unwrap().into());
        for shown in [
            format!("{entry}"),
            format!("{entry:?}"),
            format!("{command:?}"),
        ] {
            assert!(!shown.contains("do-not-log-me"), "{shown}");
        }
    }

    #[test]
    fn a_secret_file_must_hold_a_long_enough_secret() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("s");
        std::fs::write(&path, "short\n").unwrap();
        assert!(read_secret_file(&path).unwrap_err().contains("first line"));
        let long = "a".repeat(MIN_SECRET_LEN);
        std::fs::write(&path, format!("{long}\nignored\n")).unwrap();
        assert_eq!(read_secret_file(&path).unwrap(), long);
    }
}
