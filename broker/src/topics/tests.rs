//! The registry's own tests: what a delete leaves behind.
use super::*;
use crate::storage::OsFs;
use mmmq_core::ConsumerId;

/// A checkpoint write that comes after its topic's delete (a group's commit, a dispatcher's
/// last save racing the `DELETE`) is refused instead of creating the deleted directory
/// again, which the next boot opened as the topic come back.
#[tokio::test]
async fn a_checkpoint_write_after_the_delete_does_not_bring_the_topic_back() {
    let tmp = tempfile::tempdir().unwrap();
    let registry = Registry::restore(
        tmp.path().join("topics"),
        Arc::new(OsFs),
        LogConfig::default(),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let topic = Topic::new("t").unwrap();
    let t = registry.get_or_create(&topic).await.unwrap();
    let p = t.first();
    let id = ConsumerId::new("g").unwrap();
    p.checkpoints.nested("groups").write(&id, 1).unwrap();
    let gone = registry.begin_delete(&topic).await.unwrap();
    gone.close().await;
    registry.finish_delete(&gone).await.unwrap();
    assert!(!t.dir.exists());
    let late = p.checkpoints.nested("groups").write(&id, 2);
    assert!(
        matches!(late, Err(StorageError::Retired { .. })),
        "{late:?}"
    );
    assert!(matches!(
        p.checkpoints.write(&id, 2),
        Err(StorageError::Retired { .. })
    ));
    assert!(!t.dir.exists(), "the deleted directory came back");
    // The name is free, and its new incarnation has another id.
    let again = registry.get_or_create(&topic).await.unwrap();
    assert_ne!(again.id, t.id);
    assert_eq!(
        again
            .first()
            .checkpoints
            .nested("groups")
            .read(&id)
            .unwrap(),
        None
    );
}
