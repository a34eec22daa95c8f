//! A local Sentinel set: one primary, two replicas, three sentinels, and faults on demand.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cluster::{info_field, poll_until, try_connect};
use crate::server::{free_port, read_lossy, SpawnError, ADDR_IN_USE, START_ATTEMPTS};
use crate::{server_binary, ChildGuard, RedisServer, TempDir};

/// The name under which the sentinels monitor the primary.
pub const SERVICE: &str = "leasehold-test";

/// A primary and two replicas.
const DATA_NODES: usize = 3;
const SENTINELS: usize = 3;
/// How many sentinels must agree that the primary is down before one of them fails over.
const QUORUM: usize = 2;
/// How long the primary must be silent before a sentinel thinks it is down.
const DOWN_AFTER: Duration = Duration::from_millis(1000);
/// After a failed failover, how long the sentinels wait before trying again (and other
/// timeouts of the failover state machine).
const FAILOVER_TIMEOUT: Duration = Duration::from_millis(5000);
/// The configuration of every data node, after [`RedisServer`]'s defaults (`--save ""`,
/// `--appendonly no`, …). Replicas are made with `REPLICAOF` rather than an argument, so that
/// a restarted node comes back as a primary, as a real crashed-and-restarted one would.
const DATA_ARGS: [&str; 4] = [
    "--enable-debug-command",
    "local",
    // Without it a replica waits 5 s for company before its first full sync.
    "--repl-diskless-sync-delay",
    "0",
];

/// What a sentinel logs once it listens and monitors the primary. (A sentinel does not log
/// `Ready to accept connections`.)
const SENTINEL_READY: &str = "+monitor master";
/// How long a sentinel may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a starting sentinel's log is read.
const START_POLL: Duration = Duration::from_millis(5);
/// Connect, read and write timeout of the helper connections.
const HELPER_TIMEOUT: Duration = Duration::from_secs(5);
const CONF_FILE: &str = "sentinel.conf";
const LOG_FILE: &str = "sentinel.log";
const STDERR_FILE: &str = "stderr.log";

/// A local Sentinel set: three data nodes (`redis-server`, or whatever [`server_binary`] names,
/// on free ports of 127.0.0.1, at first node 0 the primary and nodes 1 and 2 its replicas) and
/// three sentinels (the same program with `--sentinel`) monitoring them as [`SERVICE`] with a
/// quorum of 2, `down-after-milliseconds 1000` and `failover-timeout 5000`.
///
/// Data nodes are addressed by index, `0..3`, sentinels by index `0..3` too. Which data node is
/// the primary changes with failovers: ask [`primary`](Self::primary).
///
/// Dropping the value kills every process with `SIGKILL` (the sentinels first) and removes
/// their directories; if the thread is panicking, their logs are printed to stderr first.
///
/// All methods block the calling thread, and panic with a message that says what went wrong
/// when a process cannot be reached or a change does not settle within 30 seconds.
///
/// # Examples
///
/// ```no_run
/// use leasehold_tests::SentinelSet;
///
/// let mut set = SentinelSet::start();
/// let old = set.primary();
/// set.kill(old);
/// let new = set.wait_new_primary(old);
/// assert_ne!(new, old);
/// set.restart(old); // an empty primary until the sentinels demote it
/// ```
#[derive(Debug)]
pub struct SentinelSet {
    nodes: Vec<RedisServer>,
    sentinels: Vec<Sentinel>,
}

impl SentinelSet {
    /// Starts the data nodes, makes nodes 1 and 2 replicas of node 0, starts the sentinels, and
    /// waits until every sentinel names node 0 as the primary and sees both replicas (with
    /// their links up) and the two other sentinels.
    ///
    /// # Panics
    ///
    /// If the server program cannot be run, a process does not start, or the set does not
    /// settle within 30 seconds.
    pub fn start() -> SentinelSet {
        let nodes: Vec<RedisServer> = (0..DATA_NODES)
            .map(|_| RedisServer::start_with(&DATA_ARGS))
            .collect();
        let mut set = SentinelSet {
            nodes,
            sentinels: Vec::new(),
        };
        let primary_port = set.port(0);
        for i in 1..DATA_NODES {
            let _: () = redis::cmd("REPLICAOF")
                .arg("127.0.0.1")
                .arg(primary_port)
                .query(&mut set.connection(i))
                .unwrap_or_else(|e| panic!("REPLICAOF on node {i}: {e}"));
        }
        // Linked before the sentinels start: a sentinel learns the replicas from the primary's
        // INFO, which it asks for at once and then only every 10 seconds.
        poll_until("the replicas to link", || {
            (1..DATA_NODES).try_for_each(|i| {
                let link = set.info_field(i, "master_link_status")?;
                match link.as_deref() {
                    Some("up") => Ok(()),
                    _ => Err(format!("node {i} reports master_link_status {link:?}")),
                }
            })
        });
        set.sentinels = (0..SENTINELS)
            .map(|_| Sentinel::start(primary_port))
            .collect();
        poll_until("the sentinels to see every node", || set.settled());
        set
    }

    /// `redis+sentinel://127.0.0.1:S0,127.0.0.1:S1,127.0.0.1:S2/leasehold-test`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|sentinel| format!("127.0.0.1:{}", sentinel.port))
            .collect();
        format!("redis+sentinel://{}/{SERVICE}", hosts.join(","))
    }

    /// The addresses of the three sentinels.
    pub fn sentinel_addrs(&self) -> Vec<SocketAddr> {
        self.sentinels
            .iter()
            .map(|sentinel| SocketAddr::from((Ipv4Addr::LOCALHOST, sentinel.port)))
            .collect()
    }

    /// The name of the monitored service: [`SERVICE`].
    pub fn service(&self) -> &'static str {
        SERVICE
    }

    /// The port of data node `i`. It stays the same across [`restart`](Self::restart).
    ///
    /// # Panics
    ///
    /// If `i` is not below 3, as do all methods that take a data node's index.
    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].port()
    }

    /// The process id of data node `i`, or `None` while it is killed.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].pid()
    }

    /// A new synchronous connection to data node `i`, with 5-second connect, read and write
    /// timeouts.
    ///
    /// # Panics
    ///
    /// If the node cannot be reached.
    pub fn connection(&self, i: usize) -> redis::Connection {
        self.nodes[i].connection()
    }

    /// Everything data node `i` wrote to its log so far, across restarts.
    pub fn log(&self, i: usize) -> String {
        self.nodes[i].log()
    }

    /// The port of sentinel `j`.
    ///
    /// # Panics
    ///
    /// If `j` is not below 3, as do all methods that take a sentinel's index.
    pub fn sentinel_port(&self, j: usize) -> u16 {
        self.sentinels[j].port
    }

    /// A new synchronous connection to sentinel `j`, with 5-second connect, read and write
    /// timeouts.
    ///
    /// # Panics
    ///
    /// If the sentinel cannot be reached.
    pub fn sentinel_connection(&self, j: usize) -> redis::Connection {
        let port = self.sentinel_port(j);
        try_connect(port).unwrap_or_else(|e| panic!("sentinel {j}: {e}"))
    }

    /// Kills data node `i` with `SIGKILL` and reaps it, without waiting for the sentinels to
    /// notice. Does nothing if it is already killed.
    ///
    /// If it was the primary, the sentinels fail over after about two seconds: see
    /// [`wait_new_primary`](Self::wait_new_primary).
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Kills data node `i` if it runs and starts it again on the same port, and returns once
    /// it accepts connections.
    ///
    /// Its data set starts empty and it comes back as a primary (of nothing), writable, until
    /// the sentinels notice and make it a replica of the current primary: about ten seconds
    /// for an old primary.
    ///
    /// # Panics
    ///
    /// If the node does not come back.
    pub fn restart(&mut self, i: usize) {
        self.nodes[i].restart();
    }

    /// The data node the sentinels name as primary (`SENTINEL GET-MASTER-ADDR-BY-NAME`),
    /// asking them in order and taking the first answer, as a client does.
    ///
    /// # Panics
    ///
    /// If no sentinel answers, or the one that does names an address that is not a data node.
    pub fn primary(&self) -> usize {
        let mut errors = Vec::new();
        for j in 0..SENTINELS {
            match self.named_primary(j) {
                Ok(port) => return self.index_of(port),
                Err(e) => errors.push(e),
            }
        }
        panic!("no sentinel names a primary: {}", errors.join("; "));
    }

    /// Asks sentinel 0 to fail over (`SENTINEL FAILOVER leasehold-test`), waits until every
    /// sentinel names another data node as primary and that node's role is `master`, and
    /// returns its index.
    ///
    /// The old primary is demoted to a replica shortly after; this does not wait for it.
    ///
    /// # Panics
    ///
    /// If the sentinel refuses (for instance with `NOGOODSLAVE` while no replica is linked),
    /// or no new primary is agreed on within 30 seconds.
    pub fn failover(&mut self) -> usize {
        let old = self.primary();
        let _: () = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(SERVICE)
            .query(&mut self.sentinel_connection(0))
            .unwrap_or_else(|e| panic!("SENTINEL FAILOVER: {e}"));
        self.wait_new_primary(old)
    }

    /// Waits until every sentinel names a data node other than `old` as primary, and that
    /// node's role is `master`, and returns its index.
    ///
    /// Call it after [`kill`](Self::kill)ing the primary: the sentinels need the
    /// down-after time (1 s) to agree it is down, then elect a leader and promote a replica.
    ///
    /// # Panics
    ///
    /// If that does not happen within 30 seconds.
    pub fn wait_new_primary(&self, old: usize) -> usize {
        poll_until(&format!("a primary other than node {old}"), || {
            let mut named = None;
            for j in 0..SENTINELS {
                let port = self.named_primary(j)?;
                match named {
                    Some(agreed) if agreed != port => {
                        return Err(format!(
                            "sentinels name ports {agreed} and {port} as primary"
                        ));
                    }
                    _ => named = Some(port),
                }
            }
            let new = self.index_of(named.expect("there are sentinels"));
            if new == old {
                return Err(format!("the sentinels still name node {old}"));
            }
            let role = self.info_field(new, "role")?;
            match role.as_deref() {
                Some("master") => Ok(new),
                _ => Err(format!("node {new} reports role {role:?}")),
            }
        })
    }

    /// Sends `DEBUG SLEEP` to data node `i`, which then answers nobody for `duration`,
    /// without waiting for it: the command is written before this returns, and the returned
    /// thread reads the reply.
    ///
    /// A sleeping primary looks dead to the sentinels; with a `duration` past the down-after
    /// time (1 s) they fail over while it sleeps, and it wakes up as a second primary: a split
    /// brain on demand.
    ///
    /// # Panics
    ///
    /// If the node cannot be reached. The thread panics if the node refuses the command
    /// (not if the node is killed while it sleeps).
    pub fn debug_sleep(&self, i: usize, duration: Duration) -> JoinHandle<()> {
        let mut con = self.connection(i);
        con.set_read_timeout(Some(duration + HELPER_TIMEOUT))
            .expect("a non-zero timeout is valid");
        let command = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(duration.as_secs_f64())
            .get_packed_command();
        con.send_packed_command(&command)
            .unwrap_or_else(|e| panic!("sending DEBUG SLEEP to node {i}: {e}"));
        std::thread::spawn(move || match con.recv_response() {
            Ok(redis::Value::ServerError(e)) => panic!("DEBUG SLEEP on node {i}: {e:?}"),
            Err(e) if !(e.is_io_error() || e.is_connection_dropped()) => {
                panic!("DEBUG SLEEP on node {i}: {e}")
            }
            _ => {}
        })
    }

    /// The port sentinel `j` names as the primary.
    fn named_primary(&self, j: usize) -> Result<u16, String> {
        let mut con = try_connect(self.sentinel_port(j))?;
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(SERVICE)
            .query(&mut con)
            .map_err(|e| format!("sentinel {j}: {e}"))?;
        addr.map(|(_, port)| port)
            .ok_or_else(|| format!("sentinel {j} does not know {SERVICE}"))
    }

    /// The index of the data node listening on `port`.
    fn index_of(&self, port: u16) -> usize {
        (0..DATA_NODES)
            .find(|&i| self.port(i) == port)
            .unwrap_or_else(|| panic!("port {port} is not a data node of this set"))
    }

    /// A field of `INFO replication` of data node `i`.
    fn info_field(&self, i: usize, field: &str) -> Result<Option<String>, String> {
        let mut con = try_connect(self.port(i))?;
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut con)
            .map_err(|e| format!("INFO on node {i}: {e}"))?;
        Ok(info_field(&info, field).map(str::to_owned))
    }

    /// `Ok` once every sentinel names node 0 as primary and sees two healthy replicas and two
    /// other sentinels; otherwise why not.
    fn settled(&self) -> Result<(), String> {
        for j in 0..SENTINELS {
            let primary = self.named_primary(j)?;
            if primary != self.port(0) {
                return Err(format!("sentinel {j} names port {primary}"));
            }
            let mut con = try_connect(self.sentinel_port(j))?;
            let replicas = sentinel_peers(&mut con, "REPLICAS")?;
            let linked = replicas
                .iter()
                .filter(|replica| {
                    replica.get("master-link-status").map(String::as_str) == Some("ok")
                })
                .count();
            if linked != DATA_NODES - 1 {
                return Err(format!("sentinel {j} sees {linked} linked replicas"));
            }
            let sentinels = sentinel_peers(&mut con, "SENTINELS")?.len();
            if sentinels != SENTINELS - 1 {
                return Err(format!("sentinel {j} sees {sentinels} other sentinels"));
            }
        }
        Ok(())
    }
}

impl Drop for SentinelSet {
    fn drop(&mut self) {
        // The sentinels first, so that they do not fail over while the data nodes go. Each
        // process's own drop prints its log (while panicking) and removes its directory.
        for sentinel in &mut self.sentinels {
            sentinel.kill();
        }
        for node in &mut self.nodes {
            node.kill();
        }
    }
}

/// `SENTINEL REPLICAS` or `SENTINEL SENTINELS` of [`SERVICE`], leaving out the peers flagged
/// down or disconnected.
fn sentinel_peers(
    con: &mut redis::Connection,
    which: &str,
) -> Result<Vec<HashMap<String, String>>, String> {
    let peers: Vec<HashMap<String, String>> = redis::cmd("SENTINEL")
        .arg(which)
        .arg(SERVICE)
        .query(con)
        .map_err(|e| format!("SENTINEL {which}: {e}"))?;
    Ok(peers
        .into_iter()
        .filter(|peer| {
            let flags = peer.get("flags").map_or("", String::as_str);
            !flags.contains("down") && !flags.contains("disconnected")
        })
        .collect())
}

/// One `redis-server --sentinel` process (the [`server_binary`]) with its own directory, config
/// file and log.
#[derive(Debug)]
struct Sentinel {
    port: u16,
    /// `None` while killed; dropping the guard kills and reaps the process.
    child: Option<ChildGuard>,
    dir: TempDir,
}

impl Sentinel {
    /// Writes a sentinel.conf that monitors the primary on `primary_port`, and runs a
    /// sentinel with it on a free port.
    fn start(primary_port: u16) -> Sentinel {
        let dir = TempDir::new("sentinel");
        // The sentinel rewrites its config file (its id, the peers it found, the current
        // primary), so it must be writable and its own.
        let conf = format!(
            "bind 127.0.0.1\n\
             protected-mode no\n\
             dir \"{dir}\"\n\
             logfile \"{log}\"\n\
             sentinel monitor {SERVICE} 127.0.0.1 {primary_port} {QUORUM}\n\
             sentinel down-after-milliseconds {SERVICE} {down_after}\n\
             sentinel failover-timeout {SERVICE} {failover_timeout}\n",
            dir = dir.path().display(),
            log = dir.path().join(LOG_FILE).display(),
            down_after = DOWN_AFTER.as_millis(),
            failover_timeout = FAILOVER_TIMEOUT.as_millis(),
        );
        std::fs::write(dir.path().join(CONF_FILE), conf)
            .unwrap_or_else(|e| panic!("cannot write sentinel.conf: {e}"));
        let mut sentinel = Sentinel {
            port: 0,
            child: None,
            dir,
        };
        for _ in 0..START_ATTEMPTS {
            sentinel.port = free_port();
            match sentinel.spawn() {
                Ok(()) => return sentinel,
                Err(SpawnError::AddrInUse) => continue,
                // Dropping `sentinel` while panicking prints its log.
                Err(SpawnError::Failed(why)) => panic!("sentinel did not start: {why}"),
            }
        }
        panic!("sentinel found its port taken {START_ATTEMPTS} times in a row");
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join(LOG_FILE)
    }

    /// Runs the sentinel on `self.port` and waits until it monitors the primary, or is gone.
    fn spawn(&mut self) -> Result<(), SpawnError> {
        let log_path = self.log_path();
        // Only what this run logs tells whether this run is ready.
        let log_start = std::fs::metadata(&log_path).map_or(0, |m| m.len());
        let stderr = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(STDERR_FILE))
            .expect("cannot create the stderr file of the sentinel");
        let program = server_binary();
        let child = Command::new(program)
            .arg(self.dir.path().join(CONF_FILE))
            .arg("--sentinel")
            .arg("--port")
            .arg(self.port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {}: {e}",
                    std::path::Path::new(program).display()
                )
            });
        let child = self.child.insert(ChildGuard::new(child));

        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if read_lossy(&log_path, log_start).contains(SENTINEL_READY) {
                return Ok(());
            }
            if let Some(status) = child.try_wait().expect("try_wait on the sentinel") {
                self.child = None;
                // The process is gone, so its log is complete.
                return Err(if read_lossy(&log_path, log_start).contains(ADDR_IN_USE) {
                    SpawnError::AddrInUse
                } else {
                    SpawnError::Failed(format!("it exited with {status} before it was ready"))
                });
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(SpawnError::Failed(format!(
                    "it was not ready after {START_TIMEOUT:?}"
                )));
            }
            std::thread::sleep(START_POLL);
        }
    }

    fn kill(&mut self) {
        self.child = None;
    }

    /// Everything the sentinel wrote to its log and to stderr.
    fn log(&self) -> String {
        let mut log = read_lossy(self.log_path(), 0);
        let stderr = read_lossy(self.dir.path().join(STDERR_FILE), 0);
        if !stderr.trim().is_empty() {
            log.push_str("--- stderr ---\n");
            log.push_str(&stderr);
        }
        log
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- sentinel log (port {}) ---\n{}--- end of sentinel log ---",
                self.port,
                self.log()
            );
        }
        self.kill();
    }
}
