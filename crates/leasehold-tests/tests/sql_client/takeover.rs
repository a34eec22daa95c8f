//! Taking a lock over from a dead session: the waiter deletes the session, and the delete re-checks its expiry on the
//! newest version of the row, so a renewal that committed while the delete waited for the row wins.

use std::time::Duration;

use crate::admin::{on_table, Admin};
use crate::{client_with, waiters, Db, EVENT};

/// Sessions of two minutes: the library renews them once at the start and then every 30 s, after the test is over.
const MINUTES: Duration = Duration::from_secs(120);

pub async fn a_renewal_committed_while_the_reaper_waits_wins(db: &mut Db) {
    let (prefix, url) = (db.fresh_prefix(), db.url());
    let (a, b) = (
        client_with(&url, &prefix, MINUTES).await,
        client_with(&url, &prefix, MINUTES).await,
    );
    let held = a.mutex("reaped").lock().await.unwrap();
    let lease = held.lease();
    let id = held.sql_commit_check().unwrap().session;
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.mutex("reaped").lock_timeout(EVENT).await }
    });
    waiters(&a, "reaped", 1).await;
    let (mut renewer, mut watcher) = (Admin::connect(db).await, Admin::connect(db).await);
    watcher
        .until_running(
            &on_table(db, "UPDATE", &prefix, "session"),
            false,
            |n| n == 0,
            "the session's first renewal is over",
        )
        .await;
    // The holder's session expires on the server's clock while a renewal of it, started just before, waits for its
    // row (here: the row locked by the renewer's transaction, which renews it as the library would).
    renewer.set_expiry(&prefix, &id, -1_000).await;
    renewer.run("BEGIN").await;
    renewer
        .run(&match db {
            Db::Postgres(_) => {
                format!("SELECT id FROM \"{prefix}_session\" WHERE id = '{id}' FOR UPDATE")
            }
            Db::MySql(_) => {
                format!("SELECT id FROM `{prefix}_session` WHERE id = '{id}' FOR UPDATE")
            }
        })
        .await;
    // The waiter finds the session dead and deletes it: the delete waits for the row.
    if let Db::Postgres(_) = db {
        watcher
            .run(&format!("SELECT pg_notify('{prefix}', 'reaped')"))
            .await;
    }
    let reap = on_table(db, "DELETE FROM", &prefix, "session");
    watcher
        .until_running(
            &reap,
            true,
            |n| n >= 1,
            "the waiter's delete waits for the row",
        )
        .await;
    // The renewal commits first: it must win.
    renewer.set_expiry(&prefix, &id, 120_000_000).await;
    renewer.run("COMMIT").await;
    watcher
        .until_running(&reap, false, |n| n == 0, "the waiter's delete is over")
        .await;
    assert!(
        watcher.expiry(&prefix, &id).await.is_some(),
        "the waiter deleted a session renewed while its delete waited"
    );
    let info = a.inspect("reaped").await.unwrap();
    assert_eq!(
        info.holder.map(|h| h.token),
        Some(lease.token().to_owned()),
        "the holder lost its grant"
    );
    assert!(!waiting.is_finished(), "the waiter was granted");
    assert!(lease.is_held(), "{:?}", lease.loss());
    held.release().await.unwrap();
    let next = waiting.await.unwrap().unwrap();
    next.release().await.unwrap();
}
