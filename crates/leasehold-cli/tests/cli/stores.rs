//! The command on each store besides Redis, the same tests on every one (as the conformance suite runs the library's):
//! `run` excluding and waiting, a nested run, every kind with `status` and `list`, `release --force`, what the store
//! cannot honour refused before connecting, and `bench` against the store's floor. Each test starts its own server.
//! What only one store has stays in that store's file (`etcd.rs`: a member going away, TLS; `sql.rs`: grants, rows).
//!
//! Run one test on one store with `cargo test --test cli -- stores::etcd::NAME`.

use std::process::Stdio;
use std::time::Duration;

use leasehold_tests::{EtcdServer, MariaDbServer, PgServer, TempDir, ZkServer};
use serde_json::Value;

use crate::{finish, leasehold, one_error_line, Running, SOON};

/// One store under test.
#[derive(Clone, Copy)]
pub enum Store {
    Etcd,
    ZooKeeper,
    Postgres,
    MySql,
}

/// A started server of a [`Store`], stopped on drop.
pub enum Server {
    Etcd(EtcdServer),
    ZooKeeper(ZkServer),
    Postgres(PgServer),
    MySql(MariaDbServer),
}

impl Server {
    pub fn url(&self) -> String {
        match self {
            Server::Etcd(server) => server.url(),
            Server::ZooKeeper(server) => server.url(),
            Server::Postgres(server) => server.url(),
            Server::MySql(server) => server.url(),
        }
    }
}

impl Store {
    fn start(self) -> Server {
        match self {
            Store::Etcd => Server::Etcd(EtcdServer::start()),
            // A standalone server with `tickTime=500`: sessions of 1 to 10 s.
            Store::ZooKeeper => Server::ZooKeeper(ZkServer::start()),
            Store::Postgres => Server::Postgres(PgServer::start()),
            Store::MySql => Server::MySql(MariaDbServer::start()),
        }
    }

    /// The store as the command's messages name it.
    fn said(self) -> &'static str {
        match self {
            Store::Etcd => "etcd",
            Store::ZooKeeper => "ZooKeeper",
            Store::Postgres => "PostgreSQL",
            Store::MySql => "MySQL/MariaDB",
        }
    }

    /// A URL of the store where nothing listens: a command that tried to connect would fail there with 69.
    fn nowhere(self) -> &'static str {
        match self {
            Store::Etcd => "etcd://127.0.0.1:1",
            Store::ZooKeeper => "zk://127.0.0.1:1",
            Store::Postgres => "postgres://u@127.0.0.1:1/db",
            Store::MySql => "mysql://u@127.0.0.1:1/db",
        }
    }
}

/// Starts `leasehold run ARGS… NAME` with a program that prints `held FENCE TOKEN` and then waits for stdin to close
/// (see [`Running::close_stdin`]); returns once it holds the lock, with the line's token.
pub fn holder(url: &str, options: &[&str], name: &str) -> (Running, String) {
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

/// `leasehold status --json NAME` at `url`, which must exit 0.
pub fn status_json(url: &str, name: &str) -> Value {
    let (code, stdout, stderr) =
        finish(leasehold(&["status", "--json", "--store", url, name]), SOON);
    assert_eq!(code, Some(0), "{stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// `leasehold bench --store URL --duration 1s --scenarios SCENARIOS EXTRA…`, run to its end within `within`: its
/// exit code, stdout and stderr. A second per scenario: on a machine busy with other benches, a hand-off or an
/// 8-process scenario of 300 ms measured no acquisition at all on PostgreSQL and etcd (2026-11-29).
pub fn bench_on(
    url: &str,
    scenarios: &str,
    extra: &[&str],
    within: Duration,
) -> (Option<i32>, String, String) {
    let mut args = vec![
        "bench",
        "--store",
        url,
        "--duration",
        "1s",
        "--scenarios",
        scenarios,
    ];
    args.extend_from_slice(extra);
    finish(leasehold(&args), within)
}

/// Each test below as `stores::MODULE::TEST` for each store.
macro_rules! on_store {
    ($module:ident, $store:expr, $($test:ident),*) => {
        mod $module {
            $(
                #[test]
                fn $test() {
                    super::$test($store);
                }
            )*
        }
    };
}

macro_rules! on_each_store {
    ($($test:ident),* $(,)?) => {
        on_store!(etcd, super::Store::Etcd, $($test),*);
        on_store!(zookeeper, super::Store::ZooKeeper, $($test),*);
        on_store!(postgres, super::Store::Postgres, $($test),*);
        on_store!(mariadb, super::Store::MySql, $($test),*);
    };
}

on_each_store![
    a_run_excludes_a_second_run_until_it_ends,
    a_nested_run_runs_under_the_outer_grant,
    every_kind_runs_and_status_and_list_name_its_holders,
    release_force_frees_the_lock_and_its_run_stops_the_program,
    what_the_store_cannot_honour_exits_2_before_connecting,
    bench_runs_against_the_stores_floor,
    opposite_sets_never_deadlock_or_overlap,
    an_observer_prints_each_leader_across_a_leader_kill,
];

/// `observe` and `run --value` (see `elect.rs`), the second leader's process killed: its session ends after its TTL.
fn an_observer_prints_each_leader_across_a_leader_kill(store: Store) {
    let server = store.start();
    crate::elect::an_observer_prints_each_leader_in_fence_order(&server.url(), "2s", drop);
}

/// `run --also` in opposite orders and a plain run, in loops (see `sets.rs`).
fn opposite_sets_never_deadlock_or_overlap(store: Store) {
    let server = store.start();
    crate::sets::opposite_sets_never_deadlock_or_overlap(&server.url());
}

fn a_run_excludes_a_second_run_until_it_ends(store: Store) {
    let server = store.start();
    let url = server.url();
    let (mut first, _) = holder(&url, &["--ttl", "4s"], "nightly");

    let (code, _, stderr) = finish(
        leasehold(&["run", "-n", "--store", &url, "nightly", "--", "true"]),
        SOON,
    );
    assert_eq!(code, Some(75), "{stderr}");
    let line = one_error_line(&stderr);
    assert!(
        line.starts_with("leasehold: lock \"nightly\" is held by another owner (host="),
        "{line}"
    );
    let (code, _, stderr) = finish(
        leasehold(&[
            "run", "-w", "0.3", "-E", "9", "--store", &url, "nightly", "--", "true",
        ]),
        SOON,
    );
    assert_eq!(code, Some(9), "{stderr}");
    assert!(
        one_error_line(&stderr).contains("still held after waiting 300ms"),
        "{stderr}"
    );

    // A waiting run starts as soon as the first one ends.
    let waiting = Running::start(leasehold(&[
        "run", "--store", &url, "nightly", "--", "echo", "second",
    ]));
    first.close_stdin();
    assert_eq!(first.code(SOON), Some(0), "{}", first.stderr());
    assert_eq!(waiting.line(SOON), "second");
}

/// A run under the lock it already holds runs at once, under the outer grant.
fn a_nested_run_runs_under_the_outer_grant(store: Store) {
    let server = store.start();
    let url = server.url();
    let inner = format!(
        "{} run -x -n --store {url} deploy -- sh -c 'echo inner $LEASEHOLD_FENCE'; echo outer $LEASEHOLD_FENCE",
        crate::LEASEHOLD
    );
    let (code, stdout, stderr) = finish(
        leasehold(&[
            "run", "-x", "--store", &url, "deploy", "--", "sh", "-c", &inner,
        ]),
        SOON,
    );
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    let fence = lines[1].strip_prefix("outer ").unwrap();
    assert_eq!(lines[0], format!("inner {fence}"), "{stdout}");
}

fn every_kind_runs_and_status_and_list_name_its_holders(store: Store) {
    let server = store.start();
    let url = server.url();

    // --ttl is the session's: etcd (in whole seconds) and the SQL stores (on the server's clock) say at most 4s left;
    // ZooKeeper does not tell how long another client's session has left.
    let (mut mutex, token) = holder(&url, &["--ttl", "4s"], "jobs");
    let status = status_json(&url, "jobs");
    assert_eq!(status["state"], "held", "{status}");
    assert_eq!(status["kind"], "mutex", "{status}");
    assert_eq!(status["token"], token.as_str(), "{status}");
    assert_eq!(
        status["holder"]["program"],
        "sh -c echo held $LEASEHOLD_FENCE $LEASEHOLD_TOKEN; read line; exit 0"
    );
    assert_eq!(status["holder"]["pid"], mutex.pid(), "{status}");
    assert!(status["fence"].as_u64().is_some(), "{status}");
    if let Store::ZooKeeper = store {
        assert!(status["remaining_ms"].is_null(), "{status}");
        let (code, stdout, stderr) = finish(leasehold(&["status", "--store", &url, "jobs"]), SOON);
        assert_eq!(code, Some(0), "{stderr}");
        assert!(
            stdout.starts_with("\"jobs\" is held by host=")
                && stdout.contains("no expiry reported"),
            "{stdout}"
        );
    } else {
        let left = status["remaining_ms"].as_u64().unwrap();
        assert!(0 < left && left <= 4000, "{status}");
    }

    // Two readers at once, with their descriptions, as on Redis.
    let (mut reader_a, token_a) = holder(&url, &["--shared"], "schema");
    let (mut reader_b, _) = holder(&url, &["-s"], "schema");
    let (code, _, stderr) = finish(
        leasehold(&["run", "-x", "-n", "--store", &url, "schema", "--", "true"]),
        SOON,
    );
    assert_eq!(code, Some(75), "a writer waits for the readers: {stderr}");
    let status = status_json(&url, "schema");
    assert_eq!(status["kind"], "rw", "{status}");
    let holders = status["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 2, "{status}");
    assert!(holders.iter().all(|h| h["mode"] == "read"), "{status}");
    assert!(
        holders.iter().any(|h| h["token"] == token_a.as_str()),
        "{status}"
    );
    assert!(
        holders
            .iter()
            .all(|h| h["holder"]["pid"].as_u64().is_some()),
        "{status}"
    );
    // A third reader shares at once.
    let (code, stdout, stderr) = finish(
        leasehold(&[
            "run", "-n", "--shared", "--store", &url, "schema", "--", "echo", "shared",
        ]),
        SOON,
    );
    assert_eq!((code, stdout.as_str()), (Some(0), "shared"), "{stderr}");

    // Two permits of three held, the third taken by a plain run at once, a fourth refused.
    let (mut permit_a, _) = holder(&url, &["--permits", "3"], "exports");
    let (mut permit_b, _) = holder(&url, &["--permits", "3"], "exports");
    let (code, stdout, stderr) = finish(
        leasehold(&[
            "run",
            "--permits",
            "3",
            "-n",
            "--store",
            &url,
            "exports",
            "--",
            "echo",
            "third",
        ]),
        SOON,
    );
    assert_eq!((code, stdout.as_str()), (Some(0), "third"), "{stderr}");
    let status = status_json(&url, "exports");
    assert_eq!(status["kind"], "semaphore", "{status}");
    assert_eq!(status["permits"], 3, "{status}");
    assert_eq!(status["holders"].as_array().unwrap().len(), 2, "{status}");

    let (mut fair, _) = holder(&url, &["--fair"], "queue");
    assert_eq!(status_json(&url, "queue")["kind"], "fair");
    let (code, _, _) = finish(
        leasehold(&[
            "run", "--fair", "-n", "--store", &url, "queue", "--", "true",
        ]),
        SOON,
    );
    assert_eq!(code, Some(75));

    let (code, stdout, stderr) = finish(leasehold(&["list", "--store", &url]), SOON);
    assert_eq!(code, Some(0), "{stderr}");
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let names: Vec<&str> = rows.iter().map(|row| row[0]).collect();
    assert_eq!(
        names,
        ["NAME", "exports", "jobs", "queue", "schema"],
        "{stdout}"
    );
    assert_eq!(rows[1][1..3], ["semaphore", "3"], "{stdout}");
    assert_eq!(rows[2][1], "mutex", "{stdout}");
    assert!(
        stdout
            .lines()
            .all(|l| l.contains("host=") || l.starts_with("NAME")),
        "{stdout}"
    );
    let (code, stdout, _) = finish(leasehold(&["list", "--json", "--store", &url, "j*"]), SOON);
    assert_eq!(code, Some(0));
    let listed: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{stdout}");
    assert_eq!(listed[0]["token"], token.as_str(), "{stdout}");

    for running in [
        &mut mutex,
        &mut reader_a,
        &mut reader_b,
        &mut permit_a,
        &mut permit_b,
        &mut fair,
    ] {
        running.close_stdin();
        assert_eq!(running.code(SOON), Some(0), "{}", running.stderr());
    }
    let (code, stdout, _) = finish(leasehold(&["list", "--store", &url]), SOON);
    assert_eq!(code, Some(0));
    assert_eq!(stdout, "no held locks match \"*\"");
}

fn release_force_frees_the_lock_and_its_run_stops_the_program(store: Store) {
    let server = store.start();
    let url = server.url();
    // etcd: a 3 s session, whose keep-alive every second finds the key gone. ZooKeeper: a long session, so the holder
    // learns of the removal from the watch on its node, at once. SQL: the next renewal finds the entry gone.
    let (ttl, within) = match store {
        Store::Etcd => ("3s", SOON),
        Store::ZooKeeper => ("10s", Duration::from_secs(5)),
        Store::Postgres | Store::MySql => ("4s", SOON),
    };
    let (mut first, token) = holder(&url, &["--ttl", ttl, "--kill-after", "1s"], "stuck");
    let (code, stdout, stderr) = finish(
        leasehold(&["release", "--force", "--store", &url, "stuck"]),
        SOON,
    );
    assert_eq!(code, Some(0), "{stderr}");
    let id = token.split(' ').next().unwrap();
    assert!(
        stdout.starts_with(&format!("removed lock \"stuck\": token {id} (fence ")),
        "{stdout}"
    );
    assert_eq!(first.code(within), Some(76));
    let lost = first.stderr();
    assert!(
        lost.starts_with("leasehold: lost lock \"stuck\": "),
        "{lost}"
    );

    let (code, stdout, stderr) = finish(
        leasehold(&["run", "-n", "--store", &url, "stuck", "--", "echo", "free"]),
        SOON,
    );
    assert_eq!((code, stdout.as_str()), (Some(0), "free"), "{stderr}");
    let (code, stdout, _) = finish(
        leasehold(&["release", "--force", "--store", &url, "stuck"]),
        SOON,
    );
    assert_eq!(code, Some(0));
    assert_eq!(stdout, "lock \"stuck\" was free; nothing removed");
}

fn what_the_store_cannot_honour_exits_2_before_connecting(store: Store) {
    let nowhere = store.nowhere();
    let dir = TempDir::new("store-refusals");
    let pem = dir.path().join("ca.pem");
    std::fs::write(&pem, "not used").unwrap();
    let pem = pem.to_str().unwrap();
    let run = |options: &[&'static str]| {
        let mut args = vec!["run", "--store", nowhere];
        args.extend_from_slice(options);
        args.extend_from_slice(&["jobs", "--", "true"]);
        args
    };
    let none_stored = format!("{} stores none", store.said());
    let mut cases: Vec<(Vec<&str>, &str)> = vec![
        (run(&["--replicas", "1"]), "--replicas is a Redis setting"),
        (
            vec!["status", "--store", nowhere, "--replicas", "2", "jobs"],
            "--replicas",
        ),
        (
            vec!["list", "--store", nowhere, "--tls-ca", pem],
            "--tls-ca",
        ),
        (
            vec![
                "release",
                "--force",
                "--store",
                nowhere,
                "--replicas",
                "1",
                "jobs",
            ],
            "--replicas",
        ),
        (
            vec!["permits", "--store", nowhere, "jobs", "4"],
            &none_stored,
        ),
        (vec!["demo", "--store", nowhere], "the demo runs on Redis"),
    ];
    let tls = vec![
        "run", "--store", nowhere, "--tls-ca", pem, "jobs", "--", "true",
    ];
    let sql_prefix_rule =
        "is not allowed: on PostgreSQL and MySQL/MariaDB it names the lease tables: ASCII \
                           letters, digits and `_`, not starting with a digit, 1 to 40 bytes";
    // A TTL the store cannot grant, which the store from the environment is checked for as well.
    let refused_ttl = match store {
        Store::Etcd => {
            cases.extend([
                (run(&["--ttl", "1s"]), "whole seconds of at least 2s"),
                (run(&["--ttl", "2500ms"]), "whole seconds of at least 2s"),
                (
                    run(&["--permits", "5000000000"]),
                    "at most 4294967295 permits",
                ),
                (
                    run(&["--store", nowhere]),
                    "one etcd URL names every member",
                ),
                (
                    tls,
                    "--tls-ca is for rediss://, etcds:// and postgres://…?sslmode=require URLs",
                ),
                (
                    vec!["status", "--store", "etcd://127.0.0.1", "jobs"],
                    "is not an etcd URL",
                ),
            ]);
            "500ms"
        }
        Store::ZooKeeper => {
            cases.extend([
                (
                    run(&["--ttl", "500ms"]),
                    "whole milliseconds from 1s to 24d",
                ),
                (run(&["--ttl", "1500500us"]), "whole milliseconds"),
                (run(&["--ttl", "25d"]), "whole milliseconds from 1s to 24d"),
                (
                    run(&["--permits", "5000000000"]),
                    "a ZooKeeper semaphore has at most 4294967295 permits",
                ),
                (
                    run(&["--store", nowhere]),
                    "one zk:// URL names every server of the ensemble",
                ),
                (tls, "leasehold reaches ZooKeeper without TLS"),
                (
                    vec!["status", "--store", "zk://127.0.0.1:x", "jobs"],
                    "is not a ZooKeeper URL",
                ),
                (
                    vec!["bench", "--store", nowhere, "--scenarios", "floor-1"],
                    "floor-1 does not run on ZooKeeper",
                ),
                (
                    vec!["bench", "--scenarios", "zk-floor-1"],
                    "zk-floor-1 needs a ZooKeeper store",
                ),
            ]);
            "999ms"
        }
        Store::Postgres | Store::MySql => {
            cases.extend([
                (run(&["--prefix", "a{b}"]), sql_prefix_rule),
                (run(&["--ttl", "500ms"]), "at least 1s"),
                (
                    run(&["--prefix", "my-locks"]),
                    "key prefix \"my-locks\" is not allowed: on PostgreSQL and MySQL/MariaDB it names the lease \
                     tables: ASCII letters, digits and `_`, not starting with a digit, 1 to 40 bytes",
                ),
                (run(&["--store", nowhere]), "URL names the server"),
                (tls, "--tls-ca"),
            ]);
            "500ms"
        }
    };
    for (args, says) in &cases {
        let (code, _, stderr) = finish(leasehold(args), SOON);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        let line = one_error_line(&stderr);
        assert!(line.contains(says), "{args:?}: {line}");
        assert!(!line.contains("cannot connect"), "{args:?}: {line}");
    }
    // The store from the environment is checked the same way.
    let mut command = leasehold(&["run", "--ttl", refused_ttl, "jobs", "--", "true"]);
    command.env("LEASEHOLD_STORE", nowhere);
    let (code, _, stderr) = finish(command, SOON);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        one_error_line(&stderr).contains(&format!("--ttl {refused_ttl}")),
        "{stderr}"
    );

    // What the store can honour goes on to connect, and an unreachable store is said as an unreachable Redis is: 69
    // (ZooKeeper within the session timeout asked for: the shortest here).
    let ttl = if let Store::Etcd = store { "2s" } else { "1s" };
    let mut connecting = vec![run(&["--ttl", ttl, "--permits", "4"])];
    if let Store::Etcd = store {
        connecting.push(vec!["status", "--store", nowhere, "jobs"]);
        connecting.push(vec!["list", "--store", nowhere, "--json"]);
    }
    for args in &connecting {
        let (code, _, stderr) = finish(leasehold(args), SOON);
        assert_eq!(code, Some(69), "{args:?}: {stderr}");
        let line = one_error_line(&stderr);
        match store {
            Store::Etcd => assert!(
                line.starts_with("leasehold: cannot connect to etcd at etcd://127.0.0.1:1: ")
                    && line.ends_with("Connection refused (os error 111)"),
                "{args:?}: {line}"
            ),
            Store::ZooKeeper => assert!(
                line.starts_with("leasehold: cannot connect to ZooKeeper at zk://127.0.0.1:1: "),
                "{args:?}: {line}"
            ),
            // The cause said once.
            Store::Postgres | Store::MySql => {
                assert_eq!(line.matches("Connection refused").count(), 1, "{line}");
                assert!(!line.contains("Input/output error"), "{line}");
            }
        }
    }
}

/// `bench` runs the store's floor (its own lock, or bare nodes, an advisory lock, `GET_LOCK`) beside leasehold's
/// scenarios, with a ratio to the floor for leasehold's.
fn bench_runs_against_the_stores_floor(store: Store) {
    let server = store.start();
    let url = server.url();
    // The SQL stores' durable lease row too, which uncontended-1 is set beside (× row floor).
    let (floors, row, note): (&[&str], Option<&str>, &str) = match store {
        Store::Etcd => (
            &["etcd-lock-1", "etcd-lock-64", "etcd-lock-8p"],
            None,
            "on etcd: × floor is against etcd-lock-1, -64, -8p, etcd's own Lock RPC",
        ),
        Store::ZooKeeper => (
            &["zk-floor-1", "zk-floor-8p"],
            None,
            "on ZooKeeper: × floor is against zk-floor-1, -64, -8p",
        ),
        Store::Postgres => (
            &["pg-floor-1", "pg-floor-8p"],
            Some("pg-row-1"),
            "on PostgreSQL",
        ),
        Store::MySql => (&["my-floor-1", "my-floor-8p"], Some("my-row-1"), "on MySQL"),
    };
    // renew-10k is left out: 10,000 grants take seconds to make on etcd.
    let scenarios: Vec<&str> = match store {
        Store::Etcd => vec![
            "etcd-lock-1",
            "uncontended-1",
            "etcd-lock-64",
            "uncontended-64",
            "etcd-lock-8p",
            "contended-8p",
            "handoff",
            "fair-8p",
            "fair-handoff",
            "rw-8p",
            "semaphore-8p",
        ],
        _ => [floors[0]]
            .into_iter()
            .chain(row)
            .chain(["uncontended-1", floors[1], "contended-8p", "handoff"])
            .collect(),
    };
    let (code, stdout, stderr) = bench_on(&url, &scenarios.join(","), &[], Duration::from_secs(90));
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stderr.lines().count(), scenarios.len(), "{stderr}");
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
        // The server's CPU per cycle, read from its process or etcd's /metrics page: it runs on this machine.
        assert!(row[6].parse::<f64>().is_ok(), "{row:?} in {stdout}");
    }
    let ratio = |name: &str| rows.iter().find(|row| row[0] == name).unwrap()[5];
    for floor in floors {
        assert_eq!(ratio(floor), "-", "{stdout}");
    }
    for measured in scenarios
        .iter()
        .filter(|s| ["uncontended-1", "uncontended-64", "contended-8p", "fair-8p"].contains(s))
    {
        assert!(
            ratio(measured).parse::<f64>().is_ok_and(|r| r > 0.0),
            "{measured}: {stdout}"
        );
    }
    if let Some(row) = row {
        assert_eq!(ratio(row), "-", "{stdout}");
        let uncontended = lines
            .iter()
            .find(|l| l.starts_with("uncontended-1"))
            .unwrap();
        assert!(uncontended.contains("× row floor "), "{stdout}");
        let said = format!("× row floor is against {row}, -64, a durable lease row");
        assert!(lines[1 + scenarios.len()].contains(&said), "{stdout}");
    }
    assert!(lines[1 + scenarios.len()].starts_with(note), "{stdout}");
    assert_eq!(lines.len(), scenarios.len() + 2, "{stdout}");
}
