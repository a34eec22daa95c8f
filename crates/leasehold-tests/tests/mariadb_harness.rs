//! The MariaDB harness itself (`leasehold_tests::mariadb`): a server answers through the `mariadb` client, keeps its
//! committed rows across a `SIGKILL` and a clean stop, restarts on its port, stops answering while paused (an open
//! connection too) and answers again once resumed, and leaves no process behind when dropped. Every wait is bounded.

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use leasehold_tests::sequence::leaves_out;
use leasehold_tests::{ChildGuard, MariaDbServer};

/// How long an answer may take to arrive once it can.
const SETTLE: Duration = Duration::from_secs(5);
/// How long a paused server must stay silent for the test to believe it is.
const SILENCE: Duration = Duration::from_millis(500);

/// Whether `pid` is a live process (not gone, not a zombie).
fn is_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        state != Some("Z")
    })
}

/// An interactive `mariadb` session, whose output lines arrive on the returned channel.
fn session(db: &MariaDbServer) -> (ChildGuard, mpsc::Receiver<String>) {
    let mut client = ChildGuard::new(
        db.mariadb_command()
            .args(["-N", "-B", "-n"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (lines, received) = mpsc::channel();
    let stdout = BufReader::new(client.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    (client, received)
}

#[test]
fn a_server_answers_through_the_client_and_logs() {
    if leaves_out("mysql") {
        return;
    }
    let started = Instant::now();
    let db = MariaDbServer::start();
    eprintln!("MariaDB ready after {:?}", started.elapsed());
    assert_eq!(
        db.url(),
        format!("mysql://root@127.0.0.1:{}/leasehold", db.port())
    );
    assert_eq!(db.addr().port(), db.port());
    assert!(db.pid().is_some());
    assert_eq!(
        db.sql("SELECT DATABASE(), CURRENT_USER()"),
        "leasehold\troot@127.0.0.1"
    );
    assert_eq!(
        db.sql("SELECT @@innodb_flush_log_at_trx_commit, @@character_set_server, @@log_bin"),
        "2\tutf8mb4\t0"
    );
    assert_eq!(db.sql("SELECT 1 UNION ALL SELECT 2"), "1\n2");
    assert_eq!(db.sql("CREATE TABLE t (n int) ENGINE=InnoDB"), "");
    assert_eq!(db.sql("SELECT NULL, 'a\tb'"), "NULL\ta\\tb");
    let error = db.try_sql("SELECT * FROM missing").unwrap_err();
    assert!(
        error.contains("Table 'leasehold.missing' doesn't exist"),
        "{error}"
    );
    assert!(db.log().contains("ready for connections"), "{}", db.log());

    // The harness's own way to break a connection, as lock tests do.
    let (mut client, lines) = session(&db);
    writeln!(client.stdin.as_mut().unwrap(), "SELECT CONNECTION_ID();").unwrap();
    let id = lines.recv_timeout(SETTLE).unwrap();
    db.sql(&format!("KILL CONNECTION {id}"));
    writeln!(client.stdin.as_mut().unwrap(), "SELECT 'still here';").unwrap();
    drop(client.stdin.take());
    let status = client.wait_timeout(SETTLE).expect("the client exits");
    assert!(
        !status.success(),
        "a killed connection fails its next query"
    );
}

#[test]
fn a_killed_or_stopped_server_restarts_on_its_port_with_its_rows() {
    if leaves_out("mysql") {
        return;
    }
    let mut db = MariaDbServer::start();
    let port = db.port();
    db.sql("CREATE TABLE t (n int) ENGINE=InnoDB");
    db.sql("CREATE TABLE fence (id bigint AUTO_INCREMENT PRIMARY KEY) ENGINE=InnoDB");
    assert_eq!(
        db.sql("INSERT INTO fence VALUES (); SELECT LAST_INSERT_ID()"),
        "1"
    );
    // Committed just before the kill: it must survive it.
    db.sql("INSERT INTO t VALUES (1)");
    let pid = db.pid().unwrap();
    db.kill();
    assert_eq!(db.pid(), None);
    assert!(!is_alive(pid));
    assert!(
        db.try_sql("SELECT 1").is_err(),
        "a killed server answers nothing"
    );

    let restarted = Instant::now();
    db.restart();
    eprintln!(
        "MariaDB ready {:?} after a restart from a kill",
        restarted.elapsed()
    );
    assert_eq!(db.port(), port);
    assert_ne!(db.pid(), Some(pid));
    assert_eq!(db.sql("SELECT n FROM t"), "1");
    // InnoDB keeps its AUTO_INCREMENT counter across a crash (since 10.2).
    assert_eq!(
        db.sql("INSERT INTO fence VALUES (); SELECT LAST_INSERT_ID()"),
        "2"
    );

    db.sql("INSERT INTO t VALUES (2)");
    db.stop();
    assert_eq!(db.pid(), None);
    assert!(db.log().contains("Shutdown complete"), "{}", db.log());
    db.restart();
    assert_eq!(db.sql("SELECT n FROM t ORDER BY n"), "1\n2");
    db.stop();
    db.stop();
}

#[test]
fn a_paused_server_answers_nothing_until_resumed() {
    if leaves_out("mysql") {
        return;
    }
    let mut db = MariaDbServer::start();
    let (mut client, lines) = session(&db);
    let stdin = client.stdin.as_mut().unwrap();
    writeln!(stdin, "SELECT 'before';").unwrap();
    assert_eq!(lines.recv_timeout(SETTLE).unwrap(), "before");

    db.pause();
    writeln!(stdin, "SELECT 'during';").unwrap();
    assert_eq!(
        lines.recv_timeout(SILENCE),
        Err(mpsc::RecvTimeoutError::Timeout),
        "an open connection hears nothing from a paused server"
    );
    let asked = Instant::now();
    let error = db.try_sql("SELECT 1").unwrap_err();
    assert!(error.contains("Lost connection"), "{error}");
    assert!(asked.elapsed() < SETTLE);

    db.resume();
    assert_eq!(lines.recv_timeout(SETTLE).unwrap(), "during");
    assert_eq!(db.sql("SELECT 1"), "1");

    // A paused server can be killed, and restarts.
    db.pause();
    db.kill();
    db.restart();
    assert_eq!(db.sql("SELECT 1"), "1");
}

#[test]
fn dropping_a_server_leaves_no_process_behind() {
    if leaves_out("mysql") {
        return;
    }
    let mut db = MariaDbServer::start();
    let pid = db.pid().unwrap();
    // Even from a pause.
    db.pause();
    drop(db);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the server was killed and reaped"
    );
}
