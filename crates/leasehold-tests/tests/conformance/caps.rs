//! Each store's column of the contract: what it refuses, with a typed error, and what it offers.

use std::time::Duration;

use leasehold::{Capability, Client, Error};

use crate::Store;

pub async fn supports_agrees_with_what_the_store_does(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, b) = (store.client(&prefix).await, store.client(&prefix).await);
    assert_eq!(a.store_name(), store.name());
    let listed: Vec<Capability> = a.capabilities().collect();
    for &capability in Capability::ALL {
        let supported = a.supports(capability);
        assert_eq!(listed.contains(&capability), supported, "{capability:?}");
        let name = format!("{capability:?}");
        // Each operation takes what it asks for and releases it: its outcome is the first error.
        let outcomes: Vec<Result<(), Error>> = match capability {
            Capability::FixedLease => vec![
                take(a.mutex(&name).fixed_lease().try_lock().await).await,
                take(a.mutex(&name).wait_and_hold(Duration::ZERO, HOLD).await).await,
            ],
            Capability::Extend => {
                let guard = a.mutex(&name).lock().await.unwrap();
                let extended = guard.extend(HOLD).await;
                // A refused extension leaves the grant as it was.
                assert!(guard.is_held());
                guard.release().await.unwrap();
                vec![extended]
            }
            Capability::SeveralPermitsAtOnce => {
                vec![take(a.semaphore(&name, 3).try_acquire_many(2).await).await]
            }
            Capability::StoredPermits => vec![a.semaphore(&name, 3).set_permits().await.map(drop)],
            Capability::Downgrade => {
                let writer = a.rw_lock(&name).write().await.unwrap();
                vec![take(writer.downgrade().await).await]
            }
            Capability::NestedHold => {
                let root = a.reentrant_mutex(&name).lock().await.unwrap();
                let nested = a.reentrant_mutex(&name).lock_as(root.token()).await;
                let outcome = match nested {
                    Ok(nested) => nested.release().await,
                    Err(e) => Err(e),
                };
                root.release().await.unwrap();
                vec![outcome]
            }
            Capability::ReplicaAcks | Capability::ReplicasOnDisk => {
                let mut builder = Client::builder(&store.url_at(store.addr()))
                    .unwrap()
                    .prefix(&prefix);
                builder = match capability {
                    Capability::ReplicaAcks => builder.replicas(1),
                    _ => builder.replicas_on_disk(true),
                };
                vec![builder.connect().await.map(drop)]
            }
            Capability::ZooKeeperWrite => {
                let guard = a.mutex(&name).lock().await.unwrap();
                let written = guard.zookeeper_write(&[]).await;
                guard.release().await.unwrap();
                vec![written]
            }
            Capability::PostgresTransaction | Capability::MysqlTransaction => {
                let guard = a.mutex(&name).lock().await.unwrap();
                let outcome = fenced_commit(store, capability, &guard).await;
                guard.release().await.unwrap();
                // The statement for another driver is there on every SQL store, and only there.
                assert_eq!(
                    guard_check(&a, &name).await,
                    matches!(store, Store::Postgres(_) | Store::MySql(_))
                );
                outcome.into_iter().collect()
            }
            other => panic!("no check of {other:?} yet: add one here"),
        };
        for outcome in outcomes {
            match outcome {
                Ok(()) => assert!(supported, "{capability:?} is said unsupported, but it ran"),
                Err(Error::Unsupported { detail }) => {
                    assert!(!supported, "{capability:?} is said supported: {detail}");
                    assert!(detail.contains(capability.describe()), "{detail}");
                }
                Err(e) => panic!("{capability:?}: {e:?}"),
            }
        }
        // Nothing is left held, refused or not: another client sees no holder and takes the lock at once.
        let info = b.inspect(&name).await.unwrap();
        assert!(info.holders.is_empty(), "{capability:?}: {info:?}");
        if !supported {
            take(b.mutex(&name).try_lock().await).await.unwrap();
        }
    }
    assert!(a.held_locks("*").await.unwrap().is_empty());
}

/// The lease of the capability checks' fixed leases and extensions: longer than the test.
const HOLD: Duration = Duration::from_secs(30);

/// Releases what an acquisition took; its error otherwise.
async fn take<G: Release>(taken: Result<G, Error>) -> Result<(), Error> {
    taken?.release_it().await
}

/// The guards of every kind, released alike.
trait Release {
    async fn release_it(self) -> Result<(), Error>;
}

impl Release for leasehold::Guard {
    async fn release_it(self) -> Result<(), Error> {
        self.release().await
    }
}

impl Release for leasehold::WriteGuard {
    async fn release_it(self) -> Result<(), Error> {
        self.release().await
    }
}

/// Whether a grant of `name` offers the fenced transaction's statement ([`leasehold::Guard::sql_commit_check`]).
async fn guard_check(client: &Client, name: &str) -> bool {
    let guard = client.mutex(name).lock().await.unwrap();
    let check = guard.sql_commit_check().is_some();
    guard.release().await.unwrap();
    check
}

/// `guard` commits an empty transaction of the database `capability` names, on the store's own server: `None` when
/// the store is not that database (no transaction of that driver can be had here, so only `supports` and
/// `sql_commit_check` are checked for it).
async fn fenced_commit(
    store: &Store,
    capability: Capability,
    guard: &leasehold::Guard,
) -> Option<Result<(), Error>> {
    let url = store.url_at(store.addr());
    match (store, capability) {
        (Store::Postgres(_), Capability::PostgresTransaction) => {
            use leasehold::tokio_postgres;
            let (mut conn, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            let tx = conn.transaction().await.unwrap();
            Some(guard.commit_postgres(tx).await)
        }
        (Store::MySql(_), Capability::MysqlTransaction) => {
            let pool = leasehold::mysql_async::Pool::new(url.as_str());
            let mut conn = pool.get_conn().await.unwrap();
            let tx = conn
                .start_transaction(leasehold::mysql_async::TxOpts::default())
                .await
                .unwrap();
            let committed = guard.commit_mysql(tx).await;
            drop(conn);
            pool.disconnect().await.unwrap();
            Some(committed)
        }
        _ => None,
    }
}

pub async fn a_refused_downgrade_leaves_nothing_held(store: &mut Store) {
    let prefix = store.fresh_prefix();
    let (a, b) = (store.client(&prefix).await, store.client(&prefix).await);
    if !store.has_sessions() {
        let reading = a
            .rw_lock("doc")
            .write()
            .await
            .unwrap()
            .downgrade()
            .await
            .unwrap();
        assert_eq!(b.inspect("doc").await.unwrap().holders.len(), 1);
        reading.release().await.unwrap();
        return;
    }
    // The refusal comes first, whatever the grant's state: a write grant already lost is refused as unsupported, not
    // as lost, as `Client::supports` answers.
    let lost = a.rw_lock("lost").write().await.unwrap();
    b.force_release("lost")
        .await
        .unwrap()
        .expect("a holder to remove");
    tokio::time::timeout(crate::EVENT, lost.lost())
        .await
        .unwrap();
    let refused = lost.downgrade().await;
    assert!(
        matches!(refused, Err(Error::Unsupported { .. })),
        "{refused:?}"
    );
    // A refused downgrade leaves nothing held the moment it returns (not once a background release has run): another
    // client sees no holder and takes the lock at once.
    let writer = a.rw_lock("doc").write().await.unwrap();
    let refused = writer.downgrade().await;
    assert!(
        matches!(refused, Err(Error::Unsupported { .. })),
        "{refused:?}"
    );
    let info = b.inspect("doc").await.unwrap();
    assert!(info.holders.is_empty(), "{info:?}");
    take(b.rw_lock("doc").try_write().await).await.unwrap();
}
