//! What the command leaves behind on the stores with sessions (etcd, ZooKeeper, PostgreSQL, MariaDB): a `run` that gave
//! up waiting blocks nobody once it has exited, and no command leaves its session on the server (etcd's lease,
//! ZooKeeper's session, the SQL session row) for its TTL. Each test starts its own server.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use leasehold_tests::{EtcdServer, MariaDbServer, PgServer, ZkServer};
use serde_json::Value;

use crate::{finish, leasehold, Running, SOON};

/// The session TTL of every command here (the default, said aloud): a session left behind lives this long (ZooKeeper
/// clamps it to its maximum, 10 s in the harness), far longer than [`PROMPTLY`].
const TTL: &str = "30s";

/// Well inside every store's session: the bound on what must follow at once.
const PROMPTLY: Duration = Duration::from_secs(5);

/// `leasehold run --ttl 30s NAME` with a program that prints `held` and then waits for stdin to close; returns once
/// it holds the lock.
fn holder(url: &str, name: &str) -> Running {
    let mut command = leasehold(&[
        "run",
        "--ttl",
        TTL,
        "--store",
        url,
        name,
        "--",
        "sh",
        "-c",
        "echo held; read line; exit 0",
    ]);
    command.stdin(Stdio::piped());
    let running = Running::start(command);
    assert_eq!(running.line(SOON), "held");
    running
}

fn waiting_clients(url: &str, name: &str) -> u64 {
    let (code, stdout, stderr) =
        finish(leasehold(&["status", "--json", "--store", url, name]), SOON);
    assert_eq!(code, Some(0), "{stderr}");
    let status: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    status["waiting_clients"].as_u64().unwrap()
}

/// Polls `check` until it holds, for at most `within`.
fn within(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A run that gives up waiting (`--wait 1s`) and exits leaves no entry ahead of the next waiter, which is granted at
/// once when the holder's program ends; then `sessions()` (the sessions the server still holds) comes to 0 well before
/// any session's TTL.
fn a_waiter_that_gave_up_blocks_nobody_and_no_session_stays(
    url: &str,
    sessions: impl Fn() -> usize,
) {
    let mut held = holder(url, "gate");
    let (code, _, stderr) = finish(
        leasehold(&[
            "run", "--wait", "1s", "--ttl", TTL, "--store", url, "gate", "--", "true",
        ]),
        SOON,
    );
    assert_eq!(code, Some(75), "{stderr}");
    let mut next = Running::start(leasehold(&[
        "run", "--wait", "1m", "--ttl", TTL, "--store", url, "gate", "--", "echo", "granted",
    ]));
    // The next waiter is the only one: the one that gave up left nothing in the queue.
    within("one waiter", PROMPTLY, || waiting_clients(url, "gate") == 1);
    held.close_stdin();
    let released = Instant::now();
    assert_eq!(held.code(SOON), Some(0));
    assert_eq!(next.line(PROMPTLY + SOON), "granted");
    assert!(
        released.elapsed() < PROMPTLY,
        "granted {:?} after the release",
        released.elapsed()
    );
    assert_eq!(next.code(SOON), Some(0));
    // `list` and `release --force` open sessions too.
    let (code, _, stderr) = finish(leasehold(&["list", "--store", url]), SOON);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, _, stderr) = finish(
        leasehold(&["release", "--force", "--store", url, "gate"]),
        SOON,
    );
    assert_eq!(code, Some(0), "{stderr}");
    // Every command closed its session on its way out.
    within("no session left", PROMPTLY, || sessions() == 0);
}

#[test]
fn a_waiter_that_gave_up_blocks_nobody_and_no_session_stays_on_etcd() {
    let server = EtcdServer::start();
    let leases = || {
        let output = Command::new("etcdctl")
            .args(["--endpoints", &server.endpoint(), "lease", "list"])
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        // "found N leases", then one line per lease.
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        text.split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{text}"))
    };
    a_waiter_that_gave_up_blocks_nobody_and_no_session_stays(&server.url(), leases);
}

#[test]
fn a_waiter_that_gave_up_blocks_nobody_and_no_session_stays_on_zookeeper() {
    let server = ZkServer::start();
    a_waiter_that_gave_up_blocks_nobody_and_no_session_stays(&server.url(), || {
        server.session_count()
    });
}

#[test]
fn a_waiter_that_gave_up_blocks_nobody_and_no_session_stays_on_postgres() {
    let server = PgServer::start();
    a_waiter_that_gave_up_blocks_nobody_and_no_session_stays(&server.url(), || {
        server
            .psql("SELECT count(*) FROM leasehold_session")
            .parse()
            .unwrap()
    });
}

#[test]
fn a_waiter_that_gave_up_blocks_nobody_and_no_session_stays_on_mariadb() {
    let server = MariaDbServer::start();
    a_waiter_that_gave_up_blocks_nobody_and_no_session_stays(&server.url(), || {
        server
            .sql("SELECT count(*) FROM leasehold_session")
            .parse()
            .unwrap()
    });
}
