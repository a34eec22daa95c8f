//! A lock's TTL on every store: its grants live under a lease of that TTL (on the stores with sessions, the client's
//! session of that TTL, one per distinct TTL), whatever the client's default lease; and closing the client closes the
//! session of every TTL.

use std::time::{Duration, Instant};

use leasehold::Client;

use crate::{Store, EVENT, SHORT};

/// The client default of these tests: far longer than any bound they assert, so a grant that lived under it (as
/// every grant on etcd, ZooKeeper and SQL did before a lock's TTL was honoured) fails them. ZooKeeper clamps it to
/// its maximum, 10 s in the harness: still beyond every bound here.
const LONG: Duration = Duration::from_secs(30);

/// A second lock TTL, between [`SHORT`] and [`LONG`].
const MEDIUM: Duration = Duration::from_secs(6);

/// A client under `prefix`, through `addr`, whose default lease is [`LONG`] (on Redis it is 30 s anyway: a lock's
/// lease is its own there).
async fn long_default_client(store: &Store, addr: std::net::SocketAddr, prefix: &str) -> Client {
    let mut builder = Client::builder(&store.url_at(addr)).unwrap().prefix(prefix);
    if store.has_sessions() {
        builder = builder.session_ttl(LONG);
    }
    builder.connect().await.unwrap()
}

pub async fn each_lock_is_granted_under_its_own_ttl(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let a = long_default_client(store, store.addr(), &prefix).await;
    let short = a.mutex("short").ttl(SHORT).lock().await.unwrap();
    let medium = a.mutex("medium").ttl(MEDIUM).lock().await.unwrap();
    let default = a.mutex("default").lock().await.unwrap();
    // What each lease is: the TTL asked (ZooKeeper's is five eighths of it, its local validity; see
    // `zookeeper_client` `session::*` for a timeout the ensemble negotiates other than asked).
    assert!(short.ttl() <= SHORT, "{:?}", short.ttl());
    assert!(
        SHORT < medium.ttl() && medium.ttl() <= MEDIUM,
        "{:?}",
        medium.ttl()
    );
    assert!(medium.ttl() < default.ttl(), "{:?}", default.ttl());
    // Where the store reports the time left on a holder's lease (all but ZooKeeper), it is within its own TTL; the
    // medium one, renewed every third (every quarter on SQL) of 6 s, stays above the short TTL.
    let b = store.client(&prefix).await;
    let left = |info: leasehold::LockInfo| info.holder.unwrap().remaining;
    if let Some(remaining) = left(b.inspect("short").await.unwrap()) {
        assert!(remaining <= SHORT, "{remaining:?}");
        let medium_left = left(b.inspect("medium").await.unwrap()).unwrap();
        assert!(
            SHORT < medium_left && medium_left <= MEDIUM,
            "{medium_left:?}"
        );
    }
    for guard in [short, medium, default] {
        guard.release().await.unwrap();
    }
}

pub async fn a_short_ttl_frees_a_cut_off_holder_within_it(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let proxy = leasehold_tests::TcpProxy::start(store.addr()).await;
    let a = long_default_client(store, proxy.addr(), &prefix).await;
    let b = store.client(&prefix).await;
    let held = a.mutex("job").ttl(SHORT).lock().await.unwrap();
    // The holder's process goes silent: nothing it sends reaches the store any more.
    proxy.blackhole();
    let cut = Instant::now();
    // Its grant lapses one SHORT lease later; the bound leaves the store (and a busy machine) as much again twice
    // over, and is still well below the client's default lease.
    let bound = SHORT * 4;
    let next = b
        .mutex("job")
        .lock_timeout(bound)
        .await
        .unwrap_or_else(|e| panic!("not granted within {bound:?} of the cut: {e}"));
    assert!(cut.elapsed() < LONG / 2, "{:?}", cut.elapsed());
    assert!(next.fence() > held.fence());
    next.release().await.unwrap();
    drop(held);
}

pub async fn closing_the_client_closes_the_session_of_every_ttl(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let a = long_default_client(store, store.addr(), &prefix).await;
    let short = a.mutex("short").ttl(SHORT).lock().await.unwrap();
    let default = a.mutex("default").lock().await.unwrap();
    assert!(
        short.ttl() < default.ttl(),
        "{:?} {:?}",
        short.ttl(),
        default.ttl()
    );
    if !store.has_sessions() {
        // On Redis each grant has a lease of its own, kept until released; `close` is `flush_releases`.
        short.release().await.unwrap();
        default.release().await.unwrap();
        assert!(a.close(EVENT).await);
        return;
    }
    // One session per TTL (on SQL, a row each).
    assert!(matches!(store.session_rows(&prefix), Some(2) | None));
    // Both guards still held: closing the client closes both sessions, which deletes both entries at once.
    assert!(a.close(EVENT).await);
    assert!(matches!(store.session_rows(&prefix), Some(0) | None));
    assert!(!short.is_held() && !default.is_held());
    assert_eq!(a.kept_leases(), 0);
    let b = store.client(&prefix).await;
    assert!(b.held_locks("*").await.unwrap().is_empty());
    for name in ["short", "default"] {
        b.mutex(name)
            .try_lock()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    drop((short, default));
}

pub async fn a_ttl_the_store_cannot_grant_is_refused_before_anything_is_taken(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let a = store.client(&prefix).await;
    // Each store's shortest lease: Redis's MIN_TTL; etcd's shortest lease; ZooKeeper's and SQL's shortest session.
    let shortest = match store {
        Store::Redis(_) => leasehold::MIN_TTL,
        Store::Etcd(_) => Duration::from_secs(2),
        _ => Duration::from_secs(1),
    };
    let below = shortest - Duration::from_millis(5);
    let refused = a.mutex("tiny").ttl(below).try_lock().await.unwrap_err();
    assert!(
        matches!(
            refused,
            leasehold::Error::InvalidArgument(
                leasehold::InvalidArgument::BadDuration { .. }
                    | leasehold::InvalidArgument::BadTtl { .. }
            )
        ),
        "{refused:?}"
    );
    assert!(a.held_locks("*").await.unwrap().is_empty());
    // etcd grants whole seconds: a TTL between them is rounded up, and the lease says so.
    if let Store::Etcd(_) = store {
        let guard = a
            .mutex("rounded")
            .ttl(Duration::from_millis(2500))
            .lock()
            .await
            .unwrap();
        assert_eq!(guard.ttl(), Duration::from_secs(3));
        guard.release().await.unwrap();
    }
}
