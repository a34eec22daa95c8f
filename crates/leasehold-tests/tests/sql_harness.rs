//! The SQL servers' harnesses themselves (`leasehold_tests::postgres`, `leasehold_tests::mariadb`), one module a
//! store: a server answers through its command-line client, keeps its committed rows across a `SIGKILL` and a clean
//! stop, restarts on its port, stops answering while paused (an open session too) and answers again once resumed,
//! and leaves no process behind when dropped. The tests that are the same for both stores are written once, over
//! [`SqlHarness`]. Every wait is bounded.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use leasehold_tests::mariadb::MariaDb;
use leasehold_tests::postgres::Postgres;
use leasehold_tests::sequence::leaves_out;
use leasehold_tests::sql::{Dialect, SqlServer};
use leasehold_tests::{ChildGuard, MariaDbServer, PgServer};

/// How long an answer may take to arrive once it can.
const SETTLE: Duration = Duration::from_secs(5);
/// How long a paused server must stay silent for the test to believe it is.
const SILENCE: Duration = Duration::from_millis(500);

/// What the tests written once need of a store's harness beyond [`SqlServer`] (start, pause, resume, kill,
/// restart): its command-line client.
trait SqlHarness: Dialect {
    /// The store's name for `LEASEHOLD_TEST_STORES` ([`leaves_out`]).
    const STORE: &'static str;
    /// What the client says when it gives up on a paused server.
    const PAUSED_ERROR: &'static str;
    fn query(db: &SqlServer<Self>, sql: &str) -> String;
    fn try_query(db: &SqlServer<Self>, sql: &str) -> Result<String, String>;
    /// An interactive client, one row a line, named `name` where the store can name sessions.
    fn client(db: &SqlServer<Self>, name: &str) -> Command;
}

impl SqlHarness for Postgres {
    const STORE: &'static str = "postgres";
    const PAUSED_ERROR: &'static str = "timeout expired";
    fn query(db: &PgServer, sql: &str) -> String {
        db.psql(sql)
    }
    fn try_query(db: &PgServer, sql: &str) -> Result<String, String> {
        db.try_psql(sql)
    }
    fn client(db: &PgServer, name: &str) -> Command {
        let mut psql = db.psql_command();
        psql.env("PGAPPNAME", name).arg("-At");
        psql
    }
}

impl SqlHarness for MariaDb {
    const STORE: &'static str = "mysql";
    const PAUSED_ERROR: &'static str = "Lost connection";
    fn query(db: &MariaDbServer, sql: &str) -> String {
        db.sql(sql)
    }
    fn try_query(db: &MariaDbServer, sql: &str) -> Result<String, String> {
        db.try_sql(sql)
    }
    fn client(db: &MariaDbServer, _name: &str) -> Command {
        let mut client = db.mariadb_command();
        client.args(["-N", "-B", "-n"]);
        client
    }
}

/// Whether `pid` is a live process (not gone, not a zombie waiting for init).
fn is_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        state != Some("Z")
    })
}

/// An interactive client session named `name`, whose output lines arrive on the returned channel.
fn session<S: SqlHarness>(db: &SqlServer<S>, name: &str) -> (ChildGuard, mpsc::Receiver<String>) {
    let mut client = ChildGuard::new(
        S::client(db, name)
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

/// Opens a session named `name` that sends `hello`, has `kill` break it (given the answer to `hello`), as lock tests
/// do, and checks that the session fails its next statement.
fn a_broken_session_fails<S: SqlHarness>(
    db: &SqlServer<S>,
    name: &str,
    hello: &str,
    kill: impl FnOnce(&SqlServer<S>, &str),
) {
    let (mut client, lines) = session(db, name);
    writeln!(client.stdin.as_mut().unwrap(), "{hello}").unwrap();
    let answer = lines.recv_timeout(SETTLE).unwrap();
    kill(db, &answer);
    writeln!(client.stdin.as_mut().unwrap(), "SELECT 'still here';").unwrap();
    drop(client.stdin.take());
    let status = client.wait_timeout(SETTLE).expect("the client exits");
    assert!(!status.success(), "a broken session fails its next query");
}

fn a_paused_server_answers_nothing_until_resumed<S: SqlHarness>() {
    if leaves_out(S::STORE) {
        return;
    }
    let mut db = SqlServer::<S>::start();
    let (mut client, lines) = session(&db, "harness-paused");
    let stdin = client.stdin.as_mut().unwrap();
    writeln!(stdin, "SELECT 'before';").unwrap();
    assert_eq!(lines.recv_timeout(SETTLE).unwrap(), "before");

    db.pause();
    writeln!(stdin, "SELECT 'during';").unwrap();
    assert_eq!(
        lines.recv_timeout(SILENCE),
        Err(mpsc::RecvTimeoutError::Timeout),
        "an open session hears nothing from a paused server"
    );
    let asked = Instant::now();
    let error = S::try_query(&db, "SELECT 1").unwrap_err();
    assert!(error.contains(S::PAUSED_ERROR), "{error}");
    assert!(asked.elapsed() < SETTLE);

    db.resume();
    assert_eq!(lines.recv_timeout(SETTLE).unwrap(), "during");
    assert_eq!(S::query(&db, "SELECT 1"), "1");

    // A paused server can be killed, and restarts.
    db.pause();
    db.kill();
    db.restart();
    assert_eq!(S::query(&db, "SELECT 1"), "1");
}

mod postgres {
    use super::*;

    /// The pids of the processes whose parent is `parent`: the postmaster's sessions and helpers.
    fn children_of(parent: u32) -> Vec<u32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|entry| {
                let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
                let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
                let ppid: u32 = stat
                    .rsplit_once(')')?
                    .1
                    .split_whitespace()
                    .nth(1)?
                    .parse()
                    .ok()?;
                (ppid == parent).then_some(pid)
            })
            .collect()
    }

    /// Whether a System V shared memory segment created by process `pid` exists (`ipcs -m -p`: shmid, owner, cpid, lpid).
    fn has_segment_of(pid: u32) -> bool {
        let output = Command::new("ipcs").args(["-m", "-p"]).output().unwrap();
        assert!(output.status.success());
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .any(|line| line.split_whitespace().nth(2) == Some(&pid.to_string()))
    }

    #[test]
    fn a_server_answers_through_psql_and_logs() {
        if leaves_out("postgres") {
            return;
        }
        let started = Instant::now();
        let pg = PgServer::start();
        eprintln!("PostgreSQL ready after {:?}", started.elapsed());
        assert_eq!(
            pg.url(),
            format!("postgres://postgres@127.0.0.1:{}/leasehold", pg.port())
        );
        assert_eq!(pg.addr().port(), pg.port());
        assert!(pg.pid().is_some());
        assert_eq!(
            pg.psql("SELECT current_database(), current_user"),
            "leasehold|postgres"
        );
        assert_eq!(pg.psql("SHOW fsync"), "off");
        assert_eq!(pg.psql("SHOW synchronous_commit"), "on");
        assert_eq!(pg.psql("SELECT 1 UNION ALL SELECT 2"), "1\n2");
        assert_eq!(pg.psql("CREATE TABLE t (n int)"), "CREATE TABLE");
        let error = pg.try_psql("SELECT * FROM missing").unwrap_err();
        assert!(
            error.contains("relation \"missing\" does not exist"),
            "{error}"
        );
        assert!(
            pg.log()
                .contains("database system is ready to accept connections"),
            "{}",
            pg.log()
        );
        assert!(
            !pg.log().contains("role \"root\" does not exist"),
            "the readiness polls stay out of the log"
        );

        // The harness's own way to break a session, as lock tests do.
        a_broken_session_fails(&pg, "harness-held", "SELECT 'connected';", |pg, answer| {
            assert_eq!(answer, "connected");
            let terminated = pg.psql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'harness-held'",
            );
            assert_eq!(terminated, "t");
        });
    }

    #[test]
    fn a_killed_or_stopped_server_restarts_on_its_port_with_its_rows() {
        if leaves_out("postgres") {
            return;
        }
        let mut pg = PgServer::start();
        let port = pg.port();
        pg.psql("CREATE TABLE t (n int); CREATE SEQUENCE fence");
        assert_eq!(pg.psql("SELECT nextval('fence')"), "1");
        // Committed just before the kill: it must survive it.
        pg.psql("INSERT INTO t VALUES (1)");
        let pid = pg.pid().unwrap();
        let children = children_of(pid);
        assert!(!children.is_empty(), "the postmaster has its helpers");
        pg.kill();
        assert_eq!(pg.pid(), None);
        assert!(!is_alive(pid));
        assert!(
            children.iter().all(|&child| !is_alive(child)),
            "a kill kills every process of the server"
        );
        assert!(
            pg.try_psql("SELECT 1").is_err(),
            "a killed server answers nothing"
        );

        let restarted = Instant::now();
        pg.restart();
        eprintln!(
            "PostgreSQL ready {:?} after a restart from a kill",
            restarted.elapsed()
        );
        assert_eq!(pg.port(), port);
        assert_ne!(pg.pid(), Some(pid));
        assert_eq!(pg.psql("SELECT n FROM t"), "1");
        // A sequence logs values ahead of those it hands out, and skips them after a crash: never back.
        let fence: u64 = pg.psql("SELECT nextval('fence')").parse().unwrap();
        eprintln!("the sequence went on at {fence} after the kill");
        assert!(fence > 1);
        assert!(
            pg.log().contains("database system was interrupted"),
            "it recovered from a crash:\n{}",
            pg.log()
        );

        pg.psql("INSERT INTO t VALUES (2)");
        pg.stop();
        assert_eq!(pg.pid(), None);
        assert!(pg.log().contains("received fast shutdown request"));
        pg.restart();
        assert_eq!(pg.psql("SELECT n FROM t ORDER BY n"), "1\n2");
        pg.stop();
        pg.stop();
    }

    #[test]
    fn a_paused_server_answers_nothing_until_resumed() {
        super::a_paused_server_answers_nothing_until_resumed::<Postgres>();
    }

    #[test]
    fn dropping_a_server_leaves_no_process_behind() {
        if leaves_out("postgres") {
            return;
        }
        let mut pg = PgServer::start();
        let (mut psql, lines) = session(&pg, "harness-dropped");
        writeln!(psql.stdin.as_mut().unwrap(), "SELECT 'connected';").unwrap();
        assert_eq!(lines.recv_timeout(SETTLE).unwrap(), "connected");
        let pid = pg.pid().unwrap();
        let mut processes = children_of(pid);
        processes.push(pid);
        assert!(processes.len() > 2, "{processes:?}");

        // Even from a pause.
        pg.pause();
        drop(pg);
        let gone: Vec<u32> = processes.iter().copied().filter(|&p| is_alive(p)).collect();
        assert!(gone.is_empty(), "still running after the drop: {gone:?}");
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "the postmaster was reaped"
        );
        assert!(
            !has_segment_of(pid),
            "a shut down server removed its segment"
        );

        // A killed server leaves its shared memory segment; dropping the value removes it.
        let mut pg = PgServer::start();
        let pid = pg.pid().unwrap();
        assert!(has_segment_of(pid));
        pg.kill();
        assert!(has_segment_of(pid));
        drop(pg);
        assert!(
            !has_segment_of(pid),
            "the killed server's segment is removed"
        );
    }
}

mod mariadb {
    use super::*;

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
        a_broken_session_fails(&db, "harness-held", "SELECT CONNECTION_ID();", |db, id| {
            db.sql(&format!("KILL CONNECTION {id}"));
        });
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
        super::a_paused_server_answers_nothing_until_resumed::<MariaDb>();
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
}
