//! Leader election on every store: campaigns lead in turn with growing fences, a leader publishes and changes its
//! value, observers see each term in order, and a lost term says so.

use std::time::Duration;

use leasehold::{InvalidArgument, LossReason, Observed};

use crate::{waiters, Store, EVENT, SHORT};

/// What an observer reads between its reads in these tests: short, so that no step waits long for it.
const EVERY: Duration = Duration::from_millis(20);

/// The observer's next change, within [`EVENT`].
async fn next(observer: &mut leasehold::Observer) -> Observed {
    tokio::time::timeout(EVENT, observer.next())
        .await
        .unwrap()
        .unwrap()
}

pub async fn campaigns_lead_in_turn_with_growing_fences(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let clients = [
        store.client(&prefix).await,
        store.client(&prefix).await,
        store.client(&prefix).await,
    ];
    let election = |i: usize| clients[i].election("scheduler");
    assert_eq!(election(0).leader().await.unwrap(), None);
    let first = election(0).campaign("10.0.0.1:80").await.unwrap();
    assert_eq!(first.value(), "10.0.0.1:80");
    let second = tokio::spawn({
        let election = election(1);
        async move { election.campaign("10.0.0.2:80").await }
    });
    waiters(&clients[0], "scheduler", 1).await;
    let leader = election(2).leader().await.unwrap().expect("a leader");
    assert_eq!(leader.value.as_deref(), Some("10.0.0.1:80"));
    assert_eq!(leader.fence, Some(first.fence()));
    assert!(election(2)
        .try_campaign("10.0.0.3:80")
        .await
        .unwrap_err()
        .is_busy());

    let first_fence = first.fence();
    first.resign().await.unwrap();
    let second = tokio::time::timeout(EVENT, second)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let leader = election(0).leader().await.unwrap().expect("a leader");
    assert_eq!(leader.value.as_deref(), Some("10.0.0.2:80"));
    assert_eq!(leader.fence, Some(second.fence()));
    assert!(second.fence() > first_fence);
    second.resign().await.unwrap();
    assert_eq!(election(2).leader().await.unwrap(), None);

    // A plain mutex holder leads too, publishing nothing.
    let plain = clients[2].mutex("scheduler").try_lock().await.unwrap();
    let leader = election(0).leader().await.unwrap().expect("a leader");
    assert_eq!((leader.value, leader.fence), (None, Some(plain.fence())));
    plain.release().await.unwrap();
}

pub async fn a_leader_proclaims_and_an_observer_sees_every_term_in_order(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, b, c) = (
        store.client(&prefix).await,
        store.client(&prefix).await,
        store.client(&prefix).await,
    );
    let mut observer = c.election("primary").observe_every(EVERY).observe();
    assert_eq!(next(&mut observer).await, Observed::Vacant);

    let mut term = a.election("primary").campaign("a:1").await.unwrap();
    let seen = |observed: Observed| match observed {
        Observed::Leader(leader) => (leader.fence.unwrap(), leader.value.unwrap()),
        other => panic!("{other:?} while a term held"),
    };
    assert_eq!(
        seen(next(&mut observer).await),
        (term.fence(), "a:1".to_owned())
    );
    term.proclaim("a:2").await.unwrap();
    assert_eq!(term.value(), "a:2");
    assert_eq!(
        seen(next(&mut observer).await),
        (term.fence(), "a:2".to_owned())
    );
    let leader = b.election("primary").leader().await.unwrap().unwrap();
    assert_eq!(leader.value.as_deref(), Some("a:2"));

    let first = term.fence();
    term.resign().await.unwrap();
    let term = b.election("primary").campaign("b:1").await.unwrap();
    // The observer may or may not have read the election between the two terms.
    let observed = match next(&mut observer).await {
        Observed::Vacant => next(&mut observer).await,
        leader => leader,
    };
    let (fence, value) = seen(observed);
    assert_eq!((fence, value.as_str()), (term.fence(), "b:1"));
    assert!(fence > first);
    term.resign().await.unwrap();
    assert_eq!(next(&mut observer).await, Observed::Vacant);
}

pub async fn a_lost_term_says_so_and_its_proclamation_is_refused(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, b) = (store.client(&prefix).await, store.client(&prefix).await);
    let mut term = a.election("cron").ttl(SHORT).campaign("a").await.unwrap();
    let lost = term.lost();
    b.force_release("cron")
        .await
        .unwrap()
        .expect("a leader to remove");
    assert_eq!(
        tokio::time::timeout(EVENT, lost).await.unwrap(),
        LossReason::Gone
    );
    let err = term.proclaim("again").await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    assert_eq!(term.value(), "a");
    assert_eq!(b.election("cron").leader().await.unwrap(), None);
    drop(term);

    for bad in ["", "two\nlines", &"x".repeat(leasehold::MAX_VALUE_LEN + 1)] {
        let err = a.election("cron").try_campaign(bad).await.unwrap_err();
        assert!(
            matches!(
                err,
                leasehold::Error::InvalidArgument(InvalidArgument::BadValue { .. })
            ),
            "{bad:?}: {err:?}"
        );
    }
}

pub async fn a_proclaimed_term_is_renewed_like_any_other(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, b) = (store.client(&prefix).await, store.client(&prefix).await);
    let mut term = a
        .election("renewed")
        .ttl(SHORT)
        .campaign("before")
        .await
        .unwrap();
    term.proclaim("after").await.unwrap();
    // The same value again is no loss (MySQL counts no changed row for it).
    term.proclaim("after").await.unwrap();
    // Two renewals confirmed after the proclamation (each moves the deadline on): a renewal that no longer knew the
    // grant's entry (its hold's text changed) would have ended the term.
    for _ in 0..2 {
        let before = term.valid_until();
        crate::eventually("a renewal", || async { term.valid_until() > before }).await;
    }
    assert!(term.is_held());
    let leader = b.election("renewed").leader().await.unwrap().unwrap();
    assert_eq!(
        (leader.fence, leader.value.as_deref()),
        (Some(term.fence()), Some("after"))
    );
    term.resign().await.unwrap();
}

pub async fn terms_are_counted_and_an_observer_counts_the_ones_it_missed(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, b) = (store.client(&prefix).await, store.client(&prefix).await);
    let election = || a.election("counted");
    let mut observer = b.election("counted").observe_every(EVERY).observe();
    assert_eq!(next(&mut observer).await, Observed::Vacant);
    assert_eq!(election().terms().await.unwrap(), 0);

    // Three terms begin and end before the observer reads again; each is counted, and shows its number.
    for expected in 1..=3 {
        let term = election().campaign(format!("v{expected}")).await.unwrap();
        assert_eq!(term.term(), expected);
        let leader = b.election("counted").leader().await.unwrap().unwrap();
        assert_eq!(
            (leader.term, leader.fence),
            (Some(expected), Some(term.fence()))
        );
        let holder = b.inspect("counted").await.unwrap().holder.unwrap();
        assert_eq!(
            (holder.term, holder.value.as_deref()),
            (Some(expected), Some(format!("v{expected}").as_str()))
        );
        term.resign().await.unwrap();
    }
    assert_eq!(election().terms().await.unwrap(), 3);
    let mut fourth = election().campaign("v4").await.unwrap();
    assert_eq!(fourth.term(), 4);
    // A proclamation keeps the term's number.
    fourth.proclaim("v4b").await.unwrap();
    assert_eq!(
        next(&mut observer).await,
        Observed::Missed { terms: Some(3) }
    );
    match next(&mut observer).await {
        Observed::Leader(leader) => {
            assert_eq!(leader.term, Some(4));
            assert_eq!(leader.fence, Some(fourth.fence()));
            assert_eq!(leader.value.as_deref(), Some("v4b"));
        }
        other => panic!("{other:?} while the fourth term held"),
    }
    fourth.resign().await.unwrap();
    assert_eq!(next(&mut observer).await, Observed::Vacant);

    // Terms that pass while nobody leads at either read are counted too; a plain mutex holder is not a term.
    for _ in 0..2 {
        election()
            .campaign("again")
            .await
            .unwrap()
            .resign()
            .await
            .unwrap();
    }
    let plain = a.mutex("counted").try_lock().await.unwrap();
    assert_eq!(
        next(&mut observer).await,
        Observed::Missed { terms: Some(2) }
    );
    match next(&mut observer).await {
        Observed::Leader(leader) => {
            assert_eq!((leader.term, leader.fence), (None, Some(plain.fence())))
        }
        other => panic!("{other:?} while a plain holder held"),
    }
    plain.release().await.unwrap();
    assert_eq!(next(&mut observer).await, Observed::Vacant);
    assert_eq!(election().terms().await.unwrap(), 6);
}
