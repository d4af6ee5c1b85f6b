//! openraft's own storage test suite on the segment store and the partition's state machine,
//! each built in a directory of its own.

use std::sync::Arc;

use openraft::StorageError;
use openraft::testing::log::{StoreBuilder, Suite};

use super::SegmentLogStore;
use crate::cluster::machine::PartitionMachine;
use crate::cluster::types::{GroupKind, Raft};
use crate::storage::{LogConfig, OsFs};

struct Builder;

impl StoreBuilder<Raft, SegmentLogStore, PartitionMachine, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, SegmentLogStore, PartitionMachine), StorageError<Raft>> {
        let tmp = tempfile::tempdir().expect("a temporary directory");
        let config = LogConfig {
            segment_max_bytes: 256,
            ..LogConfig::default()
        };
        let store = SegmentLogStore::open(tmp.path(), Arc::new(OsFs), config, GroupKind::Partition)
            .await
            .expect("the store opens");
        let machine = PartitionMachine::open(&store)
            .await
            .expect("the state machine opens");
        Ok((tmp, store, machine))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn openraft_storage_suite_passes_on_the_segment_store() {
    Suite::test_all(Builder).await.unwrap();
}
