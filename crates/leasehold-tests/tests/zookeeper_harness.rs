//! The ZooKeeper harness itself (`leasehold_tests::zookeeper`): a standalone server serves, logs, stops answering
//! while paused and serves again after a restart on its port; a three-server ensemble has one leader, replaces it
//! after a `SIGKILL` and takes the killed server back as a follower, and replaces a paused leader too; ZooKeeper's
//! view of sessions shows what a kazoo client holds. Every wait is bounded.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use leasehold_tests::{kazoo_python, ChildGuard, ZkEnsemble, ZkServer};

/// How long ZooKeeper may take to show a change once it has happened: a closed session, a resumed leader stepping down.
const SETTLE: Duration = Duration::from_secs(5);

/// Polls `check` until it holds, for at most [`SETTLE`].
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + SETTLE;
    while !check() {
        assert!(Instant::now() < deadline, "not within {SETTLE:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `Mode:` line of a `srvr` answer.
fn mode(srvr: &str) -> Option<&str> {
    srvr.lines().find_map(|line| line.strip_prefix("Mode: "))
}

#[test]
fn a_standalone_server_serves_pauses_and_restarts_on_its_port() {
    let started = Instant::now();
    let mut zk = ZkServer::start();
    eprintln!("standalone server served after {:?}", started.elapsed());
    assert_eq!(zk.url(), format!("zk://{}", zk.endpoint()));
    assert_eq!(zk.addr().to_string(), zk.endpoint());
    assert_eq!(mode(&zk.srvr().unwrap()), Some("standalone"));
    assert!(zk.stat().unwrap().contains("Clients:"));
    let bound = format!("binding to port /{}", zk.endpoint());
    assert!(
        zk.log().contains(&bound),
        "the log says where it listens:\n{}",
        zk.log()
    );
    assert!(
        !zk.log().contains("Processing srvr command"),
        "the harness's polls stay out of the log"
    );

    zk.pause();
    let error = zk.srvr().unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::TimedOut, "{error}");
    zk.resume();
    assert_eq!(mode(&zk.srvr().unwrap()), Some("standalone"));

    let pid = zk.pid().unwrap();
    zk.kill();
    assert_eq!(zk.pid(), None);
    assert!(zk.srvr().is_err(), "a killed server answers nothing");
    let restarted = Instant::now();
    zk.restart();
    eprintln!(
        "standalone server served again {:?} after a restart",
        restarted.elapsed()
    );
    assert_ne!(zk.pid(), Some(pid));
    assert_eq!(mode(&zk.srvr().unwrap()), Some("standalone"));
    assert_eq!(
        zk.log().matches(&bound).count(),
        2,
        "the log is kept across restarts, on the same port"
    );
}

#[test]
fn an_ensemble_replaces_a_killed_leader_and_takes_it_back_as_a_follower() {
    let started = Instant::now();
    let mut zk = ZkEnsemble::start();
    eprintln!("ensemble served after {:?}", started.elapsed());
    let endpoints = zk.endpoints();
    assert_eq!(endpoints.len(), 3);
    assert_eq!(zk.url(), format!("zk://{}", endpoints.join(",")));

    let leader = zk.leader();
    let modes: Vec<String> = (0..3)
        .map(|i| mode(&zk.srvr(i).unwrap()).unwrap().to_owned())
        .collect();
    assert_eq!(
        modes.iter().filter(|m| *m == "leader").count(),
        1,
        "{modes:?}"
    );
    assert_eq!(modes[leader], "leader");

    let killed_at = Instant::now();
    zk.kill(leader);
    assert_eq!(zk.pid(leader), None);
    let next = zk.leader();
    eprintln!("new leader served {:?} after the kill", killed_at.elapsed());
    assert_ne!(next, leader);
    assert_eq!(mode(&zk.srvr(next).unwrap()), Some("leader"));

    let restarted = Instant::now();
    zk.restart(leader);
    eprintln!(
        "killed leader served again {:?} after a restart",
        restarted.elapsed()
    );
    assert_eq!(mode(&zk.srvr(leader).unwrap()), Some("follower"));
    assert_eq!(
        zk.leader(),
        next,
        "a rejoining server does not depose the leader"
    );
    assert!(
        zk.log(leader).contains("FOLLOWING"),
        "the log says it follows"
    );

    // A paused leader is not asked: the other two replace it, and it follows once resumed.
    let paused_at = Instant::now();
    zk.pause(next);
    let third = zk.leader();
    eprintln!("paused leader replaced after {:?}", paused_at.elapsed());
    assert_ne!(third, next);
    zk.resume(next);
    assert_eq!(zk.leader(), third);
    eventually("the resumed leader follows", || {
        zk.srvr(next)
            .is_ok_and(|srvr| mode(&srvr) == Some("follower"))
    });
}

/// Connects with kazoo, creates `/harness/held` as an ephemeral node, prints its session id (as `dump` prints it),
/// and closes the session when told to on stdin.
const HOLDER: &str = r#"
import sys
from kazoo.client import KazooClient
zk = KazooClient(hosts=sys.argv[1], timeout=5.0)
zk.start(timeout=10)
zk.create("/harness/held", b"", ephemeral=True, makepath=True)
print("0x%x" % zk.client_id[0], flush=True)
sys.stdin.readline()
zk.stop()
zk.close()
"#;

#[test]
fn ephemerals_and_sessions_show_what_a_kazoo_client_holds() {
    let zk = ZkServer::start();
    assert_eq!(zk.session_count(), 0);
    let mut holder = ChildGuard::new(
        Command::new(kazoo_python())
            .args(["-c", HOLDER, &zk.endpoint()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut session = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut session)
        .unwrap();
    let session = session.trim().to_owned();
    assert!(session.starts_with("0x"), "kazoo printed {session:?}");

    let ephemerals = zk.ephemerals();
    assert!(
        ephemerals.contains(&format!("{session}:\n\t/harness/held\n")),
        "{ephemerals}"
    );
    assert_eq!(zk.session_count(), 1);

    writeln!(holder.stdin.take().unwrap(), "release").unwrap();
    let status = holder
        .wait_timeout(SETTLE)
        .expect("kazoo closes its session");
    assert!(status.success());
    eventually("the closed session's ephemeral node is gone", || {
        !zk.ephemerals().contains("/harness/held")
    });
    assert_eq!(zk.session_count(), 0);
}
