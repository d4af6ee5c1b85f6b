//! Tests of [`super`]: claims, waits, expiry and the budget, on one shard or a topic.
use super::*;

#[tokio::test]
async fn a_second_claim_waits_for_the_first_and_gets_its_position() {
    let d = Dedup::default();
    let Claim::New(first) = d.claim("a", 1000, 100) else {
        panic!("first claim")
    };
    let Claim::Pending(second) = d.claim("a", 1010, 100) else {
        panic!("second claim")
    };
    let waiting = async { d.wait(&second).await };
    let storing = async {
        tokio::task::yield_now().await;
        d.stored(&first, 2, 7);
    };
    let (got, ()) = tokio::join!(waiting, storing);
    assert_eq!(got, Some((2, 7)));
    assert!(matches!(d.claim("a", 1020, 100), Claim::Stored(2, 7)));
    // Past the window the id is new again.
    assert!(matches!(d.claim("a", 1101, 100), Claim::New(_)));
    assert!(matches!(d.claim("b", 1101, 100), Claim::New(_)));
}

#[tokio::test]
async fn a_failed_append_frees_the_id() {
    let d = Dedup::default();
    let Claim::New(first) = d.claim("a", 0, 100) else {
        panic!()
    };
    let Claim::Pending(waiter) = d.claim("a", 1, 100) else {
        panic!()
    };
    d.withdraw(&first);
    assert_eq!(d.wait(&waiter).await, None);
    let Claim::New(again) = d.claim("a", 2, 100) else {
        panic!()
    };
    // A stale ticket does not complete the newer claim.
    d.stored(&first, 9, 9);
    assert!(matches!(d.claim("a", 3, 100), Claim::Pending(_)));
    d.stored(&again, 0, 4);
    assert!(matches!(d.claim("a", 4, 100), Claim::Stored(0, 4)));
    d.remember("b", 5, 1, 3);
    assert!(matches!(d.claim("b", 6, 100), Claim::Stored(1, 3)));
}

/// A cluster's replica applies the message its leader claimed the id for: the claim is stored
/// (queued once, so it is counted once) and a retry waiting on it learns where it went; the
/// leader's own `stored` or `withdraw` afterwards changes nothing.
#[tokio::test]
async fn an_applied_message_settles_the_claim_of_its_id_and_wakes_its_waiters() {
    let d = Dedup::default();
    let Claim::New(first) = d.claim("a", 1000, 100) else {
        panic!("first claim")
    };
    let Claim::Pending(second) = d.claim("a", 1010, 100) else {
        panic!("second claim")
    };
    let waiting = async {
        tokio::time::timeout(std::time::Duration::from_secs(5), d.wait(&second))
            .await
            .expect("woken by the apply")
    };
    let applying = async {
        tokio::task::yield_now().await;
        d.remember_applied("a", 990, (1, 5), 1020, 100);
    };
    let (got, ()) = tokio::join!(waiting, applying);
    assert_eq!(got, Some((1, 5)));
    d.withdraw(&first);
    assert!(matches!(d.claim("a", 1030, 100), Claim::Stored(1, 5)));
    assert_eq!(d.len(), 1);
    // Expired by the claim's time, the window it was remembered in.
    assert!(matches!(d.claim("a", 1101, 100), Claim::New(_)));
}

fn stored_claim(shard: &Shard, key: Key, now: u64, account: &Account) {
    let Claim::New(t) = shard.claim(key, now, u64::MAX, account) else {
        panic!("{key} is new")
    };
    shard.stored(&t, 0, key as u64);
}

/// The budget (docs/delivery.md, "Idempotent produce": `--max-produce-ids`), over every topic: a claim
/// that would pass it first forgets the oldest ids of its own shard, however young (counted,
/// warned once per topic) — if its topic holds at least its fair share (the budget over the
/// topics holding ids); a topic below it is admitted past the budget, which the other's next
/// claims take back. What a producer sees: a retry of a remembered id appends nothing and
/// answers the first's position (`duplicate: true`); a retry of a forgotten one stores a
/// second copy.
#[test]
fn past_the_budget_a_claim_forgets_the_oldest_ids_of_its_topic_first() {
    let budget = IdBudget::new(4);
    let (busy, late) = (Account::new(budget.clone()), Account::new(budget.clone()));
    let (shard, other) = (Shard::default(), Shard::default());
    for key in 0..4 {
        stored_claim(&shard, key, key as u64, &busy);
    }
    assert_eq!((budget.used(), budget.forgotten_early()), (4, 0));
    // Full: the next claim forgets the oldest (0) first.
    stored_claim(&shard, 4, 4, &busy);
    assert_eq!((budget.used(), budget.forgotten_early()), (4, 1));
    // A retry of a remembered id is a duplicate and forgets nothing, not even when it is the
    // shard's oldest (it adds no id).
    assert!(matches!(
        shard.claim(1, 9, u64::MAX, &busy),
        Claim::Stored(0, 1)
    ));
    assert_eq!((shard.len(), budget.forgotten_early()), (4, 1));
    // A retry of the forgotten 0 stores it again (1 goes for it).
    stored_claim(&shard, 0, 10, &busy);
    assert_eq!((budget.used(), budget.forgotten_early()), (4, 2));
    // A topic that starts later holds less than its share (4 / 2): admitted past the budget,
    // its ids all kept ...
    stored_claim(&other, 100, 11, &late);
    stored_claim(&other, 101, 12, &late);
    assert_eq!((budget.used(), late.held(), busy.held()), (6, 2, 4));
    // ... and the busy topic's next claim gives back what was passed: it holds 4 ≥ 2.
    stored_claim(&shard, 5, 13, &busy);
    assert_eq!((budget.used(), late.held(), busy.held()), (4, 2, 2));
    // Expiry by time frees the budget, and the sweep never forgets a young id early.
    Shard::expire(&mut shard.inner.lock(), 10, &busy, false);
    assert_eq!(
        (budget.used(), busy.held()),
        (4, 2),
        "young: kept by the sweep"
    );
    Shard::expire(&mut shard.inner.lock(), 50, &busy, false);
    assert_eq!((budget.used(), busy.held(), shard.len()), (2, 0, 0));
    // Ids found in the log at boot are kept past the budget until claims trim them.
    for key in 200..210 {
        shard.remember(key, 60, 0, key as u64, &busy);
    }
    assert_eq!(budget.used(), 12);
    stored_claim(&shard, 300, 61, &busy);
    assert_eq!((budget.used(), shard.len()), (4, 2));
}

/// A claim whose append is in progress is never forgotten early, so a duplicate racing it
/// (a retry, the same id later in one batch) waits for its position instead of storing a
/// second copy.
#[test]
fn a_claim_being_appended_is_not_forgotten_to_make_room() {
    let budget = IdBudget::new(2);
    let account = Account::new(budget.clone());
    let shard = Shard::default();
    let Claim::New(_pending) = shard.claim(1, 1, u64::MAX, &account) else {
        panic!()
    };
    stored_claim(&shard, 2, 2, &account);
    stored_claim(&shard, 3, 3, &account);
    assert_eq!(
        budget.used(),
        3,
        "admitted past the budget: the oldest is being appended"
    );
    assert!(matches!(
        shard.claim(1, 4, u64::MAX, &account),
        Claim::Pending(_)
    ));
}
