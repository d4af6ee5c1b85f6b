//! Unit tests of the metadata's state (`meta_state.rs`): placement, replication factors,
//! removals and moves.

use super::*;

fn cluster(n: u64) -> MetaState {
    let mut s = MetaState::default();
    for id in 1..=n {
        let add = MetaCommand::AddBroker {
            id,
            addr: format!("127.0.0.1:{}", 9000 + id),
        };
        assert_eq!(s.apply(&add), MetaOutcome::Done);
    }
    s
}

fn put(s: &mut MetaState, name: &str, partitions: u32, rf: Option<u8>) -> MetaOutcome {
    s.apply(&MetaCommand::PutTopic {
        name: name.into(),
        config: serde_json::json!({ "partitions": partitions }),
        replication_factor: rf,
        id: (!s.topics.contains_key(name)).then(|| format!("id-of-{name}")),
    })
}

#[test]
fn placement_spreads_replicas_and_leaders_evenly() {
    let mut s = cluster(3);
    assert_eq!(put(&mut s, "a", 6, None), MetaOutcome::Done);
    assert_eq!(put(&mut s, "b", 3, None), MetaOutcome::Done);
    let mut replicas = BTreeMap::<BrokerId, usize>::new();
    let mut leaders = BTreeMap::<BrokerId, usize>::new();
    for t in s.topics.values() {
        assert_eq!(t.replication_factor, 3);
        for r in &t.placement {
            assert_eq!(
                r.iter().collect::<BTreeSet<_>>().len(),
                3,
                "distinct: {r:?}"
            );
            *leaders.entry(r[0]).or_default() += 1;
            for b in r {
                *replicas.entry(*b).or_default() += 1;
            }
        }
    }
    assert_eq!(replicas.values().copied().collect::<Vec<_>>(), [9, 9, 9]);
    assert_eq!(leaders.values().copied().collect::<Vec<_>>(), [3, 3, 3]);
}

#[test]
fn replication_factor_defaults_to_min_3_brokers_and_is_checked() {
    let mut s = cluster(5);
    put(&mut s, "t", 10, None);
    assert_eq!(s.topics["t"].replication_factor, 3);
    let mut leaders = BTreeMap::<BrokerId, usize>::new();
    for r in &s.topics["t"].placement {
        *leaders.entry(r[0]).or_default() += 1;
    }
    assert_eq!(
        leaders.values().copied().collect::<Vec<_>>(),
        [2, 2, 2, 2, 2]
    );
    assert!(matches!(
        put(&mut s, "x", 1, Some(6)),
        MetaOutcome::Refused(_)
    ));
    let mut two = cluster(2);
    assert!(matches!(put(&mut two, "x", 1, Some(3)), MetaOutcome::Refused(m) if m.contains("2")));
    put(&mut two, "y", 1, None);
    assert_eq!(two.topics["y"].replication_factor, 2);
}

#[test]
fn partitions_grow_keeping_placement_and_never_shrink() {
    let mut s = cluster(3);
    put(&mut s, "t", 2, None);
    let before = s.topics["t"].placement.clone();
    put(&mut s, "t", 4, None);
    assert_eq!(s.topics["t"].placement[..2], before[..]);
    assert_eq!(s.topics["t"].placement.len(), 4);
    assert!(matches!(put(&mut s, "t", 3, None), MetaOutcome::Refused(_)));
    assert_eq!(s.topics["t"].placement.len(), 4);
}

#[test]
fn a_removed_broker_id_is_never_reused_and_one_with_replicas_stays() {
    let mut s = cluster(3);
    put(&mut s, "t", 1, Some(2));
    let holder = s.topics["t"].placement[0][0];
    let idle = (1..=3)
        .find(|b| !s.topics["t"].placement[0].contains(b))
        .unwrap();
    let refused = s.apply(&MetaCommand::RemoveBroker { id: holder });
    assert!(matches!(refused, MetaOutcome::Refused(m) if m.contains("t/0")));
    assert_eq!(
        s.apply(&MetaCommand::RemoveBroker { id: idle }),
        MetaOutcome::Done
    );
    let again = MetaCommand::AddBroker {
        id: idle,
        addr: "x:1".into(),
    };
    assert!(matches!(s.apply(&again), MetaOutcome::Refused(_)));
    assert!(!s.brokers.contains_key(&idle));
}

#[test]
fn a_move_runs_the_group_on_both_sets_until_it_ends() {
    let mut s = cluster(4);
    put(&mut s, "t", 1, Some(3));
    let before = s.topics["t"].placement[0].clone();
    let spare = (1..=4).find(|b| !before.contains(b)).unwrap();
    let mut target = before.clone();
    let left = target.pop().unwrap();
    target.push(spare);
    let begin = |replicas: Vec<BrokerId>| MetaCommand::Reassign {
        topic: "t".into(),
        partition: 0,
        replicas,
    };
    for bad in [vec![1, 1, 2], vec![1, 2], vec![1, 2, 9]] {
        assert!(matches!(s.apply(&begin(bad)), MetaOutcome::Refused(_)));
    }
    assert_eq!(s.apply(&begin(target.clone())), MetaOutcome::Done);
    let t = &s.topics["t"];
    assert!(
        t.runs(0, spare) && t.runs(0, left),
        "both sets run the group"
    );
    assert!(t.initializes(0, left) && !t.initializes(0, spare));
    assert_eq!(s.replicas_on(spare), [("t".to_owned(), 0)]);
    // One move at a time: another target, or an end that is not this move's, is refused and
    // changes nothing; the same target again goes on.
    let other = vec![before[0], spare, left];
    let end_of = |replicas: Vec<BrokerId>| MetaCommand::FinishReassign {
        topic: "t".into(),
        partition: 0,
        replicas,
    };
    let state = s.clone();
    assert!(matches!(
        s.apply(&begin(other.clone())),
        MetaOutcome::Refused(_)
    ));
    assert!(matches!(s.apply(&end_of(other)), MetaOutcome::Refused(_)));
    assert_eq!(s, state);
    assert_eq!(s.apply(&begin(target.clone())), MetaOutcome::Done);
    let finish = MetaCommand::FinishReassign {
        topic: "t".into(),
        partition: 0,
        replicas: target.clone(),
    };
    assert_eq!(s.apply(&finish), MetaOutcome::Done);
    let t = &s.topics["t"];
    assert_eq!(t.placement[0], target);
    assert!(!t.runs(0, left) && t.moving.is_empty());
    assert!(
        !t.initializes(0, target[0]),
        "a moved group is never initialized again"
    );
    // The end sent again (its answer was lost) is done; another end is refused.
    assert_eq!(s.apply(&finish), MetaOutcome::Done);
    assert!(matches!(
        s.apply(&end_of(before.clone())),
        MetaOutcome::Refused(_)
    ));
}

#[test]
fn a_topic_created_again_is_a_new_incarnation() {
    let mut s = cluster(1);
    put(&mut s, "t", 1, None);
    let first = s.topics["t"].incarnation;
    s.apply(&MetaCommand::DeleteTopic { name: "t".into() });
    put(&mut s, "t", 1, None);
    assert_ne!(s.topics["t"].incarnation, first);
}

/// A proposer whose metadata lagged proposes to create a topic that exists: nothing of the
/// topic changes (a new topic's defaults would have overwritten its configuration).
#[test]
fn a_create_of_an_existing_topic_changes_nothing() {
    let mut s = cluster(3);
    put(&mut s, "t", 2, None);
    let before = s.topics["t"].clone();
    let create = MetaCommand::PutTopic {
        name: "t".into(),
        config: serde_json::json!({ "partitions": 2, "retentionMs": 1 }),
        replication_factor: None,
        id: Some("another".into()),
    };
    assert_eq!(s.apply(&create), MetaOutcome::TopicExists);
    assert_eq!(s.topics["t"], before);
}

/// Several brokers may propose an id as a cluster forms: the first applied is the cluster's on
/// every broker, the others change nothing. A snapshot without one (written before ids) loads.
#[test]
fn the_first_cluster_id_applied_stays() {
    let mut s = cluster(1);
    assert_eq!(s.cluster_id, None);
    let set = |id: &str| MetaCommand::SetClusterId { id: id.into() };
    assert_eq!(s.apply(&set("aaaa")), MetaOutcome::Done);
    assert_eq!(s.apply(&set("aaaa")), MetaOutcome::Done);
    assert!(matches!(s.apply(&set("bbbb")), MetaOutcome::Refused(why) if why.contains("aaaa")));
    assert_eq!(s.cluster_id.as_deref(), Some("aaaa"));
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["clusterId"], "aaaa");
    let mut old = json.clone();
    old.as_object_mut().unwrap().remove("clusterId");
    let loaded: MetaState = serde_json::from_value(old).unwrap();
    assert_eq!(loaded.cluster_id, None);
}
