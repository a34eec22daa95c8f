//! The command on PostgreSQL and MariaDB (`--store postgres://…`, `mysql://…`) where only the SQL stores are
//! concerned: reads that leave no session row, a reader with `SELECT` only, a refused password. What every store does
//! (`run`, every kind, `status`, `list`, `release --force`, refusals, `bench`) is in `stores.rs`, as
//! `stores::postgres::…` and `stores::mariadb::…`. Each test starts its own server.

use leasehold_tests::{MariaDbServer, PgServer};
use serde_json::Value;

use crate::stores::{holder, status_json};
use crate::{finish, leasehold, one_error_line, SOON};

/// `status` and `list` on the database at `url` leave no session row: they read, and open no session. `sessions`
/// counts the rows of `leasehold_session`.
fn reads_leave_no_row(url: &str, sessions: impl Fn() -> String) {
    // The first command creates the tables.
    let (code, _, stderr) = finish(leasehold(&["status", "--store", url, "nightly"]), SOON);
    assert_eq!(code, Some(0), "{stderr}");
    for _ in 0..2 {
        status_json(url, "nightly");
        let (code, _, stderr) = finish(leasehold(&["list", "--store", url]), SOON);
        assert_eq!(code, Some(0), "{stderr}");
    }
    assert_eq!(sessions().trim(), "0", "status and list left session rows");
}

#[test]
fn status_and_list_on_postgresql_leave_no_row() {
    let server = PgServer::start();
    reads_leave_no_row(&server.url(), || {
        server.psql("SELECT count(*) FROM leasehold_session")
    });
}

#[test]
fn status_and_list_on_mariadb_leave_no_row() {
    let server = MariaDbServer::start();
    reads_leave_no_row(&server.url(), || {
        server.sql("SELECT count(*) FROM leasehold_session")
    });
}

/// `url` for the login `user` (the test servers trust 127.0.0.1: no password).
fn as_user(url: &str, user: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (_, at) = rest.split_once('@').unwrap();
    format!("{scheme}://{user}@{at}")
}

/// `leasehold run -n` under `prefix` at `url`, refused at connect: its one line (exit 69).
fn refused_run(url: &str, prefix: &str) -> String {
    let (code, _, stderr) = finish(
        leasehold(&[
            "run", "-n", "--prefix", prefix, "--store", url, "other", "--", "true",
        ]),
        SOON,
    );
    assert_eq!(code, Some(69), "{stderr}");
    one_error_line(&stderr).to_owned()
}

/// On the database at `url`, where `sql` runs statements as the superuser and `account` names a login as `GRANT`
/// does: a reader with `SELECT` only on the tables runs `status` and `list`; its `run` is refused at connect, in one
/// line naming what it lacks and the `GRANT` to run, exit 69; a fresh login's `run` on tables nobody created is told
/// both ways out (`create`: the `GRANT` that lets it create them).
fn a_reader_with_select_only_runs_status_and_list(
    url: &str,
    sql: impl Fn(&str) -> String,
    account: impl Fn(&str) -> String,
    create: &str,
) {
    let (code, _, stderr) = finish(leasehold(&["status", "--store", url, "nightly"]), SOON);
    assert_eq!(code, Some(0), "{stderr}");
    let (mut holder, token) = holder(url, &["--ttl", "10s"], "nightly");
    // A login with no rights: a MySQL account (`'name'@'host'`) or a PostgreSQL role.
    let login = |name: &str| {
        let login = account(name);
        if login.starts_with('\'') {
            sql(&format!("CREATE USER {login}"));
        } else {
            sql(&format!("CREATE ROLE {login} LOGIN"));
        }
        login
    };
    let reader = login("reader");
    sql(&["session", "lock", "entry"]
        .map(|t| format!("GRANT SELECT ON leasehold_{t} TO {reader};"))
        .join(" "));
    let reader = as_user(url, "reader");
    let status = status_json(&reader, "nightly");
    assert_eq!(status["token"], token.as_str(), "{status}");
    let (code, stdout, stderr) = finish(leasehold(&["list", "--json", "--store", &reader]), SOON);
    assert_eq!(code, Some(0), "{stderr}");
    let listed: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(listed[0]["name"], "nightly", "{stdout}");

    let line = refused_run(&reader, "leasehold");
    assert!(line.starts_with("leasehold: not permitted: "), "{line}");
    assert!(
        line.contains("lacks INSERT, UPDATE, DELETE on table "),
        "{line}"
    );
    assert!(line.contains("GRANT INSERT, UPDATE, DELETE ON "), "{line}");
    assert_eq!(
        line.matches("lacks").count(),
        1,
        "the cause said once: {line}"
    );

    let fresh = login("fresh");
    let line = refused_run(&as_user(url, "fresh"), "fresh");
    assert!(line.contains("may not create them"), "{line}");
    assert!(
        line.contains("the README's SQL section has the statements"),
        "{line}"
    );
    assert!(line.contains(&format!("{create} TO {fresh};")), "{line}");
    holder.close_stdin();
    assert_eq!(holder.code(SOON), Some(0));
}

#[test]
fn a_reader_with_select_only_runs_status_and_list_on_postgresql() {
    let server = PgServer::start();
    a_reader_with_select_only_runs_status_and_list(
        &server.url(),
        |sql| server.psql(sql),
        str::to_owned,
        "GRANT CREATE ON SCHEMA public",
    );
}

#[test]
fn a_reader_with_select_only_runs_status_and_list_on_mariadb() {
    let server = MariaDbServer::start();
    a_reader_with_select_only_runs_status_and_list(
        &server.url(),
        |sql| server.sql(sql),
        |user| format!("'{user}'@'127.0.0.1'"),
        "GRANT CREATE, REFERENCES ON `leasehold`.*",
    );
}

#[test]
fn a_refused_mariadb_password_is_said_once() {
    let server = MariaDbServer::start();
    server.sql("CREATE USER 'locker'@'%' IDENTIFIED BY 'right'");
    let url = format!("mysql://locker:wrong@127.0.0.1:{}/leasehold", server.port());
    let (code, _, stderr) = finish(leasehold(&["status", "--store", &url, "jobs"]), SOON);
    assert_eq!(code, Some(69), "{stderr}");
    let line = one_error_line(&stderr);
    assert_eq!(line.matches("ERROR 1045").count(), 1, "{line}");
    assert_eq!(line.matches("Access denied").count(), 1, "{line}");
    assert!(
        !line.contains("Server error") && !line.contains("wrong"),
        "{line}"
    );
}
