//! What an acquisition costs in round trips.

use std::time::Duration;

use futures_util::future::join_all;

use leasehold_tests::TcpProxy;

use crate::{long_session_client, Db};

/// An uncontended acquisition on PostgreSQL is one round trip, on any connection of the client's: the entry's insert
/// and the read of the lock's entries go together, two statements pipelined on one connection, and the read grants
/// it; on a connection that has not prepared them yet, their preparation goes in the same turn. A proxy that slows
/// every chunk by 50 ms counts, per connection, the times the client spoke after hearing the server: a read sent only
/// once the insert was answered, or a statement sent only once its preparation was, would be a second turn.
pub async fn an_uncontended_acquisition_is_one_round_trip(db: &mut Db) {
    // MySQL sends its enqueue and read as one list of statements, but its pool opens and sets up connections in the
    // background meanwhile (two turns on a connection of its own, seen once in three runs): not measured here.
    let Db::Postgres(_) = db else {
        return;
    };
    let prefix = db.fresh_prefix();
    let proxy = TcpProxy::start(db.addr()).await;
    // Sessions of a minute: the keeper renews every 15 s, not in the middle of an acquisition.
    let client = long_session_client(&db.url_at(proxy.addr()), &prefix).await;
    let client = &client;
    let names = ["trips-a", "trips-b", "trips-c"];
    // The first acquisition opens the session. Three releases at once then leave three connections in the pool, two
    // of which have run only a release: the acquisitions below run on all three at once.
    let first = client.mutex(names[0]).lock().await.unwrap();
    first.release().await.unwrap();
    let mut guards = Vec::new();
    for name in names {
        guards.push(client.mutex(name).lock().await.unwrap());
    }
    join_all(guards.into_iter().map(|g| g.release()))
        .await
        .into_iter()
        .for_each(|r| r.unwrap());
    proxy.delay(Duration::from_millis(50));
    for _ in 0..3 {
        let before = proxy.turns();
        let guards = join_all(names.map(|name| async move { client.mutex(name).lock().await }))
            .await
            .into_iter()
            .map(|g| g.unwrap())
            .collect::<Vec<_>>();
        let after = proxy.turns();
        // The listener's ping may take a turn on its own connection meanwhile.
        let most = after
            .iter()
            .enumerate()
            .map(|(i, n)| n - before.get(i).copied().unwrap_or(0))
            .max();
        assert_eq!(
            most,
            Some(1),
            "turns per connection: before {before:?}, after {after:?}"
        );
        join_all(guards.into_iter().map(|g| g.release()))
            .await
            .into_iter()
            .for_each(|r| r.unwrap());
    }
}
