//! A Kafka commit's metadata string on a disk that fails (docs/storage.md, "Storage": the
//! `.metadata` file is written before the checkpoint): a commit that fails between the two
//! files, or at the first, leaves the offset and string acknowledged before it showing.

use std::sync::Arc;

use mmmq_core::{ConsumerId, Topic};
use tokio_util::sync::CancellationToken;

use super::commit::{read_committed, write_committed};
use crate::storage::vfs::fault::{FaultyFs, Op};
use crate::storage::{LogConfig, Vfs};
use crate::topics::{Partition, Registry};

async fn partition(fs: &FaultyFs, dir: &std::path::Path) -> Arc<Partition> {
    let vfs: Arc<dyn Vfs> = Arc::new(fs.clone());
    let registry = Registry::restore(
        dir.join("topics"),
        vfs,
        LogConfig::default(),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    registry
        .get_or_create(&Topic::new("t").unwrap())
        .await
        .unwrap()
        .first()
}

#[tokio::test]
async fn a_commit_cut_between_its_two_files_leaves_the_acknowledged_string() {
    let dir = tempfile::tempdir().unwrap();
    let fs = FaultyFs::new();
    let p = partition(&fs, dir.path()).await;
    let g = ConsumerId::new("g").unwrap();
    write_committed(&p, &g, 10, "first").unwrap();
    assert_eq!(read_committed(&p, &g).unwrap(), Some((10, "first".into())));
    // The metadata file is written, the checkpoint is not: the commit fails, and what shows is
    // what was acknowledged.
    fs.fail(Op::Write, "g.checkpoint", libc::EIO);
    assert!(write_committed(&p, &g, 20, "second").is_err());
    assert_eq!(read_committed(&p, &g).unwrap(), Some((10, "first".into())));
    // A restart reads the same.
    fs.clear();
    drop(p);
    let p = partition(&fs, dir.path()).await;
    assert_eq!(read_committed(&p, &g).unwrap(), Some((10, "first".into())));
    // The metadata file cannot be written: nothing changes either.
    fs.fail(Op::Write, "g.metadata", libc::EIO);
    assert!(write_committed(&p, &g, 30, "third").is_err());
    assert_eq!(read_committed(&p, &g).unwrap(), Some((10, "first".into())));
    fs.clear();
    // The next commit that works replaces both; one without a string shows none.
    write_committed(&p, &g, 40, "fourth").unwrap();
    assert_eq!(read_committed(&p, &g).unwrap(), Some((40, "fourth".into())));
    write_committed(&p, &g, 50, "").unwrap();
    assert_eq!(read_committed(&p, &g).unwrap(), Some((50, String::new())));
}
