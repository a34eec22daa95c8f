//! Reading a lock's state (`inspect`, `held_locks`: the command's `status` and `list`) writes nothing.

use crate::least_privilege::{create_user, operator_tables};
use crate::{client, Db};

/// The rows of `prefix`'s session table.
pub fn sessions(db: &Db, prefix: &str) -> u64 {
    db.sql(&format!("SELECT count(*) FROM {prefix}_session"))
        .trim()
        .parse()
        .unwrap()
}

pub async fn reads_write_nothing_and_need_only_select(db: &mut Db) {
    let prefix = operator_tables(db).await;
    let holder = client(&db.url(), &prefix).await;
    let held = holder.mutex("read").lock().await.unwrap();
    assert_eq!(sessions(db, &prefix), 1, "the holder's session");
    let user = format!("{prefix}_reader");
    create_user(db, &user, &prefix, "SELECT");
    for url in [db.url(), db.url_as(&user)] {
        let reader = reader(&url, &prefix).await;
        let info = reader.inspect("read").await.unwrap();
        assert_eq!(info.holders.len(), 1, "{info:?}");
        let held_locks = reader.held_locks("*").await.unwrap();
        assert_eq!(held_locks.len(), 1, "{held_locks:?}");
        drop(reader);
        assert_eq!(
            sessions(db, &prefix),
            1,
            "a reader added a session row ({url})"
        );
    }
    // A reader that locks anyway is refused before it writes: its user may not insert.
    let reader = reader(&db.url_as(&user), &prefix).await;
    let err = reader.mutex("read2").try_lock().await.unwrap_err();
    assert!(err.is_not_permitted(), "{err:?}");
    assert!(
        err.to_string()
            .contains("lacks INSERT, UPDATE, DELETE on table "),
        "{err}"
    );
    assert_eq!(
        sessions(db, &prefix),
        1,
        "a refused reader added a session row"
    );
    held.release().await.unwrap();
}

/// A read-only client under `prefix` at `url`.
async fn reader(url: &str, prefix: &str) -> leasehold::Client {
    leasehold::Client::builder(url)
        .unwrap()
        .prefix(prefix)
        .read_only(true)
        .connect()
        .await
        .unwrap()
}
