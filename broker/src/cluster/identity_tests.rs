//! Unit tests of the cluster's id (`identity.rs`): the check, the id file, and both ends of a
//! refused message over a real socket.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use openraft::error::RaftError;

use super::*;
use crate::cluster::faults::Faults;
use crate::cluster::network::{GroupId, RAFT_PATH, Router, SendError};
use crate::cluster::types::Raft;

fn knowing(dir: &Path, id: Option<&str>) -> Identity {
    let identity = Identity::open(dir).unwrap();
    if let Some(id) = id {
        identity.adopt(id).unwrap();
    }
    identity
}

#[test]
fn only_a_broker_that_knows_its_id_refuses_and_only_another_id() {
    let tmp = tempfile::tempdir().unwrap();
    let unknown = knowing(&tmp.path().join("a"), None);
    let known = knowing(&tmp.path().join("b"), Some("aaaa"));
    assert_eq!(unknown.check(None), Ok(()));
    assert_eq!(
        unknown.check(Some("bbbb")),
        Ok(()),
        "a new broker takes any"
    );
    assert_eq!(
        known.check(None),
        Err(Refusal::NotMember("the message names no cluster")),
        "a broker that knows its id takes only messages that name it"
    );
    assert_eq!(known.check(Some("aaaa")), Ok(()));
    let refusal = known.check(Some("bbbb")).unwrap_err();
    assert_eq!(
        refusal.to_string(),
        "this broker belongs to cluster aaaa, the message to cluster bbbb"
    );
}

#[test]
fn the_id_is_kept_durably_and_never_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    let identity = Identity::open(tmp.path()).unwrap();
    assert_eq!(identity.known(), None);
    identity.adopt("0123abcd").unwrap();
    assert_eq!(
        std::fs::read_to_string(tmp.path().join(ID_FILE)).unwrap(),
        "0123abcd\n"
    );
    identity.adopt("0123abcd").unwrap();
    let again = Identity::open(tmp.path()).unwrap();
    assert_eq!(again.known().as_deref(), Some("0123abcd"));
    let err = again.adopt("ffff0000").unwrap_err();
    assert!(
        matches!(&err, IdentityError::Conflict { mine, theirs, .. }
            if mine == "0123abcd" && theirs == "ffff0000"),
        "{err}"
    );
    assert!(err.to_string().contains("refusing to join"), "{err}");
    assert_eq!(again.known().as_deref(), Some("0123abcd"));
    assert_eq!(
        std::fs::read_to_string(tmp.path().join(ID_FILE)).unwrap(),
        "0123abcd\n"
    );
    // A damaged file stops the broker rather than let it take any cluster.
    std::fs::write(tmp.path().join(ID_FILE), "not an id\n").unwrap();
    assert!(Identity::open(tmp.path()).is_err());
}

#[test]
fn new_ids_are_128_random_bits_in_hex() {
    let a = new_id().unwrap();
    let b = new_id().unwrap();
    assert_eq!(a.len(), 32);
    assert!(valid(&a), "{a}");
    assert_ne!(a, b);
}

/// A broker serving the guard in front of a ping handler that counts the pings it answers.
async fn serve(identity: Arc<Identity>, served: Arc<AtomicUsize>) -> String {
    let handler = move || {
        let served = served.clone();
        async move {
            served.fetch_add(1, Ordering::SeqCst);
            let answer: Result<Vec<(GroupId, u64)>, RaftError<Raft>> = Ok(Vec::new());
            postcard::to_stdvec(&answer).unwrap()
        }
    };
    let app = axum::Router::new()
        .route(
            &format!("{RAFT_PATH}/{{rpc}}"),
            axum::routing::post(handler),
        )
        .layer(axum::middleware::from_fn_with_state(identity, guard));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test]
async fn a_message_of_another_cluster_is_refused_and_the_sender_hears_why() {
    let tmp = tempfile::tempdir().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    let receiver = Arc::new(knowing(&tmp.path().join("r"), Some("aaaa")));
    let addr = serve(receiver, served.clone()).await;
    let peers = HashMap::from([(1, addr)]);
    let ping = |sender: Option<&'static str>, dir: &'static str| {
        let identity = Arc::new(knowing(&tmp.path().join(dir), sender));
        let router = Router::new(&peers, None, Faults::default(), identity);
        async move { router.ping(1, 2, Duration::from_secs(5)).await }
    };

    match ping(Some("bbbb"), "other").await {
        Err(SendError::OtherCluster(1, why)) => assert_eq!(
            why,
            "this broker belongs to cluster aaaa, the message to cluster bbbb"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(served.load(Ordering::SeqCst), 0, "the handler never ran");

    assert!(ping(Some("aaaa"), "same").await.is_ok());
    match ping(None, "new").await {
        Err(SendError::Status(1, status, why)) => {
            assert_eq!(status, 403);
            assert!(why.contains("names no cluster"), "{why}");
        }
        other => panic!("a message naming no cluster is refused once the id is known: {other:?}"),
    }
    assert_eq!(served.load(Ordering::SeqCst), 1);
}

/// docs/cluster.md, "Who may speak for the cluster": once a broker holds the members' secret,
/// a message without it (a client's token is not it) is `403` and never reaches a handler; the
/// sender that holds it goes through.
#[tokio::test]
async fn a_message_without_the_members_secret_is_refused_before_it_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    let receiver = knowing(&tmp.path().join("r"), Some("aaaa"));
    receiver.secret().adopt("the-members-secret").unwrap();
    let addr = serve(Arc::new(receiver), served.clone()).await;
    let peers = HashMap::from([(1, addr)]);
    let ping = |secret: Option<&'static str>, dir: &'static str| {
        let identity = Arc::new(knowing(&tmp.path().join(dir), Some("aaaa")));
        if let Some(secret) = secret {
            identity.secret().adopt(secret).unwrap();
        }
        let router = Router::new(
            &peers,
            Some("client-token".into()),
            Faults::default(),
            identity,
        );
        async move { router.ping(1, 2, Duration::from_secs(5)).await }
    };
    for (secret, dir) in [(None, "token-only"), (Some("a-guess"), "guess")] {
        match ping(secret, dir).await {
            Err(SendError::Status(1, status, why)) => {
                assert_eq!(status, 403, "{why}");
                assert!(why.contains("without the members' secret"), "{why}");
            }
            other => panic!("{secret:?}: {other:?}"),
        }
    }
    assert_eq!(served.load(Ordering::SeqCst), 0, "the handler never ran");
    assert!(ping(Some("the-members-secret"), "member").await.is_ok());
    assert_eq!(served.load(Ordering::SeqCst), 1);
}
