//! An application user with only the rights DESIGN.md's SQL section grants, on tables an operator created with its
//! statements; a user missing any one of them, refused at connect with the right named; a user who may not create the
//! missing tables, told both ways out.

use leasehold::{Client, Error};

use crate::{client, waiters, Db, EVENT, TTL};

/// The statements of DESIGN.md's SQL block that follows the line `-- TITLE` (the documented ones), for `prefix`
/// instead of `leasehold` and the login `user` instead of `app`.
fn documented(title: &str, prefix: &str, user: &str) -> String {
    let design = include_str!("../../../../DESIGN.md");
    let marker = format!("-- {title}\n");
    let start = design
        .find(&marker)
        .unwrap_or_else(|| panic!("DESIGN.md has no block {title:?}"))
        + marker.len();
    let block = &design[start..start + design[start..].find("```").unwrap()];
    block
        .replace("leasehold_", &format!("{prefix}_"))
        .replace(" TO app;", &format!(" TO {user};"))
}

/// The store's name in DESIGN.md's block titles.
fn store(db: &Db) -> &'static str {
    match db {
        Db::Postgres(_) => "PostgreSQL",
        Db::MySql(_) => "MySQL/MariaDB",
    }
}

/// The login `user` as `GRANT` names it, created with no rights on the tables.
fn create_login(db: &Db, user: &str) -> String {
    match db {
        Db::Postgres(server) => {
            server.psql(&format!("CREATE ROLE {user} LOGIN"));
            user.to_owned()
        }
        Db::MySql(server) => {
            let account = format!("'{user}'@'127.0.0.1'");
            server.sql(&format!("CREATE USER {account}"));
            account
        }
    }
}

/// Creates the login `user` with `grants` on `prefix`'s tables: `"SELECT, INSERT, UPDATE, DELETE"` runs DESIGN.md's
/// grants for the application (on PostgreSQL with `USAGE` on the fence sequence); anything else is granted on the
/// three tables (`"SELECT"` for a reader).
pub fn create_user(db: &Db, user: &str, prefix: &str, grants: &str) {
    let account = create_login(db, user);
    let sql = if grants == "SELECT, INSERT, UPDATE, DELETE" {
        documented(&format!("{}: the grants", store(db)), prefix, &account)
    } else {
        ["session", "lock", "entry"]
            .map(|t| format!("GRANT {grants} ON {prefix}_{t} TO {account};"))
            .join(" ")
    };
    db.sql(&sql);
}

/// The tables of a new prefix, created by the operator with DESIGN.md's statements, and the prefix.
pub async fn operator_tables(db: &Db) -> String {
    let prefix = db.fresh_prefix();
    db.sql(&documented(
        &format!("{}: the tables", store(db)),
        &prefix,
        "app",
    ));
    prefix
}

/// A client of `url` under `prefix`, or why it could not connect.
async fn connect(url: &str, prefix: &str) -> Result<Client, Error> {
    crate::connect(url, prefix, TTL).await
}

/// Takes lock `name` through `client` and releases it.
async fn locks_once(client: &Client, name: &str) {
    let guard = client.mutex(name).lock().await.unwrap();
    guard.release().await.unwrap();
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

/// Every right DESIGN.md grants, as `(privilege, object, GRANT's name for the object)`.
fn documented_rights(db: &Db, prefix: &str) -> Vec<(&'static str, String, String)> {
    let mut rights = Vec::new();
    for table in ["session", "lock", "entry"] {
        let name = format!("{prefix}_{table}");
        let qualified = match db {
            Db::Postgres(_) => format!("public.{name}"),
            Db::MySql(_) => format!("`leasehold`.`{name}`"),
        };
        for privilege in ["SELECT", "INSERT", "UPDATE", "DELETE"] {
            rights.push((privilege, format!("table {qualified}"), qualified.clone()));
        }
    }
    if let Db::Postgres(_) = db {
        let qualified = format!("public.{prefix}_fence");
        rights.push((
            "USAGE",
            format!("sequence {qualified}"),
            format!("SEQUENCE {qualified}"),
        ));
    }
    rights
}

pub async fn a_user_missing_any_one_right_is_refused_at_connect_naming_it(db: &mut Db) {
    let prefix = operator_tables(db).await;
    let rights = documented_rights(db, &prefix);
    for (i, (privilege, object, on)) in rights.iter().enumerate() {
        let user = format!("{prefix}_lacks{i}");
        let account = create_login(db, &user);
        let grants: Vec<String> = rights
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, (p, _, on))| format!("GRANT {p} ON {on} TO {account};"))
            .collect();
        db.sql(&grants.join(" "));
        let err = connect(&db.url_as(&user), &prefix).await.unwrap_err();
        assert!(
            err.is_not_permitted(),
            "without {privilege} on {object}: {err:?}"
        );
        let said = err.to_string();
        assert!(
            said.contains(&format!("lacks {privilege} on {object}.")),
            "without {privilege} on {object}: {said}"
        );
        assert!(
            said.contains(&format!("GRANT {privilege} ON {on} TO {account};")),
            "without {privilege} on {object}: {said}"
        );
    }
    // The same user given the missing right connects and locks.
    let (privilege, _, on) = &rights[0];
    let user = format!("{prefix}_lacks0");
    let account = match db {
        Db::Postgres(_) => user.clone(),
        Db::MySql(_) => format!("'{user}'@'127.0.0.1'"),
    };
    db.sql(&format!("GRANT {privilege} ON {on} TO {account};"));
    let fixed = connect(&db.url_as(&user), &prefix).await.unwrap();
    locks_once(&fixed, "fixed").await;
}

pub async fn a_user_who_may_not_create_the_missing_tables_is_told_both_ways_out(db: &mut Db) {
    let prefix = db.fresh_prefix();
    let user = format!("{prefix}_fresh");
    let account = create_login(db, &user);
    let err = connect(&db.url_as(&user), &prefix).await.unwrap_err();
    assert!(err.is_not_permitted(), "{err:?}");
    let said = err.to_string();
    assert!(said.contains("do not exist"), "{said}");
    assert!(said.contains("may not create them"), "{said}");
    assert!(
        said.contains("the README's SQL section has the statements"),
        "{said}"
    );
    let (grant_tables, grant_create) = match db {
        Db::Postgres(_) => (
            format!("GRANT SELECT, INSERT, UPDATE, DELETE ON public.\"{prefix}_session\" TO {account};"),
            format!("GRANT CREATE ON SCHEMA public TO {account};"),
        ),
        Db::MySql(_) => (
            format!(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON `leasehold`.`{prefix}_session` TO {account};"
            ),
            format!("GRANT CREATE, REFERENCES ON `leasehold`.* TO {account};"),
        ),
    };
    assert!(said.contains(&grant_tables), "{said}");
    assert!(said.contains(&grant_create), "{said}");
    // Either way out works: here the second, and the client creates the tables.
    match db {
        Db::Postgres(_) => db.sql(&grant_create),
        Db::MySql(_) => db.sql(&format!(
            "GRANT CREATE, REFERENCES, SELECT, INSERT, UPDATE, DELETE ON `leasehold`.* TO {account};"
        )),
    };
    let created = connect(&db.url_as(&user), &prefix).await.unwrap();
    locks_once(&created, "created").await;
}
