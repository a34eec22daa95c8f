//! What an acquisition costs in round trips.

use std::time::Duration;

use leasehold_tests::TcpProxy;

use crate::{long_session_client, Db};

/// An uncontended acquisition on PostgreSQL is one round trip: the entry's insert and the read of the lock's entries
/// go together, two statements pipelined on one connection, and the read grants it. A proxy that slows every chunk by
/// 50 ms counts, per connection, the times the client spoke after hearing the server: a read sent only once the insert
/// was answered would be a second turn.
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
    // The first acquisition opens the session and prepares the statements on the connection.
    let first = client.mutex("trips").lock().await.unwrap();
    first.release().await.unwrap();
    proxy.delay(Duration::from_millis(50));
    for _ in 0..3 {
        let before = proxy.turns();
        let guard = client.mutex("trips").lock().await.unwrap();
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
        guard.release().await.unwrap();
    }
}
