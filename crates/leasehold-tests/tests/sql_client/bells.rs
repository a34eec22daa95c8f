//! MySQL's bells: a waiter blocks on the bell of the entry it waits for instead of polling, and still gets the lock
//! when that entry's bell is not held.

use std::time::Duration;

use leasehold::Client;
use leasehold_tests::MariaDbServer;

use crate::{granted, long_session_client, waiters, Db};

/// How long the holder keeps the lock while the waiter waits: the waiter's statements are counted over it.
const HELD: Duration = Duration::from_secs(1);

/// The server's count of `SELECT` statements so far (every check and every bell wait is one).
fn selects(server: &MariaDbServer) -> u64 {
    let out = server.sql("SHOW GLOBAL STATUS LIKE 'Com_select'");
    out.split_whitespace()
        .last()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no Com_select in {out:?}"))
}

/// What wakes PostgreSQL's waiters instead of bells, and the test that checks it.
const NOTIFIED: &str =
    "waiters are woken by NOTIFY (faults::a_release_wakes_another_clients_waiter)";

/// The MariaDB server and two clients of a fresh prefix on it (holder and waiter), with the prefix; on PostgreSQL,
/// which has no bells, `None` after printing `postgres` (what covers the same ground there).
async fn belled<'a>(
    db: &'a mut Db,
    postgres: &str,
) -> Option<(&'a MariaDbServer, String, Client, Client)> {
    let url = db.url();
    let Db::MySql(server) = db else {
        println!("postgres: {postgres}");
        return None;
    };
    let prefix = crate::helpers::fresh_prefix();
    let a = long_session_client(&url, &prefix).await;
    let b = long_session_client(&url, &prefix).await;
    Some((server, prefix, a, b))
}

/// A waiter of another client, behind a holder that keeps the lock for a second, makes a handful of statements (a
/// check, a bell wait every second at most), not a poll every 5 ms (about 200); and is granted once the holder
/// releases.
pub async fn a_waiter_blocks_on_the_holders_bell_instead_of_polling(db: &mut Db) {
    let Some((server, _, a, b)) = belled(db, NOTIFIED).await else {
        return;
    };
    let held = a.mutex("belled").lock().await.unwrap();
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.mutex("belled").lock_timeout(crate::EVENT).await }
    });
    waiters(&a, "belled", 1).await;
    let before = selects(server);
    tokio::time::sleep(HELD).await;
    let during = selects(server) - before;
    held.release().await.unwrap();
    granted(waiting).await.release().await.unwrap();
    assert!(
        during < 20,
        "the waiter made {during} SELECTs in {HELD:?} behind a holder: it polls instead of waiting on the bell"
    );
}

/// The holder's bell connection is killed (as a server restart or a proxy would): its entry stays, without a bell. A
/// waiter that hears that bell free finds the entry still there, and must neither take the lock nor stop waiting:
/// it is granted when the holder releases.
pub async fn a_waiter_behind_an_entry_without_its_bell_is_granted_at_the_release(db: &mut Db) {
    let Some((server, prefix, a, b)) = belled(db, "no bells (waiters are woken by NOTIFY)").await
    else {
        return;
    };
    let held = a.mutex("unbelled").lock().await.unwrap();
    let holder = server.sql(&format!(
        "SELECT IS_USED_LOCK(CONCAT('leasehold:', SHA1(CONCAT_WS(0x00, 'leasehold', '{prefix}', name, fence)))) \
         FROM `{prefix}_entry` WHERE name = 'unbelled'"
    ));
    let holder = holder.trim();
    assert!(
        holder.parse::<u64>().is_ok(),
        "the holder's entry has no bell held by a connection: {holder:?}"
    );
    server.sql(&format!("KILL CONNECTION {holder}"));
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.mutex("unbelled").lock_timeout(crate::EVENT).await }
    });
    waiters(&a, "unbelled", 1).await;
    // The waiter hears the bell free (nobody holds it) and checks again, more than once: still behind the holder.
    let before = selects(server);
    crate::eventually("the waiter checks again", || async {
        selects(server) >= before + 4
    })
    .await;
    assert!(
        !waiting.is_finished(),
        "the waiter was granted while the lock was held"
    );
    held.release().await.unwrap();
    granted(waiting).await.release().await.unwrap();
}

/// A permit waiter may be admitted by any holder's release: on MariaDB it blocks on the bell of the oldest entry
/// ahead (the likeliest to go first) for as long as its poll interval, and checks again after; so it is woken at once
/// by the oldest's release, and a younger holder's release still admits it at the next check.
pub async fn a_permit_waiter_blocks_on_the_oldest_holders_bell_and_hears_any_release(db: &mut Db) {
    let Some((server, _, a, b)) = belled(db, NOTIFIED).await else {
        return;
    };
    let oldest = a.semaphore("permits", 2).acquire().await.unwrap();
    let youngest = a.semaphore("permits", 2).acquire().await.unwrap();
    let waiting = tokio::spawn({
        let b = b.clone();
        async move {
            b.semaphore("permits", 2)
                .acquire_timeout(crate::EVENT)
                .await
        }
    });
    waiters(&a, "permits", 1).await;
    // The bell statement names the entry's fence: `…, name, <fence>)))`.
    let fence = oldest.fence().get();
    let blocked = format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User lock' \
         AND INFO LIKE 'SELECT CASE GET_LOCK(%, {fence}))), %'"
    );
    crate::eventually(
        "the permit waiter blocks on the oldest holder's bell",
        || async { server.sql(&blocked).trim() != "0" },
    )
    .await;
    youngest.release().await.unwrap();
    granted(waiting).await.release().await.unwrap();
    oldest.release().await.unwrap();
}
