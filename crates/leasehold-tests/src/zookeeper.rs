//! Private ZooKeeper servers for tests: [`ZkServer`] (standalone) and [`ZkEnsemble`] (three servers), run on `java`
//! from Debian's ZooKeeper 3.8.0 (`/usr/share/java/zookeeper.jar`: `scripts/ensure-zookeeper.sh` installs it).
//!
//! Each server listens on free ports of 127.0.0.1 (its client port; in an ensemble also a peer and an election port),
//! keeps its configuration and data inside a [`TempDir`](crate::TempDir), and runs with `forceSync=no` (nothing here needs to survive
//! a power cut). Readiness, the leader and ZooKeeper's own view of sessions are asked of the servers with
//! four-letter words (`srvr`, `stat`, `dump`, `mntr`) over a plain [`TcpStream`], which keeps every method
//! synchronous, like [`EtcdServer`](crate::EtcdServer)'s, and needs no ZooKeeper client. What a server has in common
//! with an etcd member (start, kill, restart, pause, resume, drop) is written once in [`ensemble`](crate::ensemble);
//! [`ZooKeeper`] is what is ZooKeeper's own.
//!
//! # What the servers are told
//!
//! - `tickTime=500`, so ZooKeeper's default session bounds are 2 and 20 ticks: **a client's session timeout is clamped
//!   to 1–10 seconds**, whatever it asks for (kazoo asking for 30 s gets 10 s). A session expires within about a
//!   tick of its timeout: a frozen kazoo client's ephemeral node went 1.03, 2.12 and 4.09 s after the freeze with
//!   sessions of 1, 2 and 4 s. An ensemble has `initLimit=10` and `syncLimit=5` (a follower gives up on a silent
//!   leader after 2.5 s).
//! - The four-letter words allowed are those the harness asks (`srvr`, `stat`, `dump`, `mntr`), and `ruok` and `cons`.
//! - No admin server (it would take port 8080), no limit on connections per client address.
//!
//! # Readiness
//!
//! `ruok` says `imok` before a server serves. A server counts as serving once `srvr` answers with a `Mode:` line
//! (`standalone`, `leader` or `follower`) instead of "This ZooKeeper instance is not currently serving requests"; an
//! ensemble is ready when every running server serves and exactly one leads. Measured on two cores: a standalone
//! server serves 0.4–0.9 s after it was started, an ensemble 1.2–1.9 s, both up to 3 s while other JVMs start too
//! (most of it is the JVM starting); after a `SIGKILL` of the leader, the other two serve with a new one within
//! 0.2–0.6 s, and a restarted server serves again within 0.4–0.7 s.
//!
//! # Logs
//!
//! The Debian build has no logging backend on its class path and logs nothing. The harness adds slf4j-simple
//! (`/usr/share/java/slf4j-simple.jar`, from `libslf4j-java`) when it is there, logging at `info` to stderr, and sends
//! the server's stdout and stderr to a file in its directory, appended to across restarts (slf4j-simple's own
//! `logFile` would truncate it at every start). The log is printed to stderr, with the server's `stat`, when the
//! value is dropped during a panic. Without slf4j-simple the file holds only slf4j's warning that it found no backend.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::ensemble::{Ensemble, Member, Members, Standalone, Store};
use crate::server::free_port;

/// Debian's ZooKeeper (package `libzookeeper-java`, pulled in by `zookeeper`); its manifest names its dependencies.
const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
/// A logging backend for ZooKeeper's slf4j (package `libslf4j-java`).
const SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";
/// The entry points of a standalone server and of an ensemble's member.
const STANDALONE_MAIN: &str = "org.apache.zookeeper.server.ZooKeeperServerMain";
const QUORUM_MAIN: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";
/// Light JVM flags: starting the JVM is most of a server's start. No perf data, so that a `SIGKILL` leaves no
/// `/tmp/hsperfdata_*` file behind.
const JVM_FLAGS: &[&str] = &[
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
];
/// slf4j-simple's settings. The harness polls with `srvr`, and ZooKeeper logs every four-letter word it serves at
/// `info`: those two loggers are kept to warnings, or the log would be mostly polls.
const LOG_FLAGS: &[&str] = &[
    "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
    "-Dorg.slf4j.simpleLogger.showShortLogName=true",
    "-Dorg.slf4j.simpleLogger.log.org.apache.zookeeper.server.NIOServerCnxn=warn",
    "-Dorg.slf4j.simpleLogger.log.org.apache.zookeeper.server.command.AbstractFourLetterCommand=warn",
];
/// The part of the configuration every server shares (see the module docs).
const BASE_CONFIG: &str = "\
tickTime=500
initLimit=10
syncLimit=5
clientPortAddress=127.0.0.1
admin.enableServer=false
forceSync=no
maxClientCnxns=0
4lw.commands.whitelist=ruok,srvr,stat,mntr,cons,dump
";

/// The connect, write and read timeout of one four-letter word; a paused server accepts the connection (the kernel
/// does) and answers nothing.
const WORD_TIMEOUT: Duration = Duration::from_secs(2);
const CONFIG_FILE: &str = "zoo.cfg";

/// ZooKeeper's [`Store`]: what a server keeps besides its process and its client port. Its `myid` in an ensemble is
/// its index plus one (ZooKeeper wants 1 to 255).
#[derive(Debug, Clone, Default)]
pub struct ZooKeeper {
    /// The ports ensemble members talk to each other on (a follower to its leader, and elections); unused standalone.
    peer_port: u16,
    election_port: u16,
}

impl Store for ZooKeeper {
    const NAME: &'static str = "ZooKeeper";
    const MEMBER: &'static str = "ZooKeeper server";

    fn scheme(&self) -> &'static str {
        "zk"
    }

    fn take_peer_ports(&mut self, members: usize) {
        if members > 1 {
            self.peer_port = free_port();
            self.election_port = free_port();
        }
    }

    /// The `server.N=127.0.0.1:PEER:ELECTION` lines of an ensemble's configuration; empty standalone.
    fn peers(servers: &[Member<ZooKeeper>]) -> String {
        if servers.len() == 1 {
            return String::new();
        }
        servers
            .iter()
            .map(|s| {
                format!(
                    "server.{}=127.0.0.1:{}:{}\n",
                    s.index + 1,
                    s.own.peer_port,
                    s.own.election_port
                )
            })
            .collect()
    }

    /// Writes the configuration (`quorum`: the `server.N` lines of an ensemble, empty standalone) and runs the
    /// server.
    fn spawn(server: &mut Member<ZooKeeper>, quorum: &str) {
        assert!(
            Path::new(ZOOKEEPER_JAR).is_file(),
            "no {ZOOKEEPER_JAR}: run scripts/ensure-zookeeper.sh"
        );
        let data = server.daemon.dir().join("data");
        std::fs::create_dir_all(&data).expect("cannot create the ZooKeeper data directory");
        let main = if quorum.is_empty() {
            STANDALONE_MAIN
        } else {
            std::fs::write(data.join("myid"), format!("{}\n", server.index + 1))
                .expect("cannot write ZooKeeper's myid");
            QUORUM_MAIN
        };
        let config = format!(
            "{BASE_CONFIG}dataDir={}\nclientPort={}\n{quorum}",
            data.display(),
            server.client_port
        );
        let config_path = server.daemon.dir().join(CONFIG_FILE);
        std::fs::write(&config_path, config).expect("cannot write zoo.cfg");
        let mut command = Command::new("java");
        command
            .args(JVM_FLAGS)
            .args(LOG_FLAGS)
            .arg("-cp")
            .arg(class_path())
            .arg(main)
            .arg(&config_path)
            // A JVM that crashes writes hs_err_pid*.log into its working directory: keep it with the log.
            .current_dir(server.daemon.dir());
        let child = server
            .daemon
            .log_to(&mut command)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run java from PATH (scripts/ensure-zookeeper.sh installs it): {e}")
            });
        server.daemon.set_child(child);
    }

    /// Whether `srvr` answers with a `Mode:`.
    fn serves(server: &Member<ZooKeeper>) -> Result<(), String> {
        server.mode().map(drop)
    }

    /// The server that leads (or runs standalone), once every live server serves and exactly one leads.
    fn leader(servers: &[Member<ZooKeeper>]) -> Result<usize, String> {
        let mut leaders = Vec::new();
        for (i, server) in servers.iter().enumerate() {
            if !server.daemon.is_live() {
                continue;
            }
            match server.mode()?.as_str() {
                "leader" | "standalone" => leaders.push(i),
                _ => {}
            }
        }
        match leaders[..] {
            [leader] => Ok(leader),
            [] => Err("no server leads".to_owned()),
            _ => Err(format!("servers {leaders:?} all lead")),
        }
    }

    /// Every live server serves, and exactly one leads.
    fn ready(servers: &[Member<ZooKeeper>]) -> Result<(), String> {
        Self::leader(servers).map(drop)
    }

    /// Whether the server failed to bind a port: it exited, or its log says so while it keeps running (then it is
    /// killed).
    fn failed(server: &mut Member<ZooKeeper>, log_start: u64) -> Option<bool> {
        if let Some(addr_in_use) = server.daemon.exited(log_start) {
            return Some(addr_in_use);
        }
        if server.daemon.pid().is_none() || !server.daemon.says_addr_in_use(log_start) {
            return None;
        }
        server.daemon.kill();
        Some(true)
    }

    /// Its `stat`, if it is live.
    fn print_state(server: &Member<ZooKeeper>) {
        if !server.daemon.is_live() {
            return;
        }
        let stat = server
            .ask("stat")
            .unwrap_or_else(|e| format!("(no answer: {e})"));
        eprintln!(
            "--- its stat ---\n{}\n--- end of {} stat ---",
            stat.trim_end(),
            server.daemon.name()
        );
    }
}

impl Member<ZooKeeper> {
    /// The server's answer to the four-letter word `word`.
    fn ask(&self, word: &str) -> std::io::Result<String> {
        four_letter_word(self.addr(), word)
    }

    /// What `srvr` says the server is (`standalone`, `leader`, `follower`), or why it does not serve.
    fn mode(&self) -> Result<String, String> {
        let answer = self
            .ask("srvr")
            .map_err(|e| format!("server {} does not answer srvr: {e}", self.index))?;
        mode_of(&answer)
            .map(str::to_owned)
            .ok_or_else(|| format!("server {} does not serve: {}", self.index, answer.trim()))
    }
}

/// The class path: ZooKeeper, and slf4j-simple when it is installed. Looked for once per process.
fn class_path() -> &'static str {
    static CLASS_PATH: OnceLock<String> = OnceLock::new();
    CLASS_PATH.get_or_init(|| {
        if Path::new(SLF4J_SIMPLE_JAR).is_file() {
            format!("{ZOOKEEPER_JAR}:{SLF4J_SIMPLE_JAR}")
        } else {
            ZOOKEEPER_JAR.to_owned()
        }
    })
}

/// Sends the four-letter word `word` to the server at `addr` and reads its answer, up to the server closing the
/// connection. Every step is bounded by [`WORD_TIMEOUT`]; a timeout is reported as [`TimedOut`].
///
/// [`TimedOut`]: std::io::ErrorKind::TimedOut
fn four_letter_word(addr: SocketAddr, word: &str) -> std::io::Result<String> {
    let timed_out = |e: std::io::Error| {
        // A read timeout is EAGAIN on Unix: say what it means.
        if e.kind() == std::io::ErrorKind::WouldBlock {
            std::io::Error::new(std::io::ErrorKind::TimedOut, format!("no answer to {word}"))
        } else {
            e
        }
    };
    let mut stream = TcpStream::connect_timeout(&addr, WORD_TIMEOUT)?;
    stream.set_read_timeout(Some(WORD_TIMEOUT))?;
    stream.set_write_timeout(Some(WORD_TIMEOUT))?;
    stream.write_all(word.as_bytes()).map_err(timed_out)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).map_err(timed_out)?;
    Ok(answer)
}

/// The `Mode:` of a `srvr` or `stat` answer: none while the server does not serve.
fn mode_of(answer: &str) -> Option<&str> {
    answer
        .lines()
        .find_map(|line| line.strip_prefix("Mode: "))
        .map(str::trim)
}

/// The ephemeral-node part of a `dump` answer: from `Sessions with Ephemerals (N):` up to the connections.
fn ephemerals_of(dump: &str) -> &str {
    let start = dump
        .find("Sessions with Ephemerals")
        .unwrap_or_else(|| panic!("no ephemeral nodes in ZooKeeper's dump:\n{dump}"));
    let rest = &dump[start..];
    rest.find("Connections dump:")
        .map_or(rest, |end| &rest[..end])
}

/// The value of `name` in a `mntr` answer (`name<TAB>value` lines).
fn metric<'a>(mntr: &'a str, name: &str) -> Option<&'a str> {
    mntr.lines()
        .filter_map(|line| line.split_once('\t'))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.trim())
}

/// The count `name` of a `mntr` answer.
///
/// # Panics
///
/// If the answer has no such count.
fn count(mntr: &str, name: &str) -> usize {
    metric(mntr, name)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in ZooKeeper's mntr:\n{mntr}"))
}

impl Members<ZooKeeper> {
    /// `word`'s answer from the leader (or the standalone server), once there is one.
    fn ask_leader(&self, word: &str) -> String {
        let leader = self.wait_leader();
        self.members[leader]
            .ask(word)
            .unwrap_or_else(|e| panic!("the ZooKeeper leader does not answer {word}: {e}"))
    }

    fn ephemerals(&self) -> String {
        ephemerals_of(&self.ask_leader("dump")).to_owned()
    }

    fn session_count(&self) -> usize {
        count(&self.ask_leader("mntr"), "zk_global_sessions")
    }
}

/// One standalone ZooKeeper server on a private port of 127.0.0.1, with its data in a temporary directory: a
/// [`Standalone`] member, ready once it serves. Sessions are clamped to 1–10 seconds (see the [module docs](self)).
///
/// A [`restart`](Standalone::restart) keeps the znodes, and the sessions too: a session of before the kill lives on
/// (with its ephemeral nodes) if its client reconnects within its timeout, counted afresh from the restart. While
/// [`pause`](Standalone::pause)d, ZooKeeper's clock runs on (it times sessions on a monotonic clock): once resumed,
/// the sessions whose timeout passed meanwhile may expire before their clients' waiting pings are read.
///
/// [`Standalone`] says how it is dropped (with its `stat` printed on a panic) and how its methods block and wait, as
/// for [`EtcdServer`](crate::EtcdServer).
///
/// # Examples
///
/// ```no_run
/// use leasehold_tests::ZkServer;
///
/// let mut zk = ZkServer::start();
/// let url = zk.url(); // zk://127.0.0.1:PORT
/// zk.kill();
/// zk.restart(); // same port, same data
/// assert!(zk.srvr().unwrap().contains("Mode: standalone"));
/// ```
pub type ZkServer = Standalone<ZooKeeper>;

impl Standalone<ZooKeeper> {
    /// Starts a standalone server and waits until it serves.
    ///
    /// # Panics
    ///
    /// If `java` or ZooKeeper cannot be run, or the server does not serve within 20 seconds.
    pub fn start() -> ZkServer {
        Standalone::start_with(ZooKeeper::default())
    }

    /// The server's answer to `srvr`: its version, latencies, counts, `Zxid:`, `Mode: standalone` and `Node count:`,
    /// one per line; or "This ZooKeeper instance is not currently serving requests".
    ///
    /// # Errors
    ///
    /// If the server cannot be reached, or says nothing within 2 seconds ([`TimedOut`], as when it is paused).
    ///
    /// [`TimedOut`]: std::io::ErrorKind::TimedOut
    pub fn srvr(&self) -> std::io::Result<String> {
        self.member().ask("srvr")
    }

    /// The server's answer to `stat`: what [`srvr`](Self::srvr) says, and a `Clients:` list of its connections.
    ///
    /// # Errors
    ///
    /// As [`srvr`](Self::srvr).
    pub fn stat(&self) -> std::io::Result<String> {
        self.member().ask("stat")
    }

    /// The live sessions that hold ephemeral nodes and their nodes, as the `dump` four-letter word lists them:
    ///
    /// ```text
    /// Sessions with Ephemerals (1):
    /// 0x100000a8c1c0000:
    ///     /locks/a/lock-0000000000
    /// ```
    ///
    /// A session's id is in lowercase hex without leading zeros (as kazoo's `"0x%x" % client_id[0]` prints it),
    /// its nodes one a line after a tab, in no particular order.
    ///
    /// # Panics
    ///
    /// If the server does not serve within 20 seconds, or does not answer.
    pub fn ephemerals(&self) -> String {
        self.members.ephemerals()
    }

    /// How many sessions the server holds (`zk_global_sessions` of `mntr`).
    ///
    /// # Panics
    ///
    /// As [`ephemerals`](Self::ephemerals).
    pub fn session_count(&self) -> usize {
        self.members.session_count()
    }

    /// How many watches the server holds (`zk_watch_count` of `mntr`): a test waits for a client's watch to be set
    /// before it changes the watched node.
    ///
    /// # Panics
    ///
    /// If the server does not answer, or its `mntr` has no `zk_watch_count`.
    pub fn watch_count(&self) -> usize {
        let mntr = self
            .member()
            .ask("mntr")
            .unwrap_or_else(|e| panic!("ZooKeeper's mntr: {e}"));
        count(&mntr, "zk_watch_count")
    }
}

/// An ensemble of three ZooKeeper servers on private ports of 127.0.0.1, each with its data in a temporary directory:
/// an [`Ensemble`], ready once all of them serve, one as the leader. A server's `myid` is its index plus one.
///
/// Which one leads is up to ZooKeeper's election: [`leader`](Ensemble::leader) waits until every running server that
/// is not paused serves and exactly one of them says it leads (`srvr`'s `Mode:`); a paused leader is not asked, and
/// goes on believing it leads. A [`restart`](Ensemble::restart)ed server is ready once it serves: it has joined a
/// leader and caught up (so two servers must be running). If a [`pause`](Ensemble::pause)d server led, the other two
/// elect a new leader once they give up on it (`syncLimit`: measured 2.9 s after the pause); resumed, it learns so
/// and follows within a second.
///
/// [`Ensemble`] says how it is dropped (with every server's `stat` printed on a panic) and how its methods block and
/// wait, as for [`EtcdCluster`](crate::EtcdCluster).
///
/// # Examples
///
/// ```no_run
/// use leasehold_tests::ZkEnsemble;
///
/// let mut zk = ZkEnsemble::start();
/// let leader = zk.leader();
/// zk.kill(leader);
/// let next = zk.leader(); // waits for the other two to elect one and serve
/// assert_ne!(next, leader);
/// zk.restart(leader); // rejoins as a follower
/// ```
pub type ZkEnsemble = Ensemble<ZooKeeper>;

impl Ensemble<ZooKeeper> {
    /// Starts three servers and waits until all of them serve, one as the leader.
    ///
    /// # Panics
    ///
    /// If `java` or ZooKeeper cannot be run, or the ensemble does not serve within 20 seconds.
    pub fn start() -> ZkEnsemble {
        Ensemble::start_with(ZooKeeper::default())
    }

    /// Server `i`'s answer to `srvr`, with its `Mode:` (`leader` or `follower`).
    ///
    /// # Errors
    ///
    /// As [`ZkServer::srvr`].
    pub fn srvr(&self, i: usize) -> std::io::Result<String> {
        self.members.members[i].ask("srvr")
    }

    /// The live sessions that hold ephemeral nodes and their nodes, as [`ZkServer::ephemerals`], asked of the leader
    /// (every server that serves knows them).
    ///
    /// # Panics
    ///
    /// If there is no leader within 20 seconds, or it does not answer.
    pub fn ephemerals(&self) -> String {
        self.members.ephemerals()
    }

    /// How many sessions the ensemble holds, as the leader counts them (`zk_global_sessions` of `mntr`).
    ///
    /// # Panics
    ///
    /// As [`ephemerals`](Self::ephemerals).
    pub fn session_count(&self) -> usize {
        self.members.session_count()
    }
}

/// The path of a Python interpreter that can `import kazoo` (the reference ZooKeeper client, for interop tests): the
/// wrapper `target/kazoo-python` at the repository's root, python3 with kazoo installed beside it, which
/// `scripts/ensure-kazoo.sh` creates (with `pip install --target`, from PyPI) when it is missing. The script runs once per process.
///
/// # Panics
///
/// If the script fails, as when PyPI cannot be reached and the virtualenv is not there yet.
pub fn kazoo_python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let script =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ensure-kazoo.sh");
            let output = Command::new(&script)
                .stdin(Stdio::null())
                .output()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
            assert!(
                output.status.success(),
                "{} failed: {}",
                script.display(),
                String::from_utf8_lossy(&output.stderr)
            );
            PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_is_read_from_srvr_and_absent_while_not_serving() {
        let srvr = "Zookeeper version: 3.8.0\nZxid: 0x100000000\nMode: follower\nNode count: 5\n";
        assert_eq!(mode_of(srvr), Some("follower"));
        assert_eq!(
            mode_of("This ZooKeeper instance is not currently serving requests\n"),
            None
        );
    }

    #[test]
    fn the_ephemerals_are_cut_out_of_dump() {
        let dump = "SessionTracker dump:\nSession Sets (0)/(0):\nephemeral nodes dump:\n\
                    Sessions with Ephemerals (1):\n0x1000:\n\t/a\nConnections dump:\nConnections Sets (1)/(1):\n";
        assert_eq!(
            ephemerals_of(dump),
            "Sessions with Ephemerals (1):\n0x1000:\n\t/a\n"
        );
    }

    #[test]
    fn metrics_are_read_by_name() {
        let mntr = "zk_version\t3.8.0\nzk_global_sessions\t2\nzk_global_sessions_x\t9\n";
        assert_eq!(metric(mntr, "zk_global_sessions"), Some("2"));
        assert_eq!(metric(mntr, "zk_local_sessions"), None);
    }
}
