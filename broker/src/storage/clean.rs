//! The clean-shutdown marker, `{root-dir}/.clean-shutdown`: written durably when the broker stops
//! cleanly, removed durably at the start of the next boot. Its presence lets recovery skip the
//! full check of each tail segment (see [`super::scan::TailCheck`]), as Kafka skips log recovery
//! after a clean shutdown; its absence — a crash, a power cut, a first boot — means a full check.
//! Removing it before anything else happens means a crash during that boot is again unclean.

use std::path::Path;

use super::error::{IoContext, StorageError};
use super::scan::TailCheck;
use super::vfs::{OpenMode, Vfs};

/// The marker's file name in the root dir.
pub const MARKER: &str = ".clean-shutdown";

/// Whether the last stop was clean; removes the marker (durably) so the answer holds only once.
/// Blocking.
pub fn take(vfs: &dyn Vfs, root: &Path) -> Result<TailCheck, StorageError> {
    let marker = root.join(MARKER);
    if !vfs.exists(&marker) {
        return Ok(TailCheck::Full);
    }
    vfs.remove_file(&marker).at(&marker)?;
    vfs.sync_dir(root).at(root)?;
    Ok(TailCheck::Quick)
}

/// Records a clean stop: nothing is being written any more. Blocking.
pub fn mark(vfs: &dyn Vfs, root: &Path) -> Result<(), StorageError> {
    let marker = root.join(MARKER);
    let file = vfs.open(&marker, OpenMode::CreateTruncate).at(&marker)?;
    file.sync_data().at(&marker)?;
    drop(file);
    vfs.sync_dir(root).at(root)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::vfs::sim::{CutMode, SimFs};

    #[test]
    fn a_mark_survives_a_power_cut_and_is_taken_once() {
        let fs = SimFs::new();
        let root = Path::new("/sim");
        fs.mkdir_durable(root);
        assert_eq!(take(&fs, root).unwrap(), TailCheck::Full, "first boot");
        mark(&fs, root).unwrap();
        fs.power_cut(1, CutMode::SyncedOnly);
        assert_eq!(take(&fs, root).unwrap(), TailCheck::Quick);
        // Taken durably: a crash during this boot makes the next one unclean.
        fs.power_cut(2, CutMode::SyncedOnly);
        assert_eq!(take(&fs, root).unwrap(), TailCheck::Full);
    }
}
