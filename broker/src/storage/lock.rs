//! One process per root dir (contract §1; docs/storage.md, "Storage").
//!
//! Two brokers on one root dir would each append at the offsets the other already acknowledged:
//! every write of one silently destroys the other's. So a broker holds an OS lock (`flock`, by
//! [`std::fs::File::try_lock`]) on `{root}/.lock` for as long as it runs. The kernel releases it
//! when the process ends, however it ends, so a crash never leaves a stale lock behind; the PID
//! written into the file only names the holder in the second process's error.
//!
//! The lock is taken before anything else touches the root dir: a refused process has created,
//! truncated or renamed nothing (the lock file itself is only opened, never truncated, until the
//! lock is held).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The lock file's name in a root dir.
pub const LOCK_FILE: &str = ".lock";

/// Why a root dir could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds the root dir.
    #[error(
        "{root} is in use by another mmmq process ({holder}); one broker per root dir: stop it or choose another --root-dir",
        holder = match pid { Some(pid) => format!("PID {pid}"), None => "PID unknown".to_owned() }
    )]
    Held {
        /// The root dir.
        root: PathBuf,
        /// The holder's PID, as it wrote it into the lock file.
        pid: Option<u32>,
    },
    /// The lock file could not be opened or locked.
    #[error("cannot lock {path}: {error}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// What the OS said.
        error: io::Error,
    },
}

/// A held root dir. Dropping it (or the process ending) releases the lock.
#[derive(Debug)]
pub struct RootLock {
    /// The open file the lock is on: closing it is what releases the lock.
    _file: File,
    path: PathBuf,
}

impl RootLock {
    /// Takes the lock on `root` (creating the directory if it does not exist yet), or says who
    /// holds it. Never waits: a second broker must fail at once, not hang until the first stops.
    pub fn acquire(root: &Path) -> Result<Self, LockError> {
        let path = root.join(LOCK_FILE);
        let io = |error| LockError::Io {
            path: path.clone(),
            error,
        };
        std::fs::create_dir_all(root).map_err(io)?;
        // Opened without truncation: the holder's PID must still be readable if we lose.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(LockError::Held {
                    root: root.to_owned(),
                    pid: read_pid(&mut file),
                });
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        // Ours now: the PID is for the error message of whoever tries next.
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(Self { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_a_root_dir_is_refused_with_the_holders_pid_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = RootLock::acquire(dir.path()).unwrap();
        // flock belongs to the open file, so a second open in this process conflicts as another
        // process's would.
        match RootLock::acquire(dir.path()) {
            Err(LockError::Held { root, pid }) => {
                assert_eq!(root, dir.path());
                assert_eq!(pid, Some(std::process::id()));
            }
            other => panic!("expected Held, got {other:?}"),
        }
        drop(first);
        RootLock::acquire(dir.path()).expect("released by the drop");
    }

    #[test]
    fn the_refusal_names_the_root_dir_and_the_pid() {
        let err = LockError::Held {
            root: PathBuf::from("/data/mmmq"),
            pid: Some(4242),
        };
        let text = err.to_string();
        assert!(
            text.contains("/data/mmmq") && text.contains("PID 4242"),
            "{text}"
        );
    }
}
