//! Private ZooKeeper servers for tests: [`ZkServer`] (standalone) and [`ZkEnsemble`] (three servers), run on `java`
//! from Debian's ZooKeeper 3.8.0 (`/usr/share/java/zookeeper.jar`: `scripts/ensure-zookeeper.sh` installs it).
//!
//! Each server listens on free ports of 127.0.0.1 (its client port; in an ensemble also a peer and an election port),
//! keeps its configuration and data inside a [`TempDir`](crate::TempDir), and runs with `forceSync=no` (nothing here needs to survive
//! a power cut). Readiness, the leader and ZooKeeper's own view of sessions are asked of the servers with
//! four-letter words (`srvr`, `stat`, `dump`, `mntr`) over a plain [`TcpStream`], which keeps every method
//! synchronous, like [`EtcdServer`](crate::EtcdServer)'s, and needs no ZooKeeper client.
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

use crate::daemon::{poll_until, restart_on_port, Daemon};
use crate::server::{free_port, START_ATTEMPTS};

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
/// The server's stdout and stderr, appended to across restarts.
const LOG_FILE: &str = "zookeeper.log";
const CONFIG_FILE: &str = "zoo.cfg";

/// One ZooKeeper server: its process, ports, and directory.
#[derive(Debug)]
struct Server {
    /// Its index in [`Servers`], as tests name it; its `myid` in an ensemble is one more (ZooKeeper wants 1 to 255).
    index: usize,
    /// The process; its directory holds `zoo.cfg`, `data/` and the log, kept across restarts, so a restarted server
    /// keeps its data.
    daemon: Daemon,
    client_port: u16,
    /// The ports ensemble members talk to each other on (a follower to its leader, and elections); unused standalone.
    peer_port: u16,
    election_port: u16,
}

impl Server {
    fn new(index: usize) -> Server {
        Server {
            index,
            daemon: Daemon::new(
                format!("ZooKeeper server {index}"),
                &format!("zk{index}"),
                LOG_FILE,
            ),
            client_port: 0,
            peer_port: 0,
            election_port: 0,
        }
    }

    fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.client_port))
    }

    fn log(&self) -> String {
        self.daemon.log()
    }

    fn log_len(&self) -> u64 {
        self.daemon.log_len()
    }

    /// Whether it runs and is not paused: whether asking it anything makes sense.
    fn is_live(&self) -> bool {
        self.daemon.is_live()
    }

    /// Writes the configuration (`quorum`: the `server.N` lines of an ensemble, empty standalone) and runs the
    /// server, without waiting for it: an ensemble's members must all run before any serves.
    fn spawn(&mut self, quorum: &str) {
        assert!(
            Path::new(ZOOKEEPER_JAR).is_file(),
            "no {ZOOKEEPER_JAR}: run scripts/ensure-zookeeper.sh"
        );
        let data = self.daemon.dir().join("data");
        std::fs::create_dir_all(&data).expect("cannot create the ZooKeeper data directory");
        let main = if quorum.is_empty() {
            STANDALONE_MAIN
        } else {
            std::fs::write(data.join("myid"), format!("{}\n", self.index + 1))
                .expect("cannot write ZooKeeper's myid");
            QUORUM_MAIN
        };
        let config = format!(
            "{BASE_CONFIG}dataDir={}\nclientPort={}\n{quorum}",
            data.display(),
            self.client_port
        );
        let config_path = self.daemon.dir().join(CONFIG_FILE);
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
            .current_dir(self.daemon.dir());
        let child = self
            .daemon
            .log_to(&mut command)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run java from PATH (scripts/ensure-zookeeper.sh installs it): {e}")
            });
        self.daemon.set_child(child);
    }

    /// `Some(true)` when the server failed to bind a port (it exited, or its log says so while it keeps running),
    /// `Some(false)` when it exited otherwise, `None` while it runs as it should. Only what the log grew by since
    /// `log_start` counts. A server that failed is killed.
    fn failed(&mut self, log_start: u64) -> Option<bool> {
        if let Some(addr_in_use) = self.daemon.exited(log_start) {
            return Some(addr_in_use);
        }
        if self.daemon.pid().is_none() || !self.daemon.says_addr_in_use(log_start) {
            return None;
        }
        self.kill();
        Some(true)
    }

    fn kill(&mut self) {
        self.daemon.kill();
    }

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

/// Servers with a common fate: started together, healed and dropped together. [`ZkServer`] is one of these that
/// runs standalone, [`ZkEnsemble`] three that form an ensemble.
#[derive(Debug)]
struct Servers {
    servers: Vec<Server>,
}

impl Servers {
    /// Starts `n` servers on free ports (standalone if `n` is 1) and waits until they serve with one leader; on a
    /// taken port, starts all of them again on fresh ports, a few times over.
    fn start(n: usize) -> Servers {
        let mut servers = Servers {
            servers: (0..n).map(Server::new).collect(),
        };
        for _ in 0..START_ATTEMPTS {
            for server in &mut servers.servers {
                server.client_port = free_port();
                if n > 1 {
                    server.peer_port = free_port();
                    server.election_port = free_port();
                }
            }
            let quorum = servers.quorum();
            let starts: Vec<u64> = servers.servers.iter().map(Server::log_len).collect();
            for server in &mut servers.servers {
                server.spawn(&quorum);
            }
            match servers.wait_ready(&starts) {
                Ok(()) => return servers,
                Err(true) => servers.servers.iter_mut().for_each(Server::kill),
                // Dropping `servers` while panicking prints the logs.
                Err(false) => panic!("ZooKeeper exited before it served"),
            }
        }
        panic!("ZooKeeper found its ports taken {START_ATTEMPTS} times in a row");
    }

    /// The `server.N=127.0.0.1:PEER:ELECTION` lines of an ensemble's configuration; empty standalone.
    fn quorum(&self) -> String {
        if self.servers.len() == 1 {
            return String::new();
        }
        self.servers
            .iter()
            .map(|s| {
                format!(
                    "server.{}=127.0.0.1:{}:{}\n",
                    s.index + 1,
                    s.peer_port,
                    s.election_port
                )
            })
            .collect()
    }

    /// Waits until the servers serve with one leader; `Err(addr_in_use)` if one failed first.
    fn wait_ready(&mut self, log_starts: &[u64]) -> Result<(), bool> {
        poll_until("ZooKeeper serving", || {
            for (server, &start) in self.servers.iter_mut().zip(log_starts) {
                if let Some(addr_in_use) = server.failed(start) {
                    return Ok(Err(addr_in_use));
                }
            }
            self.serving_leader().map(|_| Ok(()))
        })
    }

    /// The index of the server that leads (or runs standalone), once every live server serves and exactly one leads.
    fn serving_leader(&self) -> Result<usize, String> {
        let mut leaders = Vec::new();
        for (i, server) in self.servers.iter().enumerate() {
            if !server.is_live() {
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

    /// [`serving_leader`](Self::serving_leader), polled until it holds.
    fn wait_leader(&self) -> usize {
        poll_until("ZooKeeper leader", || self.serving_leader())
    }

    fn endpoints(&self) -> Vec<String> {
        self.servers.iter().map(Server::endpoint).collect()
    }

    fn url(&self) -> String {
        format!("zk://{}", self.endpoints().join(","))
    }

    fn pid(&self, i: usize) -> Option<u32> {
        self.servers[i].daemon.pid()
    }

    /// Kills server `i` if it runs, starts it again on its ports with its directory, and waits until it serves.
    fn restart(&mut self, i: usize) {
        self.servers[i].kill();
        let quorum = self.quorum();
        let name = self.servers[i].daemon.name().to_owned();
        restart_on_port(&name, || {
            let start = self.servers[i].log_len();
            self.servers[i].spawn(&quorum);
            self.wait_serving(i, start)
        });
    }

    /// Waits until server `i` serves; `Err(addr_in_use)` if it failed first.
    fn wait_serving(&mut self, i: usize, log_start: u64) -> Result<(), bool> {
        let server = &mut self.servers[i];
        poll_until("ZooKeeper serving", || match server.failed(log_start) {
            Some(addr_in_use) => Ok(Err(addr_in_use)),
            None => server.mode().map(|_| Ok(())),
        })
    }

    /// Stops server `i` with `SIGSTOP`, and returns once the kernel reports it stopped: the signal is delivered
    /// asynchronously, and a JVM that still runs for a moment would answer what a test sends it next.
    fn pause(&mut self, i: usize) {
        self.servers[i].daemon.pause();
    }

    fn resume(&mut self, i: usize) {
        self.servers[i].daemon.resume();
    }

    /// `word`'s answer from the leader (or the standalone server), once there is one.
    fn ask_leader(&self, word: &str) -> String {
        let leader = self.wait_leader();
        self.servers[leader]
            .ask(word)
            .unwrap_or_else(|e| panic!("the ZooKeeper leader does not answer {word}: {e}"))
    }

    fn ephemerals(&self) -> String {
        ephemerals_of(&self.ask_leader("dump")).to_owned()
    }

    fn session_count(&self) -> usize {
        let mntr = self.ask_leader("mntr");
        metric(&mntr, "zk_global_sessions")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no zk_global_sessions in ZooKeeper's mntr:\n{mntr}"))
    }

    fn print_logs_if_panicking(&self) {
        if !std::thread::panicking() {
            return;
        }
        for server in &self.servers {
            let stat = if server.daemon.is_paused() {
                "(paused)".to_owned()
            } else if server.daemon.pid().is_none() {
                "(killed)".to_owned()
            } else {
                server
                    .ask("stat")
                    .unwrap_or_else(|e| format!("(no answer: {e})"))
            };
            let (i, port) = (server.index, server.client_port);
            eprint!(
                "--- ZooKeeper server {i} log (client port {port}) ---\n{}",
                server.log()
            );
            eprintln!(
                "--- its stat ---\n{}\n--- end of ZooKeeper server {i} ---",
                stat.trim_end()
            );
        }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.print_logs_if_panicking();
        // SIGKILL works on a stopped process too.
        self.servers.iter_mut().for_each(Server::kill);
    }
}

/// One standalone ZooKeeper server on a private port of 127.0.0.1, with its data in a temporary directory.
///
/// Dropping the value kills the server with `SIGKILL`, reaps it and removes its directory; if the thread is
/// panicking, its log and its `stat` are printed to stderr first. All methods block the calling thread; those that
/// wait panic with a message when ZooKeeper cannot be run or does not serve within 20 seconds. Sessions are clamped
/// to 1–10 seconds (see the [module docs](self)).
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
#[derive(Debug)]
pub struct ZkServer {
    servers: Servers,
}

impl ZkServer {
    /// Starts a standalone server and waits until it serves.
    ///
    /// # Panics
    ///
    /// If `java` or ZooKeeper cannot be run, or the server does not serve within 20 seconds.
    pub fn start() -> ZkServer {
        ZkServer {
            servers: Servers::start(1),
        }
    }

    /// `127.0.0.1:PORT`, the client endpoint.
    pub fn endpoint(&self) -> String {
        self.servers.servers[0].endpoint()
    }

    /// `zk://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.servers.url()
    }

    /// The client endpoint as an address, for a [`TcpProxy`](crate::TcpProxy) in front of it.
    pub fn addr(&self) -> SocketAddr {
        self.servers.servers[0].addr()
    }

    /// The server's process id, or `None` while it is killed.
    pub fn pid(&self) -> Option<u32> {
        self.servers.pid(0)
    }

    /// Kills the server with `SIGKILL` and reaps it. Does nothing if it is already killed.
    pub fn kill(&mut self) {
        self.servers.servers[0].kill();
    }

    /// Kills the server if it runs, starts it again on the same port with the same data directory, and waits until
    /// it serves. Znodes survive, and so do sessions: a session of before the kill lives on (with its ephemeral
    /// nodes) if its client reconnects within its timeout, counted afresh from the restart.
    ///
    /// # Panics
    ///
    /// If it does not serve within 20 seconds.
    pub fn restart(&mut self) {
        self.servers.restart(0);
    }

    /// Stops the server with `SIGSTOP`: it keeps its connections and its port (the kernel still accepts
    /// connections) but answers nothing. ZooKeeper times sessions on a monotonic clock, which runs on while the
    /// process is stopped: once resumed, the sessions whose timeout passed meanwhile may expire before their
    /// clients' waiting pings are read.
    ///
    /// # Panics
    ///
    /// If it is not running.
    pub fn pause(&mut self) {
        self.servers.pause(0);
    }

    /// Continues a paused server with `SIGCONT`.
    ///
    /// # Panics
    ///
    /// If it is not running.
    pub fn resume(&mut self) {
        self.servers.resume(0);
    }

    /// Everything the server logged so far, across restarts.
    pub fn log(&self) -> String {
        self.servers.servers[0].log()
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
        self.servers.servers[0].ask("srvr")
    }

    /// The server's answer to `stat`: what [`srvr`](Self::srvr) says, and a `Clients:` list of its connections.
    ///
    /// # Errors
    ///
    /// As [`srvr`](Self::srvr).
    pub fn stat(&self) -> std::io::Result<String> {
        self.servers.servers[0].ask("stat")
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
        self.servers.ephemerals()
    }

    /// How many sessions the server holds (`zk_global_sessions` of `mntr`).
    ///
    /// # Panics
    ///
    /// As [`ephemerals`](Self::ephemerals).
    pub fn session_count(&self) -> usize {
        self.servers.session_count()
    }

    /// How many watches the server holds (`zk_watch_count` of `mntr`): a test waits for a client's watch to be set
    /// before it changes the watched node.
    ///
    /// # Panics
    ///
    /// If the server does not answer, or its `mntr` has no `zk_watch_count`.
    pub fn watch_count(&self) -> usize {
        let mntr = self.servers.servers[0]
            .ask("mntr")
            .unwrap_or_else(|e| panic!("ZooKeeper's mntr: {e}"));
        metric(&mntr, "zk_watch_count")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no zk_watch_count in ZooKeeper's mntr:\n{mntr}"))
    }
}

/// An ensemble of three ZooKeeper servers on private ports of 127.0.0.1, each with its data in a temporary directory.
///
/// Servers are addressed by index, `0..3` (their `myid` is one more). Which one leads is up to ZooKeeper's election:
/// ask [`leader`](Self::leader). Dropping the value kills every server with `SIGKILL` and removes their directories;
/// if the thread is panicking, every server's log and `stat` are printed to stderr first. All methods block the
/// calling thread; those that wait panic with a message when ZooKeeper cannot be run or a wait does not end within 20
/// seconds.
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
#[derive(Debug)]
pub struct ZkEnsemble {
    servers: Servers,
}

impl ZkEnsemble {
    /// Starts three servers and waits until all of them serve, one as the leader.
    ///
    /// # Panics
    ///
    /// If `java` or ZooKeeper cannot be run, or the ensemble does not serve within 20 seconds.
    pub fn start() -> ZkEnsemble {
        ZkEnsemble {
            servers: Servers::start(3),
        }
    }

    /// `127.0.0.1:PORT` of every server's client port, in index order, killed ones included.
    pub fn endpoints(&self) -> Vec<String> {
        self.servers.endpoints()
    }

    /// `zk://127.0.0.1:P0,127.0.0.1:P1,127.0.0.1:P2`.
    pub fn url(&self) -> String {
        self.servers.url()
    }

    /// The client endpoint of server `i` as an address, for a [`TcpProxy`](crate::TcpProxy) in front of it.
    ///
    /// # Panics
    ///
    /// If `i` is not below 3, as do all methods that take a server index.
    pub fn addr(&self, i: usize) -> SocketAddr {
        self.servers.servers[i].addr()
    }

    /// The process id of server `i`, or `None` while it is killed.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.servers.pid(i)
    }

    /// The index of the leader, once every running server that is not paused serves and exactly one of them says
    /// it leads (`srvr`'s `Mode:`): after a kill of the leader this waits for the other two to elect one and serve.
    /// A paused leader is not asked, and goes on believing it leads.
    ///
    /// # Panics
    ///
    /// If that does not happen within 20 seconds.
    pub fn leader(&self) -> usize {
        self.servers.wait_leader()
    }

    /// Kills server `i` with `SIGKILL` and reaps it, without waiting for the others to notice. Does nothing if it is
    /// already killed.
    pub fn kill(&mut self, i: usize) {
        self.servers.servers[i].kill();
    }

    /// Kills server `i` if it runs, starts it again on its ports with its data directory, and waits until it
    /// serves: it has joined a leader and caught up (so two servers must be running).
    ///
    /// # Panics
    ///
    /// If it does not serve within 20 seconds.
    pub fn restart(&mut self, i: usize) {
        self.servers.restart(i);
    }

    /// Stops server `i` with `SIGSTOP`: it keeps its connections but answers nothing, so its clients hear nothing
    /// until they move to another server. If it led, the other two elect a new leader once they give up on it
    /// (`syncLimit`: measured 2.9 s after the pause); resumed, it learns so and follows within a second.
    ///
    /// # Panics
    ///
    /// If it is not running.
    pub fn pause(&mut self, i: usize) {
        self.servers.pause(i);
    }

    /// Continues server `i` with `SIGCONT`.
    ///
    /// # Panics
    ///
    /// If it is not running.
    pub fn resume(&mut self, i: usize) {
        self.servers.resume(i);
    }

    /// Everything server `i` logged so far, across restarts.
    pub fn log(&self, i: usize) -> String {
        self.servers.servers[i].log()
    }

    /// Server `i`'s answer to `srvr`, with its `Mode:` (`leader` or `follower`).
    ///
    /// # Errors
    ///
    /// As [`ZkServer::srvr`].
    pub fn srvr(&self, i: usize) -> std::io::Result<String> {
        self.servers.servers[i].ask("srvr")
    }

    /// The live sessions that hold ephemeral nodes and their nodes, as [`ZkServer::ephemerals`], asked of the leader
    /// (every server that serves knows them).
    ///
    /// # Panics
    ///
    /// If there is no leader within 20 seconds, or it does not answer.
    pub fn ephemerals(&self) -> String {
        self.servers.ephemerals()
    }

    /// How many sessions the ensemble holds, as the leader counts them (`zk_global_sessions` of `mntr`).
    ///
    /// # Panics
    ///
    /// As [`ephemerals`](Self::ephemerals).
    pub fn session_count(&self) -> usize {
        self.servers.session_count()
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
