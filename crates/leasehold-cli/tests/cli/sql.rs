//! The command on PostgreSQL and MariaDB (`--store postgres://…`, `mysql://…`): `run` with every kind, `status`,
//! `list`, `release --force`, `bench` against each store's floor (an advisory lock, `GET_LOCK`), and what the SQL
//! stores cannot honour refused before connecting. Each test starts its own server.

use std::process::Stdio;
use std::time::Duration;

use leasehold_tests::{MariaDbServer, PgServer, TempDir};
use serde_json::Value;

use crate::{finish, leasehold, one_error_line, Running, SOON};

/// Starts `leasehold run ARGS… NAME` with a program that prints `held FENCE TOKEN` and then waits for stdin to close;
/// returns once it holds the lock, with the line's token.
fn holder(url: &str, options: &[&str], name: &str) -> (Running, String) {
    let mut args = vec!["run", "--store", url];
    args.extend_from_slice(options);
    args.extend_from_slice(&[
        name,
        "--",
        "sh",
        "-c",
        "echo held $LEASEHOLD_FENCE $LEASEHOLD_TOKEN; read line; exit 0",
    ]);
    let mut command = leasehold(&args);
    command.stdin(Stdio::piped());
    let running = Running::start(command);
    let line = running.line(SOON);
    let token = line
        .strip_prefix("held ")
        .and_then(|rest| rest.split_once(' '))
        .unwrap_or_else(|| panic!("{line}"))
        .1
        .to_owned();
    (running, token)
}

fn status_json(url: &str, name: &str) -> Value {
    let (code, stdout, stderr) =
        finish(leasehold(&["status", "--json", "--store", url, name]), SOON);
    assert_eq!(code, Some(0), "{stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// `run`, `status`, `list` and `release --force` on the database at `url`.
fn runs_exclude_and_are_listed(url: &str) {
    let (mut first, token) = holder(url, &["--ttl", "4s"], "nightly");
    let (code, _, stderr) = finish(
        leasehold(&["run", "-n", "--store", url, "nightly", "--", "true"]),
        SOON,
    );
    assert_eq!(code, Some(75), "{stderr}");
    let status = status_json(url, "nightly");
    assert_eq!(status["state"], "held", "{status}");
    assert_eq!(status["kind"], "mutex", "{status}");
    assert_eq!(status["token"], token.as_str(), "{status}");
    assert_eq!(status["holder"]["pid"], first.pid(), "{status}");
    // The time left is the holder's session's, on the server's clock.
    assert!(
        status["remaining_ms"]
            .as_u64()
            .is_some_and(|ms| ms > 0 && ms <= 4000),
        "{status}"
    );
    let (code, stdout, _) = finish(leasehold(&["list", "--json", "--store", url]), SOON);
    assert_eq!(code, Some(0));
    let listed: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{stdout}");

    // A reader and a permit run beside each other's kind on other names; a second reader shares.
    let (mut reader, _) = holder(url, &["--shared"], "report");
    let (code, stdout, stderr) = finish(
        leasehold(&[
            "run", "-n", "--shared", "--store", url, "report", "--", "echo", "shared",
        ]),
        SOON,
    );
    assert_eq!((code, stdout.as_str()), (Some(0), "shared"), "{stderr}");
    let (mut permit, _) = holder(url, &["--permits", "2"], "pool");
    let (code, stdout, stderr) = finish(
        leasehold(&[
            "run",
            "-n",
            "--permits",
            "2",
            "--store",
            url,
            "pool",
            "--",
            "echo",
            "second permit",
        ]),
        SOON,
    );
    assert_eq!(
        (code, stdout.as_str()),
        (Some(0), "second permit"),
        "{stderr}"
    );

    // A force release stops the holder's program: its next renewal finds its entry gone.
    let (code, stdout, stderr) = finish(
        leasehold(&["release", "--force", "--store", url, "nightly"]),
        SOON,
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.starts_with("removed lock \"nightly\""), "{stdout}");
    assert_eq!(first.code(Duration::from_secs(10)), Some(76));
    assert!(
        first
            .stderr()
            .starts_with("leasehold: lost lock \"nightly\": "),
        "{}",
        first.stderr()
    );
    reader.close_stdin();
    permit.close_stdin();
    assert_eq!(reader.code(SOON), Some(0));
    assert_eq!(permit.code(SOON), Some(0));
    let (code, stdout, _) = finish(leasehold(&["list", "--store", url]), SOON);
    assert_eq!(code, Some(0));
    assert!(!stdout.contains("nightly"), "{stdout}");
}

#[test]
fn runs_on_postgresql_exclude_and_are_listed() {
    let server = PgServer::start();
    runs_exclude_and_are_listed(&server.url());
}

#[test]
fn runs_on_mariadb_exclude_and_are_listed() {
    let server = MariaDbServer::start();
    runs_exclude_and_are_listed(&server.url());
}

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
fn what_the_sql_stores_cannot_honour_exits_2_before_connecting() {
    let dir = TempDir::new("sql-refusals");
    let pem = dir.path().join("ca.pem");
    std::fs::write(&pem, "not used").unwrap();
    let pem = pem.to_str().unwrap();
    for (nowhere, name) in [
        ("postgres://u@127.0.0.1:1/db", "PostgreSQL"),
        ("mysql://u@127.0.0.1:1/db", "MySQL/MariaDB"),
    ] {
        let run = |options: &[&'static str]| {
            let mut args = vec!["run", "--store", nowhere];
            args.extend_from_slice(options);
            args.extend_from_slice(&["jobs", "--", "true"]);
            args
        };
        let sql_prefix_rule =
            "is not allowed: on PostgreSQL and MySQL/MariaDB it names the lease tables: ASCII \
                               letters, digits and `_`, not starting with a digit, 1 to 40 bytes";
        let cases: Vec<(Vec<&str>, String)> = vec![
            (run(&["--prefix", "a{b}"]), sql_prefix_rule.to_owned()),
            (run(&["--ttl", "500ms"]), "at least 1s".to_owned()),
            (
                run(&["--prefix", "my-locks"]),
                "key prefix \"my-locks\" is not allowed: on PostgreSQL and MySQL/MariaDB it names the lease tables: \
                 ASCII letters, digits and `_`, not starting with a digit, 1 to 40 bytes"
                    .to_owned(),
            ),
            (
                run(&["--replicas", "1"]),
                "--replicas is a Redis setting".to_owned(),
            ),
            (
                run(&["--store", nowhere]),
                "URL names the server".to_owned(),
            ),
            (
                vec![
                    "run", "--store", nowhere, "--tls-ca", pem, "jobs", "--", "true",
                ],
                "--tls-ca".to_owned(),
            ),
            (
                vec!["permits", "--store", nowhere, "jobs", "4"],
                format!("{name} stores none"),
            ),
            (
                vec!["demo", "--store", nowhere],
                "the demo runs on Redis".to_owned(),
            ),
        ];
        for (args, says) in &cases {
            let (code, _, stderr) = finish(leasehold(args), SOON);
            assert_eq!(code, Some(2), "{args:?}: {stderr}");
            let line = one_error_line(&stderr);
            assert!(line.contains(says.as_str()), "{args:?}: {line}");
            assert!(!line.contains("cannot connect"), "{args:?}: {line}");
        }
        // What the store can honour goes on to connect; nothing listens there: exit 69, the cause said once.
        let (code, _, stderr) = finish(leasehold(&run(&["--ttl", "1s"])), SOON);
        assert_eq!(code, Some(69), "{stderr}");
        let line = one_error_line(&stderr);
        assert_eq!(line.matches("Connection refused").count(), 1, "{line}");
        assert!(!line.contains("Input/output error"), "{line}");
    }
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

/// `bench` on the database at `url`: the store's floor and leasehold's scenarios, with a ratio to the floor.
fn bench_runs_against_the_floor(url: &str, floor: &str, said: &str) {
    let scenarios = [
        format!("{floor}-1"),
        "uncontended-1".to_owned(),
        format!("{floor}-8p"),
        "contended-8p".to_owned(),
        "handoff".to_owned(),
    ];
    let (code, stdout, stderr) = finish(
        leasehold(&[
            "bench",
            "--store",
            url,
            "--duration",
            "300ms",
            "--scenarios",
            &scenarios.join(","),
        ]),
        Duration::from_secs(90),
    );
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("scenario "), "{stdout}");
    let rows: Vec<Vec<&str>> = lines[1..=scenarios.len()]
        .iter()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let names: Vec<&str> = rows.iter().map(|row| row[0]).collect();
    assert_eq!(names, scenarios, "{stdout}");
    for row in &rows {
        let rate: f64 = row[1].parse().unwrap();
        assert!(rate > 0.0, "{row:?} in {stdout}");
    }
    let ratio = |name: &str| rows.iter().find(|row| row[0] == name).unwrap()[5];
    for measured in ["uncontended-1", "contended-8p"] {
        assert!(
            ratio(measured).parse::<f64>().is_ok_and(|r| r > 0.0),
            "{measured}: {stdout}"
        );
    }
    assert!(stdout.contains(said), "{stdout}");
}

#[test]
fn bench_runs_on_postgresql_against_advisory_locks() {
    let server = PgServer::start();
    bench_runs_against_the_floor(&server.url(), "pg-floor", "on PostgreSQL");
}

#[test]
fn bench_runs_on_mariadb_against_get_lock() {
    let server = MariaDbServer::start();
    bench_runs_against_the_floor(&server.url(), "my-floor", "on MySQL");
}
