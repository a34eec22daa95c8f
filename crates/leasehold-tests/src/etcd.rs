//! Private etcd members for tests: [`EtcdServer`] (one member) and [`EtcdCluster`] (three), run from the `etcd` on
//! `PATH` (Debian's 3.4.23: `scripts/ensure-etcd.sh` installs it).
//!
//! Each member listens on two free ports of 127.0.0.1 (client and peer), keeps its data directory inside a
//! [`TempDir`](crate::TempDir), runs with `--unsafe-no-fsync` (nothing here needs to survive a power cut, and fsync is most of a
//! write's cost), and writes its log to a file that is printed to stderr when the value is dropped during a panic.
//! Readiness, health and the leader are asked of the members with `etcdctl`, which keeps every method synchronous,
//! like [`RedisServer`](crate::RedisServer)'s, and so callable from inside an async test without nesting runtimes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::daemon::{poll_until, restart_on_port, Daemon};
use crate::server::{free_port, START_ATTEMPTS};

/// `etcdctl`'s dial and command timeouts for one poll; short, since the poll is repeated.
const CTL_TIMEOUT: &str = "1s";
/// The log of a member, appended to across restarts (etcd 3.4 logs to stderr).
const LOG_FILE: &str = "etcd.log";

/// The TLS files of a member that speaks TLS to its clients (see [`EtcdServer::start_tls`]).
#[derive(Debug, Clone)]
struct MemberTls {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    /// A client certificate signed by the CA, when the member requires one (and `etcdctl` presents it).
    client: Option<(PathBuf, PathBuf)>,
}

impl MemberTls {
    /// `etcdctl`'s flags for talking to the member.
    fn ctl_args(&self) -> Vec<String> {
        let mut args = vec![format!("--cacert={}", self.ca.display())];
        if let Some((cert, key)) = &self.client {
            args.push(format!("--cert={}", cert.display()));
            args.push(format!("--key={}", key.display()));
        }
        args
    }
}

/// One etcd member: its process, ports, and data directory.
#[derive(Debug)]
struct Member {
    name: String,
    /// The process; its directory holds `data/` and the log, kept across restarts, so a restarted member keeps its
    /// identity and its data.
    daemon: Daemon,
    client_port: u16,
    peer_port: u16,
    /// Its client port's TLS, if it speaks TLS.
    tls: Option<MemberTls>,
}

impl Member {
    fn new(name: String) -> Member {
        Member {
            daemon: Daemon::new(
                format!("etcd member {name}"),
                &format!("etcd-{name}"),
                LOG_FILE,
            ),
            name,
            client_port: 0,
            peer_port: 0,
            tls: None,
        }
    }

    fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    fn log(&self) -> String {
        self.daemon.log()
    }

    fn log_len(&self) -> u64 {
        self.daemon.log_len()
    }

    /// Runs the member, without waiting for it: a cluster's members must all run before any is healthy.
    fn spawn(&mut self, initial_cluster: &str, token: &str) {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client_url = format!("{scheme}://{}", self.endpoint());
        let mut command = Command::new("etcd");
        if let Some(tls) = &self.tls {
            command.arg("--cert-file").arg(&tls.cert);
            command.arg("--key-file").arg(&tls.key);
            if tls.client.is_some() {
                command.arg("--client-cert-auth");
                command.arg("--trusted-ca-file").arg(&tls.ca);
            }
        }
        command
            .args(["--name", &self.name])
            .arg("--data-dir")
            .arg(self.daemon.dir().join("data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &self.peer_url()])
            .args(["--initial-advertise-peer-urls", &self.peer_url()])
            .args(["--initial-cluster", initial_cluster])
            .args(["--initial-cluster-state", "new"])
            // Members of two clusters running side by side must never take each other for peers.
            .args(["--initial-cluster-token", token])
            .arg("--unsafe-no-fsync");
        let child = self
            .daemon
            .log_to(&mut command)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run etcd from PATH: {e}"));
        self.daemon.set_child(child);
    }

    fn kill(&mut self) {
        self.daemon.kill();
    }

    /// Kills the member and removes its data directory, for a start over on other ports: members of the first try
    /// may have formed a cluster already, whose data (its ID, the old peer URLs) a member of the second would refuse
    /// ("cluster ID mismatch"), so that they would never be healthy.
    fn discard(&mut self) {
        self.kill();
        let data = self.daemon.dir().join("data");
        if let Err(e) = std::fs::remove_dir_all(&data) {
            assert!(
                e.kind() == std::io::ErrorKind::NotFound,
                "cannot remove {}: {e}",
                data.display()
            );
        }
    }
}

/// Runs `etcdctl` (API v3) against `endpoints` with short timeouts (and the member's TLS files, if it has them).
fn etcdctl(endpoints: &str, tls: Option<&MemberTls>, args: &[&str]) -> Output {
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"))
        .args(tls.map(MemberTls::ctl_args).unwrap_or_default())
        .arg(format!("--dial-timeout={CTL_TIMEOUT}"))
        .arg(format!("--command-timeout={CTL_TIMEOUT}"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run etcdctl from PATH: {e}"))
}

/// Whether the member at `endpoint` answers a health check, which commits a proposal: so also whether its cluster
/// has a leader and a quorum.
fn is_healthy(member: &Member) -> bool {
    is_healthy_at(&member.endpoint(), member.tls.as_ref())
}

/// [`is_healthy`], of the member at `endpoint` with `tls`.
fn is_healthy_at(endpoint: &str, tls: Option<&MemberTls>) -> bool {
    etcdctl(endpoint, tls, &["endpoint", "health"])
        .status
        .success()
}

/// The member id and the leader's member id that the member at `endpoint` reports (`endpoint status`), or `None`
/// if it does not answer or knows no leader.
fn status(member: &Member) -> Option<(u64, u64)> {
    let output = etcdctl(
        &member.endpoint(),
        member.tls.as_ref(),
        &["endpoint", "status", "-w", "fields"],
    );
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let field = |name: &str| {
        text.lines()
            .filter_map(|line| line.split_once(" : "))
            .find(|(key, _)| key.trim().trim_matches('"') == name)
            .and_then(|(_, value)| value.trim().parse::<u64>().ok())
    };
    let (member, leader) = (field("MemberID")?, field("Leader")?);
    (leader != 0).then_some((member, leader))
}

/// The `"Name" : value` lines of `etcdctl -w fields` output, in order, names unquoted and values as printed.
fn fields(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.lines()
        .filter_map(|line| line.split_once(" : "))
        .map(|(key, value)| (key.trim().trim_matches('"'), value.trim()))
}

/// Members with a common fate: started together, healed and dropped together. [`EtcdServer`] is one of these with
/// one member, [`EtcdCluster`] with three.
#[derive(Debug)]
struct Members {
    members: Vec<Member>,
    token: String,
}

impl Members {
    /// Starts `n` members on free ports and waits until each answers a health check; on a taken port, starts all
    /// of them again on fresh ports, a few times over.
    fn start(n: usize, tls: Option<MemberTls>) -> Members {
        let token = format!("leasehold-{}-{}", std::process::id(), crate::monotonic_ns());
        let mut members = Members {
            members: (0..n)
                .map(|i| Member {
                    tls: tls.clone(),
                    ..Member::new(format!("e{i}"))
                })
                .collect(),
            token,
        };
        for _ in 0..START_ATTEMPTS {
            for member in &mut members.members {
                member.client_port = free_port();
                member.peer_port = free_port();
            }
            let cluster = members.initial_cluster();
            let starts: Vec<u64> = members.members.iter().map(Member::log_len).collect();
            for member in &mut members.members {
                member.spawn(&cluster, &members.token);
            }
            match members.wait_ready(&starts) {
                Ok(()) => return members,
                Err(true) => members.members.iter_mut().for_each(Member::discard),
                // Dropping `members` while panicking prints the logs.
                Err(false) => panic!("etcd exited before it was ready"),
            }
        }
        panic!("etcd found its ports taken {START_ATTEMPTS} times in a row");
    }

    fn initial_cluster(&self) -> String {
        let members: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect();
        members.join(",")
    }

    /// Waits until every running member is healthy; `Err(addr_in_use)` if one exited first.
    fn wait_ready(&mut self, log_starts: &[u64]) -> Result<(), bool> {
        poll_until("healthy etcd", || {
            for (member, &start) in self.members.iter_mut().zip(log_starts) {
                if let Some(addr_in_use) = member.daemon.exited(start) {
                    return Ok(Err(addr_in_use));
                }
            }
            let mut running = self.members.iter().filter(|m| m.daemon.pid().is_some());
            if running.all(is_healthy) {
                Ok(Ok(()))
            } else {
                Err("a member is not healthy".to_owned())
            }
        })
    }

    fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::endpoint).collect()
    }

    fn url(&self) -> String {
        let scheme = if self.members[0].tls.is_some() {
            "etcds"
        } else {
            "etcd"
        };
        format!("{scheme}://{}", self.endpoints().join(","))
    }

    fn addr(&self, i: usize) -> SocketAddr {
        let port = self.members[i].client_port;
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].daemon.pid()
    }

    fn kill(&mut self, i: usize) {
        self.members[i].kill();
    }

    /// Kills member `i` if it runs, starts it again with its ports and data directory, and waits until it is healthy.
    fn restart(&mut self, i: usize) {
        self.kill(i);
        let cluster = self.initial_cluster();
        let member = &mut self.members[i];
        let name = member.daemon.name().to_owned();
        restart_on_port(&name, || {
            let start = member.log_len();
            member.spawn(&cluster, &self.token);
            let (endpoint, tls) = (member.endpoint(), member.tls.clone());
            member.daemon.wait_ready(start, || {
                is_healthy_at(&endpoint, tls.as_ref())
                    .then_some(())
                    .ok_or_else(|| "not healthy".to_owned())
            })
        });
    }

    fn pause(&mut self, i: usize) {
        self.members[i].daemon.pause();
    }

    fn resume(&mut self, i: usize) {
        self.members[i].daemon.resume();
    }

    /// The index of the leader, once every running, unpaused member names the same running member as its leader.
    fn wait_leader(&self) -> usize {
        poll_until("agreed etcd leader", || self.agreed_leader())
    }

    fn agreed_leader(&self) -> Result<usize, String> {
        let mut ids = vec![None; self.members.len()];
        let mut leader = None;
        for (i, member) in self.members.iter().enumerate() {
            if !member.daemon.is_live() {
                continue;
            }
            let (id, said) = status(member).ok_or_else(|| format!("member {i} knows no leader"))?;
            ids[i] = Some(id);
            if leader.is_some_and(|l| l != said) {
                return Err("the members name different leaders".to_owned());
            }
            leader = Some(said);
        }
        let leader = leader.ok_or("no member runs")?;
        ids.iter()
            .position(|id| *id == Some(leader))
            .ok_or_else(|| format!("the leader {leader:x} is not a running member"))
    }

    /// The client endpoints of the running members that are not paused, comma-separated, for `etcdctl`.
    fn live_endpoints(&self) -> String {
        let live: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.daemon.is_live())
            .map(Member::endpoint)
            .collect();
        live.join(",")
    }

    /// Compacts the history up to the current revision (`etcdctl compact`): watches that start at an older revision
    /// are cancelled. Returns the revision, or `None` if no member answered.
    fn compact(&self) -> Option<u64> {
        let endpoints = self.live_endpoints();
        // Any one key: the answer's header carries the revision.
        let read = ["get", "", "--prefix", "--keys-only", "--limit", "1"];
        let tls = self.members[0].tls.as_ref();
        let output = etcdctl(&endpoints, tls, &[&read[..], &["-w", "fields"]].concat());
        if !output.status.success() {
            return None;
        }
        let text = String::from_utf8_lossy(&output.stdout);
        let revision = fields(&text)
            .find(|(key, _)| *key == "Revision")
            .and_then(|(_, value)| value.parse::<u64>().ok())?;
        // A compaction at or below an earlier one fails ("required revision has been compacted"): nothing to do.
        let _ = etcdctl(&endpoints, tls, &["compact", &revision.to_string()]);
        Some(revision)
    }

    /// Every key that no lease holds (`etcdctl get --prefix ""`, lease 0), as Go quotes it.
    fn keys_without_lease(&self) -> Vec<String> {
        let output = etcdctl(
            &self.live_endpoints(),
            self.members[0].tls.as_ref(),
            &["get", "", "--prefix", "-w", "fields"],
        );
        assert!(
            output.status.success(),
            "etcdctl get failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let text = String::from_utf8_lossy(&output.stdout);
        let mut keys = Vec::new();
        let mut key = None;
        for (name, value) in fields(&text) {
            match name {
                "Key" => key = Some(value.to_owned()),
                "Lease" if value == "0" => keys.extend(key.take()),
                "Lease" => key = None,
                _ => {}
            }
        }
        keys
    }

    fn print_logs_if_panicking(&self) {
        if !std::thread::panicking() {
            return;
        }
        for member in &self.members {
            eprintln!(
                "--- etcd {} log (client port {}) ---\n{}--- end of etcd {} log ---",
                member.name,
                member.client_port,
                member.log(),
                member.name
            );
        }
    }
}

impl Drop for Members {
    fn drop(&mut self) {
        self.print_logs_if_panicking();
        // SIGKILL works on a stopped process too.
        self.members.iter_mut().for_each(Member::kill);
    }
}

/// One etcd member on private ports of 127.0.0.1, with its data in a temporary directory.
///
/// Dropping the value kills the member with `SIGKILL`, reaps it and removes its directory; if the thread is
/// panicking, its log is printed to stderr first. All methods block the calling thread and panic with a message when
/// etcd cannot be run or is not healthy within 20 seconds.
///
/// # Examples
///
/// ```no_run
/// use leasehold_tests::EtcdServer;
///
/// let mut etcd = EtcdServer::start();
/// let url = etcd.url(); // etcd://127.0.0.1:PORT
/// etcd.kill();
/// etcd.restart(); // same port, same data
/// ```
#[derive(Debug)]
pub struct EtcdServer {
    members: Members,
}

impl EtcdServer {
    /// Starts a member and waits until it answers a health check.
    ///
    /// # Panics
    ///
    /// If `etcd` or `etcdctl` cannot be run, or the member is not healthy within 20 seconds.
    pub fn start() -> EtcdServer {
        EtcdServer {
            members: Members::start(1, None),
        }
    }

    /// Starts a member that speaks TLS to its clients with `ca`'s server certificate (for `127.0.0.1`), and, with
    /// `require_client_cert`, accepts only clients presenting a certificate signed by `ca` (its client certificate).
    /// [`url`](Self::url) is then `etcds://127.0.0.1:PORT`.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_tls(ca: &crate::TestCa, require_client_cert: bool) -> EtcdServer {
        let tls = MemberTls {
            ca: ca.ca.cert_path.clone(),
            cert: ca.server.cert_path.clone(),
            key: ca.server.key_path.clone(),
            client: require_client_cert
                .then(|| (ca.client.cert_path.clone(), ca.client.key_path.clone())),
        };
        EtcdServer {
            members: Members::start(1, Some(tls)),
        }
    }

    /// `127.0.0.1:PORT`, the client endpoint.
    pub fn endpoint(&self) -> String {
        self.members.members[0].endpoint()
    }

    /// `etcd://127.0.0.1:PORT` (`etcds://` for a member started with [`start_tls`](Self::start_tls)).
    pub fn url(&self) -> String {
        self.members.url()
    }

    /// The client endpoint as an address, for a [`TcpProxy`](crate::TcpProxy) in front of it.
    pub fn addr(&self) -> SocketAddr {
        self.members.addr(0)
    }

    /// Compacts the member's history up to its current revision (`etcdctl compact`), so that a watch from an older
    /// revision is cancelled. Returns the revision, or `None` if the member did not answer.
    pub fn compact(&self) -> Option<u64> {
        self.members.compact()
    }

    /// Every key that no lease holds, which would stay for ever (as `etcdctl` quotes it).
    ///
    /// # Panics
    ///
    /// If the member does not answer.
    pub fn keys_without_lease(&self) -> Vec<String> {
        self.members.keys_without_lease()
    }

    /// How many watchers the member serves right now (its `etcd_debugging_mvcc_watcher_total` gauge, from the
    /// `/metrics` page on the client port): a test learns that a client is watching, not guessing it from time.
    ///
    /// # Panics
    ///
    /// If the member does not answer, or its page has no such gauge.
    pub fn watchers(&self) -> u64 {
        let metrics = http_get(&self.endpoint(), "/metrics");
        metrics
            .lines()
            .find_map(|line| line.strip_prefix("etcd_debugging_mvcc_watcher_total "))
            .and_then(|n| n.trim().parse::<f64>().ok())
            .map(|n| n as u64)
            .unwrap_or_else(|| panic!("no watcher gauge in etcd's /metrics:\n{metrics}"))
    }

    /// The member's process id, or `None` while it is killed.
    pub fn pid(&self) -> Option<u32> {
        self.members.pid(0)
    }

    /// Kills the member with `SIGKILL` and reaps it. Does nothing if it is already killed.
    pub fn kill(&mut self) {
        self.members.kill(0);
    }

    /// Kills the member if it runs, starts it again on the same ports with the same data directory (so keys and
    /// leases survive, leases with their remaining time reset by the new leader), and waits until it is healthy.
    ///
    /// # Panics
    ///
    /// If it is not healthy within 20 seconds.
    pub fn restart(&mut self) {
        self.members.restart(0);
    }

    /// Stops the member with `SIGSTOP`.
    ///
    /// # Panics
    ///
    /// If it is not running.
    pub fn pause(&mut self) {
        self.members.pause(0);
    }

    /// Continues a paused member with `SIGCONT`.
    ///
    /// # Panics
    ///
    /// If it is not running.
    pub fn resume(&mut self) {
        self.members.resume(0);
    }

    /// Everything the member logged so far, across restarts.
    pub fn log(&self) -> String {
        self.members.members[0].log()
    }
}

/// A cluster of three etcd members on private ports of 127.0.0.1, each with its data in a temporary directory.
///
/// Members are addressed by index, `0..3`. Which one leads is up to Raft: ask [`leader`](Self::leader). Dropping the
/// value kills every member with `SIGKILL` and removes their directories; if the thread is panicking, every member's
/// log is printed to stderr first. All methods block the calling thread and panic with a message when etcd cannot be
/// run or a wait does not end within 20 seconds.
///
/// # Examples
///
/// ```no_run
/// use leasehold_tests::EtcdCluster;
///
/// let mut cluster = EtcdCluster::start();
/// let leader = cluster.leader();
/// cluster.kill(leader);
/// let next = cluster.leader(); // waits for the survivors to agree on a new one
/// assert_ne!(next, leader);
/// cluster.restart(leader); // rejoins as a follower
/// ```
#[derive(Debug)]
pub struct EtcdCluster {
    members: Members,
}

impl EtcdCluster {
    /// Starts three members and waits until each answers a health check (so a leader is elected).
    ///
    /// # Panics
    ///
    /// If `etcd` or `etcdctl` cannot be run, or the cluster is not healthy within 20 seconds.
    pub fn start() -> EtcdCluster {
        EtcdCluster {
            members: Members::start(3, None),
        }
    }

    /// `127.0.0.1:PORT` of every member's client endpoint, in index order, killed ones included.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.endpoints()
    }

    /// `etcd://127.0.0.1:P0,127.0.0.1:P1,127.0.0.1:P2`.
    pub fn url(&self) -> String {
        self.members.url()
    }

    /// The client endpoint of member `i` as an address, for a [`TcpProxy`](crate::TcpProxy) in front of it.
    pub fn addr(&self, i: usize) -> SocketAddr {
        self.members.addr(i)
    }

    /// Compacts the cluster's history up to its current revision (`etcdctl compact`, through the running members
    /// that are not paused), so that a watch from an older revision is cancelled. Returns the revision, or `None` if
    /// no member answered.
    pub fn compact(&self) -> Option<u64> {
        self.members.compact()
    }

    /// Every key that no lease holds, which would stay for ever (as `etcdctl` quotes it), read from the running
    /// members that are not paused.
    ///
    /// # Panics
    ///
    /// If none of them answers.
    pub fn keys_without_lease(&self) -> Vec<String> {
        self.members.keys_without_lease()
    }

    /// The process id of member `i`, or `None` while it is killed.
    ///
    /// # Panics
    ///
    /// If `i` is not below 3, as do all methods that take a member index.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members.pid(i)
    }

    /// The index of the leader, once every running member that is not paused names the same running member: after
    /// a kill this waits for the election.
    ///
    /// # Panics
    ///
    /// If they do not agree on a running leader within 20 seconds.
    pub fn leader(&self) -> usize {
        self.members.wait_leader()
    }

    /// Kills member `i` with `SIGKILL` and reaps it, without waiting for the others to notice. Does nothing if it is
    /// already killed.
    pub fn kill(&mut self, i: usize) {
        self.members.kill(i);
    }

    /// Kills member `i` if it runs, starts it again on the same ports with its data directory, and waits until it
    /// answers a health check (it has rejoined: a health check commits a proposal through the leader).
    ///
    /// # Panics
    ///
    /// If it is not healthy within 20 seconds.
    pub fn restart(&mut self, i: usize) {
        self.members.restart(i);
    }

    /// Stops member `i` with `SIGSTOP`: it holds its connections but answers nothing, and the others elect a new
    /// leader if it led.
    ///
    /// # Panics
    ///
    /// If it is not running.
    pub fn pause(&mut self, i: usize) {
        self.members.pause(i);
    }

    /// Continues member `i` with `SIGCONT`.
    ///
    /// # Panics
    ///
    /// If it is not running.
    pub fn resume(&mut self, i: usize) {
        self.members.resume(i);
    }

    /// Everything member `i` logged so far, across restarts.
    pub fn log(&self, i: usize) -> String {
        self.members.members[i].log()
    }
}

/// The body of `GET path` from `endpoint` (`host:port`), over plain HTTP/1.0: enough for etcd's `/metrics` page
/// without an HTTP client crate.
fn http_get(endpoint: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(endpoint)
        .unwrap_or_else(|e| panic!("cannot connect to etcd at {endpoint}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("a read timeout");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {endpoint}\r\n\r\n").expect("the request is sent");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .unwrap_or_else(|e| panic!("no answer from etcd at {endpoint}: {e}"));
    match response.split_once("\r\n\r\n") {
        Some((_, body)) => body.to_owned(),
        None => panic!("not an HTTP answer from etcd at {endpoint}: {response}"),
    }
}
