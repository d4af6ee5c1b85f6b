//! At-most-once delivery against the scripted target (docs/delivery.md, "Delivery modes"): nothing is sent
//! before its claim is durable, each message is sent once whatever the answer, and a clean stop
//! leaves the true position.

use super::*;
use crate::config::DeliveryMode;
use crate::storage::vfs::fault::Op;

fn at_most_once(batch: usize) -> Arc<DispatcherSpec> {
    let mut s = Arc::into_inner(spec(3, batch, 50)).unwrap();
    s.delivery = DeliveryMode::AtMostOnce;
    Arc::new(s)
}

fn position(s: &Setup) -> Option<crate::storage::Position> {
    s.topic
        .checkpoints
        .read_position(&ConsumerId::new("w").unwrap())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn nothing_is_sent_until_its_claim_is_durable() {
    let s = setup(3).await;
    s.fs.fail(Op::Write, ".checkpoint", libc::EIO);
    let target = Scripted::new(&[]);
    let Running {
        task,
        stats,
        cancel,
    } = spawn_worker(&s, at_most_once(1), target.clone());
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(
        target.offsets().is_empty(),
        "sent before a claim was on disk"
    );
    s.fs.clear();
    let deadline = Instant::now() + Duration::from_secs(120);
    while stats.next_offset.load(Ordering::Relaxed) < 3 {
        assert!(
            Instant::now() < deadline,
            "no delivery after the disk healed"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(target.offsets(), [vec![0], vec![1], vec![2]]);
    cancel.cancel();
    task.await.unwrap();
    assert_eq!(position(&s).unwrap().next, 3);
}

#[tokio::test(start_paused = true)]
async fn a_failure_drops_a_nack_dead_letters_and_neither_is_sent_again() {
    let s = setup(3).await;
    let target = Scripted::new(&[Say::Fail, Say::Nack]);
    let stats = run_until(&s, at_most_once(1), target.clone(), |st| {
        st.next_offset.load(Ordering::Relaxed) == 3
    })
    .await;
    assert_eq!(target.offsets(), [vec![0], vec![1], vec![2]]);
    assert_eq!(
        (
            stats.delivered.load(Ordering::Relaxed),
            stats.dropped.load(Ordering::Relaxed),
            stats.nacked.load(Ordering::Relaxed),
            stats.dead_lettered.load(Ordering::Relaxed),
            stats.retries.load(Ordering::Relaxed),
        ),
        (1, 1, 1, 1, 0)
    );
    let dlq = dead_letters(&s);
    assert_eq!(dlq.len(), 1);
    assert_eq!(dlq[0]["attempts"], 1);
    assert_eq!(dlq[0]["envelope"]["offset"], 1);
    assert_eq!(position(&s).unwrap().next, 3);
}

#[tokio::test(start_paused = true)]
async fn a_nacked_batch_is_dead_lettered_whole_not_resent() {
    let s = setup(3).await;
    let target = Scripted::new(&[Say::Nack]);
    run_until(&s, at_most_once(10), target.clone(), |st| {
        st.next_offset.load(Ordering::Relaxed) == 3
    })
    .await;
    assert_eq!(target.offsets(), [vec![0, 1, 2]]);
    let dlq = dead_letters(&s);
    let offsets: Vec<_> = dlq
        .iter()
        .map(|d| d["envelope"]["offset"].clone())
        .collect();
    assert_eq!(offsets, [0, 1, 2]);
    assert!(dlq.iter().all(|d| d["attempts"] == 1));
}

#[tokio::test(start_paused = true)]
async fn a_clean_stop_mid_run_keeps_what_was_not_sent() {
    let s = setup(5).await;
    let target = Arc::new(Scripted {
        per_message: true,
        work: Duration::from_millis(10),
        ..Arc::into_inner(Scripted::new(&[])).unwrap()
    });
    // Stopped after two messages of a run of five: the rest were claimed but not sent, and the
    // clean stop gives them back.
    run_until(&s, at_most_once(1), target.clone(), |_| {
        target.answered.load(Ordering::Relaxed) >= 2
    })
    .await;
    let sent = target.answered.load(Ordering::Relaxed) as u64;
    assert!(sent < 5, "{sent}");
    assert_eq!(position(&s).unwrap().next, sent);
}
