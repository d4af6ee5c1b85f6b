//! Kafka's consumer groups byte by byte (docs/kafka.md, "Consumer groups"): what librdkafka's
//! own tests found missing, each sent exactly as a client sends it.
//! - Bytes after a request's body are ignored, as Kafka ignores them: librdkafka 2.0.2
//!   (Debian's, under kcat) leaves some after ListGroups v4 and OffsetFetch for all partitions.
//!   ListGroups lists a group that only has commits, as Kafka does.
//! - A commit's metadata string is kept with its offset, across a restart (librdkafka 0099).
//! - Static members (`group.instance.id`, KIP-345): a restarted instance takes its old place
//!   without a rebalance, the old member id is fenced (librdkafka 0102).
//! - A group id is any string, as in Kafka (librdkafka 0132: a comma).

use kafka_protocol::messages::describe_groups_request::DescribeGroupsRequest;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ApiKey, DescribeGroupsResponse, GroupId, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest,
    JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest,
    ListGroupsResponse, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
    SyncGroupRequest, SyncGroupResponse,
};
use kafka_protocol::protocol::StrBytes;
use mmmq_tests::Broker;
use mmmq_tests::kafka_wire::{Conn, commit, fetched};
use serde_json::json;

async fn kafka_broker(root: &std::path::Path, kafka: &str) -> Broker {
    Broker::start_with(root, &["--kafka-listen", kafka]).await
}

/// A broker speaking Kafka in a fresh root dir: the dir, its Kafka address, the broker.
async fn started() -> (tempfile::TempDir, String, Broker) {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = format!("127.0.0.1:{}", mmmq_tests::free_port());
    let broker = kafka_broker(tmp.path(), &kafka).await;
    (tmp, kafka, broker)
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_owned())
}

fn commit_code(r: &OffsetCommitResponse) -> i16 {
    r.topics[0].partitions[0].error_code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_after_a_body_are_ignored_as_librdkafka_2_0_2_sends_them() {
    let (_tmp, kafka, broker) = started().await;
    broker.produce("tail", json!(1)).await;
    let mut c = Conn::open(&kafka).await;
    let r: OffsetCommitResponse = c
        .call(ApiKey::OffsetCommit, 8, &commit("g", "tail", 1, None))
        .await;
    assert_eq!(commit_code(&r), 0);
    // OffsetFetch v7 for all partitions: librdkafka 2.0.2 writes a 4-byte placeholder where
    // the flexible version's null array is one byte (its `rd_kafka_buf_write_arraycnt_pos`),
    // so 3 zero bytes follow the body.
    let all = OffsetFetchRequest::default()
        .with_group_id(GroupId(s("g")))
        .with_topics(None);
    let r: OffsetFetchResponse = c
        .call_with_tail(ApiKey::OffsetFetch, 7, &all, &[0, 0, 0])
        .await;
    assert_eq!(r.error_code, 0);
    let committed: Vec<(String, i32, i64)> = r
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .filter(|p| p.committed_offset >= 0)
                .map(|p| (t.name.to_string(), p.partition_index, p.committed_offset))
        })
        .collect();
    assert_eq!(committed, [("tail".to_owned(), 0, 1)]);
    // ListGroups v4 with one byte over, on the same connection: answered, and as Kafka lists
    // them, the group that only has commits is there, `Empty`.
    let r: ListGroupsResponse = c
        .call_with_tail(ApiKey::ListGroups, 4, &ListGroupsRequest::default(), &[0])
        .await;
    assert_eq!(r.error_code, 0);
    let listed: Vec<(String, String)> = r
        .groups
        .iter()
        .map(|g| (g.group_id.to_string(), g.group_state.to_string()))
        .collect();
    assert_eq!(listed, [("g".to_owned(), "Empty".to_owned())]);
    // DescribeGroups agrees (Kafka's tools describe what they list); an unknown group is Dead.
    let r: DescribeGroupsResponse = c
        .call(
            ApiKey::DescribeGroups,
            5,
            &DescribeGroupsRequest::default()
                .with_groups(vec![GroupId(s("g")), GroupId(s("nobody"))]),
        )
        .await;
    let states: Vec<String> = r.groups.iter().map(|g| g.group_state.to_string()).collect();
    assert_eq!(states, ["Empty", "Dead"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commits_metadata_is_kept_with_its_offset_across_a_restart() {
    let (tmp, kafka, broker) = started().await;
    broker.produce("meta", json!(1)).await;
    let mut c = Conn::open(&kafka).await;
    // librdkafka 0099 commits offset 42 with "Hello world!" and reads both back.
    let r: OffsetCommitResponse = c
        .call(
            ApiKey::OffsetCommit,
            8,
            &commit("g", "meta", 42, Some("Hello world!")),
        )
        .await;
    assert_eq!(commit_code(&r), 0);
    assert_eq!(
        fetched(&mut c, "g", "meta").await,
        (0, 42, "Hello world!".into())
    );
    drop(c);
    broker.kill();
    let broker = kafka_broker(tmp.path(), &kafka).await;
    let mut c = Conn::open(&kafka).await;
    assert_eq!(
        fetched(&mut c, "g", "meta").await,
        (0, 42, "Hello world!".into()),
        "after a restart"
    );
    // A commit without metadata replaces it, as in Kafka.
    let r: OffsetCommitResponse = c
        .call(ApiKey::OffsetCommit, 8, &commit("g", "meta", 42, None))
        .await;
    assert_eq!(commit_code(&r), 0);
    assert_eq!(fetched(&mut c, "g", "meta").await, (0, 42, String::new()));
    // Longer than Kafka's offset.metadata.max.bytes (4096): OFFSET_METADATA_TOO_LARGE (12),
    // and the commit before stays.
    let long = "m".repeat(4097);
    let r: OffsetCommitResponse = c
        .call(
            ApiKey::OffsetCommit,
            8,
            &commit("g", "meta", 7, Some(&long)),
        )
        .await;
    assert_eq!(commit_code(&r), 12);
    assert_eq!(fetched(&mut c, "g", "meta").await, (0, 42, String::new()));
    drop(broker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_id_is_any_string() {
    let (_tmp, kafka, broker) = started().await;
    broker.produce("ids", json!(1)).await;
    let mut c = Conn::open(&kafka).await;
    // Two ids that spell the same with `_` for what a consumer id cannot hold, and the valid
    // id they would spell: three groups, three commits.
    let groups = ["a,b c/ü", "a_b_c_ü", "a_b_c__"];
    for (i, g) in groups.iter().enumerate() {
        let r: OffsetCommitResponse = c
            .call(
                ApiKey::OffsetCommit,
                8,
                &commit(g, "ids", 10 + i as i64, Some(g)),
            )
            .await;
        assert_eq!(commit_code(&r), 0, "{g}");
    }
    for (i, g) in groups.iter().enumerate() {
        assert_eq!(
            fetched(&mut c, g, "ids").await,
            (0, 10 + i as i64, g.to_string()),
            "{g}"
        );
    }
    // Joining one (librdkafka 0132's comma): a member id, then the group.
    let join = JoinGroupRequest::default()
        .with_group_id(GroupId(s("a,b c/ü")))
        .with_session_timeout_ms(10_000)
        .with_rebalance_timeout_ms(10_000)
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![
            JoinGroupRequestProtocol::default()
                .with_name(s("range"))
                .with_metadata(Default::default()),
        ]);
    let r: JoinGroupResponse = c.call(ApiKey::JoinGroup, 5, &join).await;
    assert_eq!(r.error_code, 79, "MEMBER_ID_REQUIRED");
    let r: JoinGroupResponse = c
        .call(ApiKey::JoinGroup, 5, &join.with_member_id(r.member_id))
        .await;
    assert_eq!(r.error_code, 0);
    assert_eq!(r.generation_id, 1);
    // The empty id commits and fetches, as in Kafka, but joins nothing (INVALID_GROUP_ID, 24).
    let r: OffsetCommitResponse = c
        .call(ApiKey::OffsetCommit, 8, &commit("", "ids", 1, None))
        .await;
    assert_eq!(commit_code(&r), 0);
    assert_eq!(fetched(&mut c, "", "ids").await, (0, 1, String::new()));
    let empty = JoinGroupRequest::default()
        .with_group_id(GroupId(s("")))
        .with_session_timeout_ms(10_000)
        .with_protocol_type(s("consumer"));
    let r: JoinGroupResponse = c.call(ApiKey::JoinGroup, 5, &empty).await;
    assert_eq!(r.error_code, 24);
    // An id too long for a checkpoint's file name under its own name (241 characters) is
    // stored under a mapped one.
    let long = "l".repeat(241);
    let r: OffsetCommitResponse = c
        .call(ApiKey::OffsetCommit, 8, &commit(&long, "ids", 3, Some("m")))
        .await;
    assert_eq!(commit_code(&r), 0);
    assert_eq!(fetched(&mut c, &long, "ids").await, (0, 3, "m".into()));
}

fn static_join(instance: &str, member: &str) -> JoinGroupRequest {
    JoinGroupRequest::default()
        .with_group_id(GroupId(s("static")))
        .with_session_timeout_ms(30_000)
        .with_rebalance_timeout_ms(30_000)
        .with_member_id(s(member))
        .with_group_instance_id(Some(s(instance)))
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![
            JoinGroupRequestProtocol::default()
                .with_name(s("range"))
                .with_metadata(Default::default()),
        ])
}

fn heartbeat(member: &str, generation: i32, instance: &str) -> HeartbeatRequest {
    HeartbeatRequest::default()
        .with_group_id(GroupId(s("static")))
        .with_member_id(s(member))
        .with_generation_id(generation)
        .with_group_instance_id(Some(s(instance)))
}

fn sync(member: &str, generation: i32, instance: &str, to: &[(&str, &[u8])]) -> SyncGroupRequest {
    SyncGroupRequest::default()
        .with_group_id(GroupId(s("static")))
        .with_member_id(s(member))
        .with_generation_id(generation)
        .with_group_instance_id(Some(s(instance)))
        .with_assignments(
            to.iter()
                .map(|(m, a)| {
                    SyncGroupRequestAssignment::default()
                        .with_member_id(s(m))
                        .with_assignment(bytes::Bytes::copy_from_slice(a))
                })
                .collect(),
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_member_restarts_without_a_rebalance() {
    let (_tmp, kafka, _broker) = started().await;
    let (mut a, mut b) = (Conn::open(&kafka).await, Conn::open(&kafka).await);
    // A static member joins without MEMBER_ID_REQUIRED and leads generation 1 alone.
    let r: JoinGroupResponse = a.call(ApiKey::JoinGroup, 5, &static_join("i1", "")).await;
    assert_eq!((r.error_code, r.generation_id), (0, 1));
    let a_id = r.member_id.to_string();
    assert_eq!(r.leader.as_str(), a_id);
    let r: SyncGroupResponse = a
        .call(
            ApiKey::SyncGroup,
            3,
            &sync(&a_id, 1, "i1", &[(&a_id, b"A1")]),
        )
        .await;
    assert_eq!(r.error_code, 0);
    // The second joins; the first learns it from its heartbeat and joins again.
    let b_join = tokio::spawn(async move {
        let r: JoinGroupResponse = b.call(ApiKey::JoinGroup, 5, &static_join("i2", "")).await;
        (b, r)
    });
    mmmq_tests::eventually_async(std::time::Duration::from_secs(10), "a rebalance", || {
        let a_id = a_id.clone();
        let kafka = kafka.clone();
        async move {
            let mut probe = Conn::open(&kafka).await;
            let r: HeartbeatResponse = probe
                .call(ApiKey::Heartbeat, 3, &heartbeat(&a_id, 1, "i1"))
                .await;
            (r.error_code == 27).then_some(())
        }
    })
    .await;
    let r: JoinGroupResponse = a
        .call(ApiKey::JoinGroup, 5, &static_join("i1", &a_id))
        .await;
    assert_eq!((r.error_code, r.generation_id), (0, 2));
    let instances: Vec<Option<String>> = r
        .members
        .iter()
        .map(|m| m.group_instance_id.as_ref().map(|i| i.to_string()))
        .collect();
    assert_eq!(instances.len(), 2);
    assert!(instances.contains(&Some("i2".into())), "{instances:?}");
    let (mut b, rb) = b_join.await.unwrap();
    assert_eq!((rb.error_code, rb.generation_id), (0, 2));
    let b_id = rb.member_id.to_string();
    let assign: [(&str, &[u8]); 2] = [(&a_id, b"A2"), (&b_id, b"B2")];
    let (sa, sb) = (sync(&a_id, 2, "i1", &assign), sync(&b_id, 2, "i2", &[]));
    let (ra, rb): (SyncGroupResponse, SyncGroupResponse) = tokio::join!(
        a.call(ApiKey::SyncGroup, 3, &sa),
        b.call(ApiKey::SyncGroup, 3, &sb),
    );
    assert_eq!(
        (ra.assignment.as_ref(), rb.assignment.as_ref()),
        (&b"A2"[..], &b"B2"[..])
    );
    // i1, the leader, restarts (a static member's close sends no LeaveGroup): its new instance
    // joins with no member id and is answered at once, in the same generation, with the
    // leader named as it was (its old id), so it does not assign a stable group.
    let mut a2 = Conn::open(&kafka).await;
    let r: JoinGroupResponse = a2.call(ApiKey::JoinGroup, 5, &static_join("i1", "")).await;
    assert_eq!((r.error_code, r.generation_id), (0, 2), "no rebalance");
    let a2_id = r.member_id.to_string();
    assert_ne!(a2_id, a_id);
    assert_eq!(r.leader.as_str(), a_id, "the leader as it was");
    assert!(r.members.is_empty());
    let r: SyncGroupResponse = a2
        .call(ApiKey::SyncGroup, 3, &sync(&a2_id, 2, "i1", &[]))
        .await;
    assert_eq!(
        (r.error_code, r.assignment.as_ref()),
        (0, &b"A2"[..]),
        "the old assignment"
    );
    // The other member saw nothing; the old id is fenced (FENCED_INSTANCE_ID, 82) wherever
    // it goes: heartbeat, sync, commit, join.
    let r: HeartbeatResponse = b
        .call(ApiKey::Heartbeat, 3, &heartbeat(&b_id, 2, "i2"))
        .await;
    assert_eq!(r.error_code, 0);
    let r: HeartbeatResponse = a
        .call(ApiKey::Heartbeat, 3, &heartbeat(&a_id, 2, "i1"))
        .await;
    assert_eq!(r.error_code, 82);
    let r: SyncGroupResponse = a
        .call(ApiKey::SyncGroup, 3, &sync(&a_id, 2, "i1", &[]))
        .await;
    assert_eq!(r.error_code, 82);
    let fenced_commit = commit("static", "t", 0, None)
        .with_generation_id_or_member_epoch(2)
        .with_member_id(s(&a_id))
        .with_group_instance_id(Some(s("i1")));
    let r: OffsetCommitResponse = a.call(ApiKey::OffsetCommit, 8, &fenced_commit).await;
    assert_eq!(commit_code(&r), 82);
    let r: JoinGroupResponse = a
        .call(ApiKey::JoinGroup, 5, &static_join("i1", &a_id))
        .await;
    assert_eq!(r.error_code, 82);
    // DescribeGroups names the instances.
    let r: DescribeGroupsResponse = b
        .call(
            ApiKey::DescribeGroups,
            5,
            &DescribeGroupsRequest::default().with_groups(vec![GroupId(s("static"))]),
        )
        .await;
    let mut described: Vec<(String, String)> = r.groups[0]
        .members
        .iter()
        .map(|m| {
            let instance = m.group_instance_id.as_ref().map(|i| i.to_string());
            (m.member_id.to_string(), instance.unwrap_or_default())
        })
        .collect();
    described.sort_by(|x, y| x.1.cmp(&y.1));
    assert_eq!(
        described,
        [(a2_id.clone(), "i1".into()), (b_id.clone(), "i2".into())]
    );
    // Leaving by instance id alone (an admin's "remove members") rebalances the rest; the
    // new instance of i1, which took the leader's place, leads the next generation.
    let r: LeaveGroupResponse = b
        .call(
            ApiKey::LeaveGroup,
            4,
            &LeaveGroupRequest::default()
                .with_group_id(GroupId(s("static")))
                .with_members(vec![
                    MemberIdentity::default()
                        .with_member_id(s(""))
                        .with_group_instance_id(Some(s("i2"))),
                ]),
        )
        .await;
    assert_eq!((r.error_code, r.members[0].error_code), (0, 0));
    let r: HeartbeatResponse = a2
        .call(ApiKey::Heartbeat, 3, &heartbeat(&a2_id, 2, "i1"))
        .await;
    assert_eq!(r.error_code, 27, "REBALANCE_IN_PROGRESS");
    let r: JoinGroupResponse = a2
        .call(ApiKey::JoinGroup, 5, &static_join("i1", &a2_id))
        .await;
    assert_eq!((r.error_code, r.generation_id), (0, 3));
    assert_eq!(r.leader.as_str(), a2_id);
}
