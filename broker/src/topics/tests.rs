//! The registry's own tests: what a delete leaves behind, and the partition cap under races.
use super::*;
use crate::storage::OsFs;
use mmmq_core::ConsumerId;

/// A registry of the topics in `{root}/topics`, with the default log configuration.
async fn restore(root: &Path) -> Registry {
    Registry::restore(
        root.join("topics"),
        Arc::new(OsFs),
        LogConfig::default(),
        CancellationToken::new(),
    )
    .await
    .unwrap()
}

/// A checkpoint write that comes after its topic's delete (a group's commit, a dispatcher's
/// last save racing the `DELETE`) is refused instead of creating the deleted directory
/// again, which the next boot opened as the topic come back.
#[tokio::test]
async fn a_checkpoint_write_after_the_delete_does_not_bring_the_topic_back() {
    let tmp = tempfile::tempdir().unwrap();
    let registry = restore(tmp.path()).await;
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

/// `--max-partitions` counts partitions over all topics, also while different topics grow at
/// the same time (each under its own topic's lock only): of eight topics growing from 1 to 4
/// partitions at once with room for 12 more, exactly four grow, and the others are refused
/// before anything of theirs is created or stored. A dead-letter topic is made even at the cap
/// (and counts); a delete gives its partitions back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_growth_never_passes_the_partition_cap() {
    let tmp = tempfile::tempdir().unwrap();
    let registry = restore(tmp.path()).await.with_max_partitions(20);
    let registry = Arc::new(registry);
    let mut topics = Vec::new();
    for i in 0..8 {
        topics.push(
            registry
                .get_or_create(&Topic::new(format!("t{i}")).unwrap())
                .await
                .unwrap(),
        );
    }
    assert_eq!(registry.partition_usage(), (8, 20));
    let grows = topics.iter().map(|t| {
        let (registry, t) = (registry.clone(), t.clone());
        tokio::spawn(async move {
            let config = TopicConfig {
                partitions: 4,
                ..TopicConfig::default()
            };
            registry.set_config(&t, config).await
        })
    });
    let results = futures_util::future::join_all(grows).await;
    let mut grown = 0;
    for (t, result) in topics.iter().zip(results) {
        match result.unwrap() {
            Ok(()) => {
                assert_eq!(t.partition_count(), 4);
                grown += 1;
            }
            Err(e) => {
                assert!(
                    matches!(
                        e,
                        StorageError::TopicLimit {
                            limit: Limit::Partitions {
                                max: 20,
                                asked: 3,
                                ..
                            },
                            grown: true,
                            ..
                        }
                    ),
                    "{e:?}"
                );
                assert_eq!(t.partition_count(), 1);
                assert!(t.config.read().is_none(), "a refused growth stored nothing");
                assert!(!t.dir.join(partition::PARTITIONS_DIR).exists());
            }
        }
    }
    assert_eq!(grown, 4);
    let total: u32 = registry.all().iter().map(|t| t.partition_count()).sum();
    assert_eq!((total, registry.partition_usage()), (20, (20, 20)));

    let refused = registry
        .get_or_create(&Topic::new("one-more").unwrap())
        .await
        .unwrap_err();
    assert_eq!(
        refused.to_string(),
        "partition limit reached: this broker holds 20 partitions over all topics, and 1 more \
         would pass its maximum of 20 (mmmq serve --max-partitions); \"one-more\" was not created"
    );
    assert!(registry.get(&Topic::new("one-more").unwrap()).is_none());
    registry
        .get_or_create(&Topic::new("__dlq.d").unwrap())
        .await
        .unwrap();
    assert_eq!(registry.partition_usage(), (21, 20));
    let gone = registry.begin_delete(&topics[0].topic).await.unwrap();
    assert_eq!(
        registry.partition_usage().0,
        21 - gone.partition_count() as usize
    );
}
