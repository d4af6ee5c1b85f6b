//! Topic ids (docs/topics-and-groups.md, "Topics"): each incarnation of a topic has its own, so that what outlives
//! a delete — a group's offsets in memory, a plugin's emit origins, a consumer's exactly-once
//! record — is never taken for the new topic's, which starts again at offset 0.
//!
//! The id is in `topics/{topic}/topic.id` (its text form, Kafka's), written before the topic's
//! directory appears: the directory is made under a name no topic can have, with its id inside,
//! then renamed to the topic's in one durable step, so no crash leaves a new topic without its id. A topic made
//! before ids existed has no file and keeps, for its whole life, an id derived from its name
//! (its *legacy* id); every later incarnation of that name gets a random one.

use std::path::Path;

use mmmq_core::{Topic, TopicId};
use sha2::{Digest, Sha256};

use crate::storage::error::IoContext;
use crate::storage::vfs::{read_whole, replace_durably};
use crate::storage::{StorageError, Vfs};

/// The file holding a topic's id, in its directory.
pub const ID_FILE: &str = "topic.id";

/// The id of a topic made before topic ids: the same for every boot, and never the id of a
/// later incarnation (those are random).
pub fn legacy_id(topic: &str) -> TopicId {
    (0u32..)
        .map(|round| {
            let digest =
                Sha256::digest(format!("mmmq legacy topic id\0{round}\0{topic}").as_bytes());
            TopicId::from_bytes(digest[..16].try_into().expect("32 bytes"))
        })
        .find(usable)
        .expect("a usable digest comes within a few rounds")
}

/// Whether Kafka would issue this id: not all zeros (its "no topic id"), and not written with a
/// leading `-` (its tools take that for a flag). Kafka draws again until both hold; so do we.
fn usable(id: &TopicId) -> bool {
    id.as_bytes() != &[0; 16] && !id.to_string().starts_with('-')
}

/// The id of the topic in `dir`: its `topic.id`, or its legacy id when it has none. Blocking.
pub fn read(vfs: &dyn Vfs, dir: &Path, topic: &Topic) -> Result<TopicId, StorageError> {
    let path = dir.join(ID_FILE);
    match read_whole(vfs, &path)? {
        None => Ok(legacy_id(topic.as_str())),
        Some(bytes) => std::str::from_utf8(&bytes)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| StorageError::Inconsistent {
                path,
                reason: "not a topic id (22 characters of URL-safe base64)".into(),
            }),
    }
}

/// Names a topic's directory staged beside the topics (not a topic name: `~` is not allowed in
/// one), removed at boot if a crash left it.
pub const STAGING_PREFIX: &str = ".staging~";

/// Makes the directory `dir` of a new topic, holding a new random id, atomically: staged beside
/// it under [`STAGING_PREFIX`] (what a crash leaves there is removed at boot) and renamed into
/// place. Blocking.
pub fn create(vfs: &dyn Vfs, dir: &Path) -> Result<TopicId, StorageError> {
    create_with(vfs, dir, None)
}

/// A new random id, as Kafka draws them.
pub fn random() -> Result<TopicId, StorageError> {
    loop {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(|e| StorageError::Inconsistent {
            path: Path::new("topic.id").to_owned(),
            reason: format!("no randomness for a topic id: {e}"),
        })?;
        let id = TopicId::from_bytes(bytes);
        if usable(&id) {
            return Ok(id);
        }
    }
}

/// As [`create`], with the id given (a cluster's topic has the id its metadata gave it, the
/// same on every broker); a random one when `None`.
pub fn create_with(
    vfs: &dyn Vfs,
    dir: &Path,
    id: Option<TopicId>,
) -> Result<TopicId, StorageError> {
    let id = match id {
        Some(id) => id,
        None => random().map_err(|e| match e {
            StorageError::Inconsistent { reason, .. } => StorageError::Inconsistent {
                path: dir.to_owned(),
                reason,
            },
            other => other,
        })?,
    };
    let parent = dir.parent().unwrap_or(Path::new("."));
    let staged = parent.join(format!("{STAGING_PREFIX}{id}"));
    replace_durably(vfs, &staged.join(ID_FILE), id.to_string().as_bytes())?;
    vfs.rename(&staged, dir).at(dir)?;
    vfs.sync_dir(parent).at(parent)?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_topic_gets_a_random_id_in_its_directory_and_an_old_one_its_legacy_id() {
        let tmp = tempfile::tempdir().unwrap();
        let vfs = crate::storage::OsFs;
        let topic = Topic::new("t").unwrap();
        let dir = tmp.path().join("topics/t");
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(read(&vfs, &dir, &topic).unwrap(), legacy_id("t"));
        assert_ne!(legacy_id("t"), legacy_id("u"));
        std::fs::remove_dir(&dir).unwrap();
        let a = create(&vfs, &dir).unwrap();
        assert_eq!(read(&vfs, &dir, &topic).unwrap(), a);
        assert_eq!(
            std::fs::read_to_string(dir.join(ID_FILE)).unwrap(),
            a.to_string()
        );
        let names: Vec<_> = std::fs::read_dir(tmp.path().join("topics"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["t"], "nothing staged is left");
        std::fs::remove_dir_all(&dir).unwrap();
        let b = create(&vfs, &dir).unwrap();
        assert_ne!(a, b);
        assert_ne!(b, legacy_id("t"));
        for id in [a, b, legacy_id("t")] {
            assert!(usable(&id), "{id}");
        }
        assert!(!usable(&TopicId::from_bytes([0; 16])));
        assert!(
            !usable(&TopicId::from_bytes([0xfb; 16])),
            "written with a leading '-'"
        );
    }
}
