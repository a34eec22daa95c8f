//! An application user with only the rights the README's SQL section grants, on tables an operator created.

use leasehold::Client;

use crate::{client, waiters, Db, EVENT};

/// Creates the login `user` with `grants` on `prefix`'s tables, as the README's SQL section writes them:
/// `"SELECT, INSERT, UPDATE, DELETE"` for the application, `"SELECT"` for a reader. On PostgreSQL the application also
/// draws fences from the sequence (`USAGE`).
pub fn create_user(db: &Db, user: &str, prefix: &str, grants: &str) {
    match db {
        Db::Postgres(server) => {
            let sequence = if grants.contains("INSERT") {
                format!("GRANT USAGE ON SEQUENCE {prefix}_fence TO {user};")
            } else {
                String::new()
            };
            server.psql(&format!(
                "CREATE ROLE {user} LOGIN; \
                 GRANT USAGE ON SCHEMA public TO {user}; \
                 GRANT {grants} ON {prefix}_session, {prefix}_lock, {prefix}_entry TO {user}; \
                 {sequence}"
            ));
        }
        Db::MySql(server) => {
            server.sql(&format!(
                "CREATE USER '{user}'@'127.0.0.1'; \
                 GRANT {grants} ON leasehold.{prefix}_session TO '{user}'@'127.0.0.1'; \
                 GRANT {grants} ON leasehold.{prefix}_lock TO '{user}'@'127.0.0.1'; \
                 GRANT {grants} ON leasehold.{prefix}_entry TO '{user}'@'127.0.0.1';"
            ));
        }
    }
}

/// The tables of a new prefix, created by the operator (a client of the superuser, which creates what is missing),
/// and the prefix.
pub async fn operator_tables(db: &Db) -> String {
    let prefix = db.fresh_prefix();
    drop(client(&db.url(), &prefix).await);
    prefix
}

pub async fn a_user_with_the_documented_grants_locks_waits_and_releases(db: &mut Db) {
    let prefix = operator_tables(db).await;
    let user = format!("{prefix}_app");
    create_user(db, &user, &prefix, "SELECT, INSERT, UPDATE, DELETE");
    let url = db.url_as(&user);
    let a: Client = client(&url, &prefix).await;
    let b: Client = client(&url, &prefix).await;
    let held = a.mutex("granted").lock().await.unwrap();
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.mutex("granted").lock_timeout(EVENT).await }
    });
    waiters(&a, "granted", 1).await;
    let info = b.inspect("granted").await.unwrap();
    assert_eq!(info.holders.len(), 1, "{info:?}");
    let first = held.fence();
    held.release().await.unwrap();
    let next = waiting.await.unwrap().unwrap();
    assert!(next.fence() > first, "fences go forward");
    next.release().await.unwrap();
    assert!(a.held_locks("*").await.unwrap().is_empty());
}
