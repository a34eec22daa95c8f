//! Private etcd members for tests: [`EtcdServer`] (one member) and [`EtcdCluster`] (three), run from the `etcd` on
//! `PATH` (Debian's 3.4.23: `scripts/ensure-etcd.sh` installs it).
//!
//! Each member listens on two free ports of 127.0.0.1 (client and peer), keeps its data directory inside a
//! [`TempDir`](crate::TempDir), runs with `--unsafe-no-fsync` (nothing here needs to survive a power cut, and fsync
//! is most of a write's cost), and writes its log (its stderr: etcd 3.4 logs there) to a file that is printed to
//! stderr when the value is dropped during a panic.
//! Readiness, health and the leader are asked of the members with `etcdctl`, which keeps every method synchronous,
//! like [`RedisServer`](crate::RedisServer)'s, and so callable from inside an async test without nesting runtimes.
//! What a member has in common with a ZooKeeper server (start, kill, restart, pause, resume, drop) is written once in
//! [`ensemble`](crate::ensemble); [`Etcd`] is what is etcd's own.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::ensemble::{Ensemble, Member, Members, Standalone, Store};
use crate::server::free_port;

/// `etcdctl`'s dial and command timeouts for one poll; short, since the poll is repeated.
const CTL_TIMEOUT: &str = "1s";

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

/// etcd's [`Store`]: what a member keeps besides its process and its client port.
#[derive(Debug, Clone)]
pub struct Etcd {
    peer_port: u16,
    /// Its client port's TLS, if it speaks TLS.
    tls: Option<MemberTls>,
    /// Its cluster's token: members of two clusters running side by side must never take each other for peers.
    token: String,
}

impl Etcd {
    /// A member of a new cluster, speaking `tls` to its clients if given.
    fn new(tls: Option<MemberTls>) -> Etcd {
        Etcd {
            peer_port: 0,
            tls,
            token: format!("leasehold-{}-{}", std::process::id(), crate::monotonic_ns()),
        }
    }
}

impl Store for Etcd {
    const NAME: &'static str = "etcd";
    const MEMBER: &'static str = "etcd member";

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "etcds"
        } else {
            "etcd"
        }
    }

    fn take_peer_ports(&mut self, _members: usize) {
        self.peer_port = free_port();
    }

    /// `--initial-cluster`: `e0=http://127.0.0.1:PEER,…`.
    fn peers(members: &[Member<Etcd>]) -> String {
        let members: Vec<String> = members
            .iter()
            .map(|m| format!("{}={}", m.name(), m.peer_url()))
            .collect();
        members.join(",")
    }

    fn spawn(member: &mut Member<Etcd>, initial_cluster: &str) {
        let scheme = if member.own.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let client_url = format!("{scheme}://{}", member.endpoint());
        let mut command = Command::new("etcd");
        if let Some(tls) = &member.own.tls {
            command.arg("--cert-file").arg(&tls.cert);
            command.arg("--key-file").arg(&tls.key);
            if tls.client.is_some() {
                command.arg("--client-cert-auth");
                command.arg("--trusted-ca-file").arg(&tls.ca);
            }
        }
        command
            .args(["--name", &member.name()])
            .arg("--data-dir")
            .arg(member.daemon.dir().join("data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &member.peer_url()])
            .args(["--initial-advertise-peer-urls", &member.peer_url()])
            .args(["--initial-cluster", initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &member.own.token])
            .arg("--unsafe-no-fsync");
        let child = member
            .daemon
            .log_to(&mut command)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run etcd from PATH: {e}"));
        member.daemon.set_child(child);
    }

    /// Whether the member answers a health check, which commits a proposal: so also whether its cluster has a leader
    /// and a quorum.
    fn serves(member: &Member<Etcd>) -> Result<(), String> {
        etcdctl(
            &member.endpoint(),
            member.own.tls.as_ref(),
            &["endpoint", "health"],
        )
        .status
        .success()
        .then_some(())
        .ok_or_else(|| format!("member {} is not healthy", member.index))
    }

    /// The member that every running, unpaused member names as its leader, if they name the same running member.
    fn leader(members: &[Member<Etcd>]) -> Result<usize, String> {
        let mut ids = vec![None; members.len()];
        let mut leader = None;
        for (i, member) in members.iter().enumerate() {
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

    /// Kills the member and removes its data directory, for a start over on other ports: members of the first try
    /// may have formed a cluster already, whose data (its ID, the old peer URLs) a member of the second would refuse
    /// ("cluster ID mismatch"), so that they would never be healthy.
    fn discard(member: &mut Member<Etcd>) {
        member.daemon.kill();
        let data = member.daemon.dir().join("data");
        if let Err(e) = std::fs::remove_dir_all(&data) {
            assert!(
                e.kind() == std::io::ErrorKind::NotFound,
                "cannot remove {}: {e}",
                data.display()
            );
        }
    }
}

impl Member<Etcd> {
    /// Its `--name`.
    fn name(&self) -> String {
        format!("e{}", self.index)
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.own.peer_port)
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

/// The member id and the leader's member id that the member reports (`endpoint status`), or `None` if it does not
/// answer or knows no leader.
fn status(member: &Member<Etcd>) -> Option<(u64, u64)> {
    let output = etcdctl(
        &member.endpoint(),
        member.own.tls.as_ref(),
        &["endpoint", "status", "-w", "fields"],
    );
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let field = |name: &str| {
        fields(&text)
            .find(|(key, _)| *key == name)
            .and_then(|(_, value)| value.parse::<u64>().ok())
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

impl Members<Etcd> {
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

    fn tls(&self) -> Option<&MemberTls> {
        self.members[0].own.tls.as_ref()
    }

    /// Compacts the history up to the current revision (`etcdctl compact`): watches that start at an older revision
    /// are cancelled. Returns the revision, or `None` if no member answered.
    fn compact(&self) -> Option<u64> {
        let endpoints = self.live_endpoints();
        // Any one key: the answer's header carries the revision.
        let read = ["get", "", "--prefix", "--keys-only", "--limit", "1"];
        let output = etcdctl(
            &endpoints,
            self.tls(),
            &[&read[..], &["-w", "fields"]].concat(),
        );
        if !output.status.success() {
            return None;
        }
        let text = String::from_utf8_lossy(&output.stdout);
        let revision = fields(&text)
            .find(|(key, _)| *key == "Revision")
            .and_then(|(_, value)| value.parse::<u64>().ok())?;
        // A compaction at or below an earlier one fails ("required revision has been compacted"): nothing to do.
        let _ = etcdctl(&endpoints, self.tls(), &["compact", &revision.to_string()]);
        Some(revision)
    }

    /// Every key that no lease holds (`etcdctl get --prefix ""`, lease 0), as Go quotes it.
    fn keys_without_lease(&self) -> Vec<String> {
        let output = etcdctl(
            &self.live_endpoints(),
            self.tls(),
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
}

/// One etcd member on private ports of 127.0.0.1, with its data in a temporary directory: a [`Standalone`] member,
/// ready once it answers a health check. A [`restart`](Standalone::restart) keeps keys and leases (leases with their
/// remaining time reset by the new leader).
///
/// [`Standalone`] says how it is dropped and how its methods block and wait, as for [`ZkServer`](crate::ZkServer).
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
pub type EtcdServer = Standalone<Etcd>;

impl Standalone<Etcd> {
    /// Starts a member and waits until it answers a health check.
    ///
    /// # Panics
    ///
    /// If `etcd` or `etcdctl` cannot be run, or the member is not healthy within 20 seconds.
    pub fn start() -> EtcdServer {
        Standalone::start_with(Etcd::new(None))
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
        Standalone::start_with(Etcd::new(Some(tls)))
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

    /// How many gRPC requests of `method` (`"Txn"`, `"Range"`, `"Watch"`: a watch stream) the member has started
    /// serving so far (its `grpc_server_started_total` counter, from the `/metrics` page on the client port): what a
    /// test counts a client's requests by. HTTP/2 pings and window updates are no requests, so they do not count.
    ///
    /// # Panics
    ///
    /// If the member does not answer.
    pub fn requests(&self, method: &str) -> u64 {
        let metrics = http_get(&self.endpoint(), "/metrics");
        let label = format!("grpc_method=\"{method}\"");
        metrics
            .lines()
            .filter(|line| line.starts_with("grpc_server_started_total{") && line.contains(&label))
            .filter_map(|line| line.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
            .map(|n| n as u64)
            .sum()
    }
}

/// A cluster of three etcd members on private ports of 127.0.0.1, each with its data in a temporary directory: an
/// [`Ensemble`], ready once every member answers a health check (so a leader is elected).
///
/// Which one leads is up to Raft: [`leader`](Ensemble::leader) waits until every running member that is not paused
/// names the same running member. A [`restart`](Ensemble::restart)ed member is ready once it answers a health check:
/// it has rejoined, since a health check commits a proposal through the leader. A [`pause`](Ensemble::pause)d leader
/// is replaced by the others' election. [`Ensemble`] says how the cluster is dropped and how its methods block and
/// wait, as for [`ZkEnsemble`](crate::ZkEnsemble).
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
pub type EtcdCluster = Ensemble<Etcd>;

impl Ensemble<Etcd> {
    /// Starts three members and waits until each answers a health check (so a leader is elected).
    ///
    /// # Panics
    ///
    /// If `etcd` or `etcdctl` cannot be run, or the cluster is not healthy within 20 seconds.
    pub fn start() -> EtcdCluster {
        Ensemble::start_with(Etcd::new(None))
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
