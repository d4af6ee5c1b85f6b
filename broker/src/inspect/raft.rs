//! `mmmq inspect` of a clustered partition's `raft/` files (docs/cluster.md, "Clustered
//! partitions on disk"): the vote, the purge point, the entries that carry no message, and the
//! state machine's applied state and snapshot. Read-only, like the rest of the inspection.

use std::io::Write;
use std::path::Path;

use super::{InspectError, Summary};
use crate::cluster::log_store::{ENTRIES, PURGED, PurgeFile, VOTE, Vote, parse_sidecar};
use crate::cluster::machine::{APPLIED, PartitionSnapshot, SNAPSHOT};
use crate::storage::vfs::{self, Vfs};

/// A small JSON file of `raft/`: its value, `None` if absent, or why it does not read (counted
/// as an inconsistency).
fn json<T: serde::de::DeserializeOwned>(
    vfs: &dyn Vfs,
    path: &Path,
    out: &mut dyn Write,
    summary: &mut Summary,
) -> Result<Option<T>, InspectError> {
    let Some(raw) = vfs::read_whole(vfs, path)? else {
        return Ok(None);
    };
    match serde_json::from_slice(&raw) {
        Ok(v) => Ok(Some(v)),
        Err(e) => {
            summary.inconsistencies += 1;
            writeln!(out, "  ! {}: {e}", path.display())?;
            Ok(None)
        }
    }
}

/// Lists what `raft_dir` holds.
pub(super) fn inspect(
    vfs: &dyn Vfs,
    raft_dir: &Path,
    out: &mut dyn Write,
    summary: &mut Summary,
) -> Result<(), InspectError> {
    writeln!(
        out,
        "  raft/ (a clustered partition: each entry above shows its Raft term and index)"
    )?;
    if let Some(vote) = json::<Vote>(vfs, &raft_dir.join(VOTE), out, summary)? {
        writeln!(out, "    vote: {vote}")?;
    }
    if let Some(p) = json::<PurgeFile>(vfs, &raft_dir.join(PURGED), out, summary)? {
        writeln!(
            out,
            "    purged up to {} (the next message at offset {})",
            p.log_id, p.next_offset
        )?;
    }
    if let Some(s) = json::<PartitionSnapshot>(vfs, &raft_dir.join(APPLIED), out, summary)? {
        writeln!(
            out,
            "    state machine: applied up to {}, next offset {}",
            display(&s.last_log_id),
            s.next_offset
        )?;
    }
    if let Some(s) = json::<serde_json::Value>(vfs, &raft_dir.join(SNAPSHOT), out, summary)? {
        let next = &s["data"]["nextOffset"];
        writeln!(out, "    snapshot: next offset {next}")?;
    }
    let path = raft_dir.join(ENTRIES);
    let raw = vfs::read_whole(vfs, &path)?.unwrap_or_default();
    match parse_sidecar(&raw) {
        Ok(parsed) => {
            writeln!(
                out,
                "    {} entr(ies) without a message (raft/entries)",
                parsed.entries.len()
            )?;
            for e in &parsed.entries {
                writeln!(
                    out,
                    "    {:>12} {:>8}  {}",
                    e.log_id.index, e.log_id.leader_id.term, e.payload
                )?;
            }
            if parsed.end < raw.len() as u64 {
                writeln!(
                    out,
                    "  note: {} byte(s) of raft/entries after its last complete record were never acknowledged (recovery cuts them)",
                    raw.len() as u64 - parsed.end
                )?;
            }
        }
        Err(reason) => {
            summary.inconsistencies += 1;
            writeln!(out, "  ! {}: {reason}", path.display())?;
        }
    }
    Ok(())
}

fn display(id: &Option<crate::cluster::types::LogId>) -> String {
    id.map_or("nothing".to_owned(), |id| id.to_string())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use openraft::entry::RaftEntry;
    use openraft::storage::{IOFlushed, RaftLogStorage};
    use openraft::type_config::TypeConfigExt;

    use crate::cluster::log_store::{SegmentLogStore, log_id as id};
    use crate::cluster::types::{Command, GroupKind, Raft};
    use crate::inspect::{self, Entry, InspectOptions};
    use crate::storage::vfs::Vfs;
    use crate::storage::{LogConfig, OsFs};

    #[tokio::test(flavor = "multi_thread")]
    async fn a_clustered_partition_lists_its_entries_without_a_message_and_its_vote() {
        let tmp = tempfile::tempdir().unwrap();
        let vfs: Arc<dyn Vfs> = Arc::new(OsFs);
        let mut store = SegmentLogStore::open(
            tmp.path(),
            vfs.clone(),
            LogConfig::default(),
            GroupKind::Partition,
        )
        .await
        .unwrap();
        store.save_vote(&openraft::Vote::new(4, 2)).await.unwrap();
        let message = br#"{"timestamp":1,"key":null,"content":"hi"}"#;
        let entries = vec![
            RaftEntry::new_blank(id(4, 1)),
            RaftEntry::new_normal(
                id(4, 2),
                Command::Message(bytes::Bytes::from_static(message)),
            ),
        ];
        let (tx, rx) = Raft::oneshot();
        store.append(entries, IOFlushed::signal(tx)).await.unwrap();
        rx.await.unwrap().unwrap();
        store.close().await.unwrap();
        let mut out = Vec::new();
        let summary = inspect::run(&vfs, tmp.path(), &InspectOptions::default(), &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(summary.is_clean(), "{out}");
        assert_eq!(summary.entries, 1, "one message, one offset: {out}");
        let row = format!("{:>8} {:>12} {}", 4, 2, String::from_utf8_lossy(message));
        assert!(out.contains(&row), "{out}");
        assert!(out.contains("vote: "), "{out}");
        assert!(out.contains("1 entr(ies) without a message"), "{out}");
        assert!(out.contains(&format!("{:>12} {:>8}  blank", 1, 4)), "{out}");
        // What `mmmq plugin replay` reads: the message, without its log id.
        assert_eq!(
            inspect::read_entry(&*vfs, tmp.path(), 0).unwrap(),
            Entry::Payload(message.to_vec())
        );
        // A damaged sidecar record that sound ones follow is reported.
        let path = tmp.path().join("raft/entries");
        let mut raw = std::fs::read(&path).unwrap();
        let good = raw.clone();
        raw.extend_from_slice(&good);
        raw[10] ^= 0x20;
        std::fs::write(&path, &raw).unwrap();
        let mut out = Vec::new();
        let summary = inspect::run(&vfs, tmp.path(), &InspectOptions::default(), &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(!summary.is_clean(), "{out}");
        assert!(out.contains("sound records follow it"), "{out}");
    }
}
