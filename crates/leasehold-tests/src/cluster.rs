//! A local Redis Cluster: three primaries, three replicas, and faults on demand.

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::server::{free_port, SpawnError, START_ATTEMPTS};
use crate::{server_binary, RedisServer};

/// Three primaries and, with `--cluster-replicas 1`, one replica each.
const NODES: usize = 6;
/// The number of hash slots of a Redis Cluster.
const SLOTS: u32 = 16384;
/// The cluster bus of a node listens on its client port plus this.
const BUS_PORT_OFFSET: u16 = 10000;
/// How often the nodes are asked whether a change has settled. A cluster announces nothing to
/// an outsider, so it is polled; a change takes tens of milliseconds to seconds.
pub(crate) const POLL: Duration = Duration::from_millis(10);
/// How long the cluster may take to form, to detect a failure and elect a replica (the node
/// timeout, 2 s, and then some), or to agree after a change, on a busy machine.
pub(crate) const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Connect, read and write timeout of the connections that poll the nodes.
const POLL_CON_TIMEOUT: Duration = Duration::from_secs(5);
/// How many keys one `MIGRATE` moves.
const MIGRATE_BATCH: usize = 100;
/// The timeout `MIGRATE` is given for each batch, in milliseconds.
const MIGRATE_TIMEOUT_MS: u64 = 5000;

/// The configuration of every node, after [`RedisServer`]'s defaults (`--save ""`,
/// `--appendonly no`, `--protected-mode no`, its own `--dir`).
const NODE_ARGS: [&str; 10] = [
    "--cluster-enabled",
    "yes",
    // Relative to `--dir`, so each node keeps its own, and finds it again on restart.
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "2000",
    // Without it a replica waits 5 s for company before its first full sync.
    "--repl-diskless-sync-delay",
    "0",
    "--enable-debug-command",
    "local",
];

/// A local Redis Cluster of three primaries and three replicas, each a `redis-server` (or
/// whatever [`server_binary`] names) on a free port of 127.0.0.1 whose bus port (port + 10000) was free too.
///
/// Nodes are addressed by index, `0..6`. Which of them are primaries, and which replica follows
/// which primary, is up to `redis-cli --cluster create` and changes with failovers: ask
/// [`primaries`](Self::primaries), [`primary_of_slot`](Self::primary_of_slot) and
/// [`replica_of`](Self::replica_of) rather than assuming an order.
///
/// Every method that changes the topology, [`kill`](Self::kill) aside, waits until all live
/// nodes agree on the result, by polling them; none of them sleeps for a fixed time. Dropping the value kills every node with
/// `SIGKILL` and removes their directories; if the thread is panicking, the cluster's view of
/// itself and every node's log are printed to stderr first.
///
/// All methods block the calling thread, and panic with a message that says what went wrong
/// when a node cannot be reached or a change does not settle within 30 seconds.
///
/// # Examples
///
/// ```no_run
/// use leasehold_tests::{slot_of, RedisCluster};
///
/// let mut cluster = RedisCluster::start();
/// let slot = slot_of("{lock}:a");
/// let primary = cluster.primary_of_slot(slot);
///
/// cluster.kill(primary);
/// let promoted = cluster.wait_primary_elected(slot);
/// assert_ne!(promoted, primary);
/// cluster.restart(primary); // it comes back as a replica of `promoted`
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Node ids by index. A node keeps its id in nodes.conf, so it survives restart.
    ids: Vec<String>,
}

impl RedisCluster {
    /// Starts six nodes, joins them into a cluster with `redis-cli --cluster create
    /// --cluster-replicas 1`, and waits until every node reports `cluster_state:ok`, all of
    /// them agree on who owns each slot, and every replica's link to its primary is up.
    ///
    /// If a chosen port turns out to be taken, another one is chosen, a few times over.
    ///
    /// # Panics
    ///
    /// If the server program or `redis-cli` cannot be run, a node does not start, the cluster
    /// cannot be created, or it does not settle within 30 seconds.
    pub fn start() -> RedisCluster {
        let mut taken = HashSet::new();
        let nodes: Vec<RedisServer> = (0..NODES).map(|_| start_node(&mut taken)).collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port()))
            .collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli from PATH: {e}"));
        let mut cluster = RedisCluster {
            nodes,
            ids: Vec::new(),
        };
        if !output.status.success() {
            // Dropping `cluster` while panicking prints the node logs.
            panic!(
                "redis-cli --cluster create failed ({}):\n{}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        cluster.ids = (0..NODES)
            .map(|i| cluster.query(i, redis::cmd("CLUSTER").arg("MYID")))
            .collect();
        cluster.wait_stable();
        cluster
    }

    /// `redis://127.0.0.1:PORT` of every node, in index order, killed ones included.
    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// `redis+cluster://127.0.0.1:P0,127.0.0.1:P1,…`, listing all six nodes.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port()))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The client port of node `i`; its bus port is this plus 10000. It stays the same
    /// across [`restart`](Self::restart).
    ///
    /// # Panics
    ///
    /// If `i` is not below 6, as do all methods that take a node index.
    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].port()
    }

    /// The process id of node `i`, or `None` while it is killed.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].pid()
    }

    /// A new synchronous connection to node `i` (not cluster-aware: a key of another node's
    /// slot gets a `MOVED` error), with 5-second connect, read and write timeouts.
    ///
    /// # Panics
    ///
    /// If the node cannot be reached.
    pub fn connection(&self, i: usize) -> redis::Connection {
        self.nodes[i].connection()
    }

    /// Everything node `i` wrote to its log so far, across restarts.
    pub fn log(&self, i: usize) -> String {
        self.nodes[i].log()
    }

    /// Whether node `i` is a primary that owns slots, in the view of the first live node.
    ///
    /// A killed primary still counts until its replica has taken over.
    ///
    /// # Panics
    ///
    /// If no node is live or the one asked cannot be reached.
    pub fn is_primary(&self, i: usize) -> bool {
        self.primaries().contains(&i)
    }

    /// The indices of the primaries that own slots, in ascending order, in the view of the
    /// first live node (`CLUSTER NODES`).
    ///
    /// # Panics
    ///
    /// As [`is_primary`](Self::is_primary).
    pub fn primaries(&self) -> Vec<usize> {
        let view = self.view();
        let mut primaries: Vec<usize> = view
            .owners()
            .iter()
            .map(|owner| self.index_of(owner.port))
            .collect();
        primaries.sort_unstable();
        primaries.dedup();
        primaries
    }

    /// The index of the primary that owns `slot`, in the view of the first live node. During
    /// a migration that is still the source.
    ///
    /// # Panics
    ///
    /// As [`is_primary`](Self::is_primary); also if no node owns the slot.
    pub fn primary_of_slot(&self, slot: u16) -> usize {
        let owner = self
            .view()
            .owner(slot)
            .unwrap_or_else(|| panic!("no node owns slot {slot}"));
        self.index_of(owner)
    }

    /// The lowest index of a live node that replicates `primary`, by its own account (the
    /// `myself` line of its `CLUSTER NODES`).
    ///
    /// A node knows at once whom it follows, the others only from its next heartbeat, so
    /// this is right also between a change and [`wait_stable`](Self::wait_stable).
    ///
    /// # Panics
    ///
    /// If a live node cannot be reached, or none replicates `primary`.
    pub fn replica_of(&self, primary: usize) -> usize {
        let primary_id = self.ids[primary].as_str();
        self.live()
            .find(|&i| {
                let view = self.view_of(i);
                let me = view.nodes.iter().find(|node| node.myself);
                me.and_then(|me| me.primary_id.as_deref()) == Some(primary_id)
            })
            .unwrap_or_else(|| panic!("no live node replicates node {primary}"))
    }

    /// Kills node `i` with `SIGKILL` and reaps it, without waiting for the cluster to notice.
    /// Does nothing if it is already killed.
    ///
    /// The other nodes mark it as failing after the node timeout (2 s); if it was a primary,
    /// its replica is then elected: see [`wait_primary_elected`](Self::wait_primary_elected).
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Kills node `i` if it runs, starts it again on the same port with the same directory
    /// and nodes.conf, and waits until the cluster is stable again (see
    /// [`wait_stable`](Self::wait_stable)).
    ///
    /// The node keeps its id and rejoins in the role the cluster now gives it: a primary whose
    /// replica was promoted in the meantime comes back as that replica's replica. Its data set
    /// starts empty (a replica fetches its primary's).
    ///
    /// # Panics
    ///
    /// If the node does not start, or the cluster does not settle within 30 seconds.
    pub fn restart(&mut self, i: usize) {
        self.nodes[i].restart();
        self.wait_stable();
    }

    /// Runs `CLUSTER FAILOVER` on `replica`, and waits until every live node agrees that it
    /// owns its old primary's slots and the cluster is stable (see
    /// [`wait_stable`](Self::wait_stable); the old primary then follows it, its link up).
    ///
    /// The failover is the coordinated kind: the old primary stops accepting writes until the
    /// replica has caught up, so no acknowledged write is lost.
    ///
    /// # Panics
    ///
    /// If `replica` is not a replica (Redis refuses the command), or the cluster does not
    /// settle within 30 seconds.
    pub fn failover(&mut self, replica: usize) {
        let _: () = self.query(replica, redis::cmd("CLUSTER").arg("FAILOVER"));
        poll_until(&format!("failover to node {replica}"), || {
            let view = self.settled()?;
            let owns_slots = view
                .owners()
                .iter()
                .any(|owner| owner.port == self.port(replica));
            owns_slots.then_some(()).ok_or_else(|| {
                // Redis abandons a manual failover that stalls for 5 s, without a word
                // to the client; only the replica's log tells.
                format!("node {replica} owns no slots yet (see its log)")
            })
        });
    }

    /// Waits until a live node owns `slot` as a primary, every live node reports
    /// `cluster_state:ok` and agrees on that owner, and returns the owner's index.
    ///
    /// Call it after [`kill`](Self::kill)ing the slot's primary: failure detection takes the
    /// node timeout (2 s), the election a little more. Replicas' links are not waited for.
    ///
    /// # Panics
    ///
    /// If that does not happen within 30 seconds.
    pub fn wait_primary_elected(&self, slot: u16) -> usize {
        poll_until(&format!("a live primary for slot {slot}"), || {
            let mut agreed: Option<(usize, u16)> = None;
            for i in self.live() {
                let (_, view) = self.ok_view(i)?;
                let owner = view
                    .owner(slot)
                    .ok_or_else(|| format!("node {i} knows no owner of slot {slot}"))?;
                match agreed {
                    Some((j, agreed_owner)) if agreed_owner != owner => {
                        return Err(format!(
                            "node {j} says port {agreed_owner} owns slot {slot}, node {i} says port {owner}"
                        ));
                    }
                    _ => agreed = Some((i, owner)),
                }
            }
            let (_, owner) = agreed.ok_or("no node is live")?;
            let owner = self.index_of(owner);
            match self.pid(owner) {
                Some(_) => Ok(owner),
                None => Err(format!("slot {slot} is still owned by killed node {owner}")),
            }
        })
    }

    /// Moves `slot` and its keys to primary `to` the way `redis-cli --cluster reshard` does,
    /// and waits until the cluster is stable with `to` owning the slot: the same as
    /// [`begin_migration`](Self::begin_migration) followed by
    /// [`finish_migration`](Self::finish_migration).
    ///
    /// # Panics
    ///
    /// If `to` is not a primary or already owns the slot, a step fails, or the cluster does not
    /// settle within 30 seconds.
    pub fn migrate_slot(&mut self, slot: u16, to: usize) {
        self.begin_migration(slot, to);
        self.finish_migration(slot, to);
    }

    /// Marks `slot` as `IMPORTING` on `to` and `MIGRATING` on its current owner, and moves
    /// nothing.
    ///
    /// From here on the owner still serves the slot's keys it has, and answers `ASK` (a
    /// redirection to `to`) for the ones it does not; a script whose keys are split between
    /// the two gets `TRYAGAIN`. [`finish_migration`](Self::finish_migration) completes it.
    ///
    /// # Panics
    ///
    /// If `to` is not a primary, already owns the slot, or a node refuses the command.
    pub fn begin_migration(&mut self, slot: u16, to: usize) {
        let from = self.primary_of_slot(slot);
        assert_ne!(from, to, "node {to} already owns slot {slot}");
        assert!(self.is_primary(to), "node {to} is not a primary");
        // The target first: once the source redirects with ASK, the target must accept it.
        self.setslot(to, slot, "IMPORTING", from);
        self.setslot(from, slot, "MIGRATING", to);
    }

    /// Completes a migration of `slot` to `to` started with
    /// [`begin_migration`](Self::begin_migration): moves the keys still on the source with
    /// `CLUSTER GETKEYSINSLOT` and `MIGRATE … KEYS`, assigns the slot to `to` on every
    /// primary with `CLUSTER SETSLOT … NODE`, and waits until the cluster is stable with `to`
    /// owning the slot.
    ///
    /// # Panics
    ///
    /// If a step fails (for instance `MIGRATE` finding the key on the target already), or the
    /// cluster does not settle within 30 seconds.
    pub fn finish_migration(&mut self, slot: u16, to: usize) {
        // The slot belongs to the source until SETSLOT NODE.
        let from = self.primary_of_slot(slot);
        assert_ne!(from, to, "node {to} already owns slot {slot}");
        let to_port = self.port(to);
        loop {
            let keys: Vec<Vec<u8>> = self.query(
                from,
                redis::cmd("CLUSTER")
                    .arg("GETKEYSINSLOT")
                    .arg(slot)
                    .arg(MIGRATE_BATCH),
            );
            if keys.is_empty() {
                break;
            }
            let _: redis::Value = self.query(
                from,
                redis::cmd("MIGRATE")
                    .arg("127.0.0.1")
                    .arg(to_port)
                    .arg("")
                    .arg(0)
                    .arg(MIGRATE_TIMEOUT_MS)
                    .arg("KEYS")
                    .arg(&keys),
            );
        }
        // Target, then source, then the rest, as the Redis manual orders it: the target bumps
        // its epoch so that its claim wins, and the source stops redirecting with ASK.
        let mut order = vec![to, from];
        order.extend(
            self.primaries()
                .into_iter()
                .filter(|&i| i != to && i != from && self.pid(i).is_some()),
        );
        for i in order {
            self.setslot(i, slot, "NODE", to);
        }
        poll_until(&format!("slot {slot} on node {to}"), || {
            let owner = self.settled()?.owner(slot);
            match owner {
                Some(port) if port == to_port => Ok(()),
                _ => Err(format!("slot {slot} is owned by port {owner:?}")),
            }
        })
    }

    /// `FLUSHALL` on every live primary; the replicas follow through replication.
    ///
    /// # Panics
    ///
    /// If a primary cannot be reached.
    pub fn flushall(&self) {
        for i in self.primaries() {
            if self.pid(i).is_some() {
                let _: () = self.query(i, &redis::cmd("FLUSHALL"));
            }
        }
    }

    /// Waits until the cluster is stable: every live node reports `cluster_state:ok`, every
    /// slot is owned by a live primary, no live node is seen as failing, all live nodes agree
    /// on the slot owners and on who replicates whom, and every live replica reports its
    /// link to its primary up.
    ///
    /// After a primary is killed that includes waiting for its replica to be elected.
    ///
    /// Roles are compared too, although a client only cares about slots: a node announces its
    /// own role only in its heartbeats, so the others learn it up to a second (half the node
    /// timeout) later, and until then a primary ignores a `CLUSTER FAILOVER` from a replica it
    /// does not know as its own (the failover silently times out).
    ///
    /// # Panics
    ///
    /// If that does not happen within 30 seconds.
    pub fn wait_stable(&self) {
        poll_until("a stable cluster", || self.settled().map(drop));
    }

    /// Runs `cmd` on node `i` over a new connection.
    fn query<T: redis::FromRedisValue>(&self, i: usize, cmd: &redis::Cmd) -> T {
        cmd.query(&mut self.connection(i)).unwrap_or_else(|e| {
            panic!(
                "node {i} (port {}) refused {:?}: {e}",
                self.port(i),
                String::from_utf8_lossy(&cmd.get_packed_command())
            )
        })
    }

    /// `CLUSTER SETSLOT slot state id` on node `on`, where `id` is node `node`'s.
    fn setslot(&self, on: usize, slot: u16, state: &str, node: usize) {
        let _: () = self.query(
            on,
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(state)
                .arg(&self.ids[node]),
        );
    }

    /// The indices of the nodes that are not killed.
    fn live(&self) -> impl Iterator<Item = usize> + '_ {
        (0..NODES).filter(|&i| self.pid(i).is_some())
    }

    /// The index of the node listening on `port`.
    fn index_of(&self, port: u16) -> usize {
        (0..NODES)
            .find(|&i| self.port(i) == port)
            .unwrap_or_else(|| panic!("port {port} is not a node of this cluster"))
    }

    /// The first live node's `CLUSTER NODES`.
    fn view(&self) -> View {
        let i = self
            .live()
            .next()
            .expect("every node of the cluster is killed");
        self.view_of(i)
    }

    /// Node `i`'s `CLUSTER NODES`.
    fn view_of(&self, i: usize) -> View {
        let port = self.port(i);
        try_connect(port)
            .and_then(|mut con| View::fetch(&mut con, port))
            .unwrap_or_else(|e| panic!("CLUSTER NODES from node {i}: {e}"))
    }

    /// The first live node's view if the cluster is stable (see
    /// [`wait_stable`](Self::wait_stable)), or why it is not.
    fn settled(&self) -> Result<View, String> {
        let mut agreed: Option<(usize, Topology, View)> = None;
        for i in self.live() {
            let (mut con, view) = self.ok_view(i)?;
            let topology = self.topology(&view).map_err(|e| format!("node {i}: {e}"))?;
            let me = view
                .nodes
                .iter()
                .find(|node| node.myself)
                .ok_or_else(|| format!("node {i} has no `myself` line"))?;
            if !me.primary {
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query(&mut con)
                    .map_err(|e| format!("INFO on node {i}: {e}"))?;
                let link = info_field(&info, "master_link_status");
                if link != Some("up") {
                    return Err(format!("replica {i} reports master_link_status {link:?}"));
                }
            }
            match &agreed {
                Some((j, seen, _)) if *seen != topology => {
                    return Err(format!(
                        "nodes {j} and {i} disagree: {seen:?} and {topology:?}"
                    ));
                }
                Some(_) => {}
                None => agreed = Some((i, topology, view)),
            }
        }
        agreed
            .map(|(_, _, view)| view)
            .ok_or_else(|| "every node is killed".to_owned())
    }

    /// A connection to node `i` and its view, if it reports `cluster_state:ok`.
    fn ok_view(&self, i: usize) -> Result<(redis::Connection, View), String> {
        let port = self.port(i);
        let mut con = try_connect(port)?;
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut con)
            .map_err(|e| format!("CLUSTER INFO on node {i}: {e}"))?;
        let state = info_field(&info, "cluster_state");
        if state != Some("ok") {
            return Err(format!("node {i} reports cluster_state {state:?}"));
        }
        let view = View::fetch(&mut con, port)?;
        Ok((con, view))
    }

    /// What all live nodes must agree on, from one node's view; an error if a killed node
    /// owns slots, or a live node is unknown or seen as failing.
    fn topology(&self, view: &View) -> Result<Topology, String> {
        let owners = view.owners();
        for owner in &owners {
            let i = self.index_of(owner.port);
            if self.pid(i).is_none() {
                return Err(format!(
                    "slots {}-{} are owned by killed node {i}",
                    owner.first, owner.last
                ));
            }
        }
        let mut roles = Vec::new();
        for i in self.live() {
            let port = self.port(i);
            let node = view
                .nodes
                .iter()
                .find(|node| node.port == port)
                .ok_or_else(|| format!("node {i} is not known"))?;
            if node.failing {
                return Err(format!("node {i} is seen as failing"));
            }
            let primary = match &node.primary_id {
                None => None,
                Some(id) => Some(
                    view.nodes
                        .iter()
                        .find(|other| other.id == *id)
                        .ok_or_else(|| format!("the primary of node {i} is not known"))?
                        .port,
                ),
            };
            roles.push((port, primary));
        }
        Ok(Topology { owners, roles })
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(i) = self.live().next() {
                let port = self.port(i);
                let nodes = try_connect(port).and_then(|mut con| {
                    redis::cmd("CLUSTER")
                        .arg("NODES")
                        .query::<String>(&mut con)
                        .map_err(|e| e.to_string())
                });
                let nodes = nodes.unwrap_or_else(|e| format!("(unavailable: {e})\n"));
                eprintln!(
                    "--- CLUSTER NODES of node {i} (port {port}) ---\n{nodes}--- end of CLUSTER NODES ---"
                );
            }
        }
        // All at once, so that no node sees the others die and starts a failover. Each
        // node's own drop prints its log (while panicking) and removes its directory.
        for node in &mut self.nodes {
            node.kill();
        }
    }
}

/// The hash slot of `key`: CRC16 (XMODEM) of the key, or of its hash tag (the part between
/// the first `{` and the next `}`, if not empty), modulo 16384. The same as `CLUSTER KEYSLOT`.
///
/// # Examples
///
/// ```
/// use leasehold_tests::slot_of;
///
/// assert_eq!(slot_of("foo"), 12182);
/// assert_eq!(slot_of("{user1000}.following"), slot_of("{user1000}.followers"));
/// ```
pub fn slot_of(key: &str) -> u16 {
    let key = key.as_bytes();
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let tag = &key[open + 1..];
            tag.iter()
                .position(|&b| b == b'}')
                .filter(|&len| len > 0)
                .map(|len| &tag[..len])
        })
        .unwrap_or(key);
    // Cannot truncate: the modulo is below 2^14.
    (u32::from(crc16_xmodem(hashed)) % SLOTS) as u16
}

/// CRC-16/XMODEM: polynomial 0x1021, initial value 0, no reflection.
fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Starts one node on a port that, with its bus port, is free and not in `taken`, and adds
/// both ports to `taken`.
fn start_node(taken: &mut HashSet<u16>) -> RedisServer {
    let mut node = RedisServer::unstarted(server_binary(), &NODE_ARGS, "cluster");
    for _ in 0..START_ATTEMPTS {
        node.port = free_node_port(taken);
        match node.spawn() {
            Ok(()) => {
                taken.extend([node.port, node.port + BUS_PORT_OFFSET]);
                return node;
            }
            Err(SpawnError::AddrInUse) => continue,
            // Dropping `node` while panicking prints its log.
            Err(SpawnError::Failed(why)) => panic!("cluster node did not start: {why}"),
        }
    }
    panic!("cluster node found its ports taken {START_ATTEMPTS} times in a row");
}

/// A free port of 127.0.0.1 whose bus port is free too, neither of them in `taken`.
fn free_node_port(taken: &HashSet<u16>) -> u16 {
    // Ports above 55535 have no bus port; about a fifth of the ephemeral range.
    for _ in 0..1000 {
        let port = free_port();
        let Some(bus) = port.checked_add(BUS_PORT_OFFSET) else {
            continue;
        };
        if !taken.contains(&port)
            && !taken.contains(&bus)
            && TcpListener::bind((Ipv4Addr::LOCALHOST, bus)).is_ok()
        {
            return port;
        }
    }
    panic!("found no free port of 127.0.0.1 with a free bus port in 1000 tries");
}

/// Waits until `check` returns `Ok`, asking every [`POLL`], and returns its value.
///
/// # Panics
///
/// After [`SETTLE_TIMEOUT`], with `what` and the last reason `check` gave.
pub(crate) fn poll_until<T>(what: &str, mut check: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        match check() {
            Ok(value) => return value,
            Err(why) if Instant::now() >= deadline => {
                panic!("waited {SETTLE_TIMEOUT:?} for {what}; still: {why}")
            }
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

/// A connection to 127.0.0.1:`port` for polling: failures are returned, not panicked on.
pub(crate) fn try_connect(port: u16) -> Result<redis::Connection, String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .expect("a redis:// URL with a port is valid");
    let con = client
        .get_connection_with_timeout(POLL_CON_TIMEOUT)
        .map_err(|e| format!("cannot connect to port {port}: {e}"))?;
    con.set_read_timeout(Some(POLL_CON_TIMEOUT))
        .expect("a non-zero timeout is valid");
    con.set_write_timeout(Some(POLL_CON_TIMEOUT))
        .expect("a non-zero timeout is valid");
    Ok(con)
}

/// The value of `field` in the text of an `INFO`-style reply (`name:value` lines).
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| *name == field)
        .map(|(_, value)| value.trim())
}

/// What every live node must see alike for the cluster to be stable.
#[derive(Debug, PartialEq, Eq)]
struct Topology {
    owners: Vec<SlotRange>,
    /// Every live node's port, with the port of its primary if it is a replica.
    roles: Vec<(u16, Option<u16>)>,
}

/// A range of slots and the port of the primary that owns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct SlotRange {
    first: u16,
    last: u16,
    port: u16,
}

/// One node's `CLUSTER NODES`.
#[derive(Debug)]
struct View {
    nodes: Vec<NodeLine>,
}

/// One line of `CLUSTER NODES`:
/// `<id> <ip:port@cport[,hostname]> <flags> <primary id or -> <ping-sent> <pong-recv>
/// <config-epoch> <link-state> <slot or range>…`.
#[derive(Debug)]
struct NodeLine {
    id: String,
    /// 0 for a node without an address (`noaddr`).
    port: u16,
    myself: bool,
    primary: bool,
    /// Flagged `fail` or `fail?`.
    failing: bool,
    primary_id: Option<String>,
    /// Owned slots; the `[slot->-id]` and `[slot-<-id]` marks of a migration are left out.
    slots: Vec<(u16, u16)>,
}

impl View {
    fn fetch(con: &mut redis::Connection, port: u16) -> Result<View, String> {
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(con)
            .map_err(|e| format!("CLUSTER NODES on port {port}: {e}"))?;
        View::parse(&text).map_err(|e| format!("CLUSTER NODES on port {port}: {e}"))
    }

    fn parse(text: &str) -> Result<View, String> {
        let nodes = text
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| NodeLine::parse(line).ok_or_else(|| format!("cannot parse {line:?}")))
            .collect::<Result<_, _>>()?;
        Ok(View { nodes })
    }

    /// Every owned range, sorted.
    fn owners(&self) -> Vec<SlotRange> {
        let mut owners: Vec<SlotRange> = self
            .nodes
            .iter()
            .flat_map(|node| {
                node.slots.iter().map(|&(first, last)| SlotRange {
                    first,
                    last,
                    port: node.port,
                })
            })
            .collect();
        owners.sort_unstable();
        owners
    }

    /// The port of the node that owns `slot`.
    fn owner(&self, slot: u16) -> Option<u16> {
        self.nodes
            .iter()
            .find(|node| {
                node.slots
                    .iter()
                    .any(|&(first, last)| (first..=last).contains(&slot))
            })
            .map(|node| node.port)
    }
}

impl NodeLine {
    fn parse(line: &str) -> Option<NodeLine> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            return None;
        }
        let (host_port, _bus) = fields[1].split_once('@')?;
        let port = host_port.rsplit_once(':')?.1.parse().ok()?;
        let flags: Vec<&str> = fields[2].split(',').collect();
        let primary_id = (fields[3] != "-").then(|| fields[3].to_owned());
        let mut slots = Vec::new();
        for token in &fields[8..] {
            if token.starts_with('[') {
                continue;
            }
            let range = match token.split_once('-') {
                Some((first, last)) => (first.parse().ok()?, last.parse().ok()?),
                None => {
                    let slot = token.parse().ok()?;
                    (slot, slot)
                }
            };
            slots.push(range);
        }
        Some(NodeLine {
            id: fields[0].to_owned(),
            port,
            myself: flags.contains(&"myself"),
            primary: flags.contains(&"master"),
            failing: flags.contains(&"fail") || flags.contains(&"fail?"),
            primary_id,
            slots,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_of_follows_hash_tags() {
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
        assert_eq!(slot_of("{foo}bar"), slot_of("foo"));
        assert_eq!(slot_of("a{foo}{bar}"), slot_of("foo"));
        assert_eq!(slot_of("{}foo"), slot_of_whole("{}foo"));
        assert_eq!(slot_of("foo{"), slot_of_whole("foo{"));
    }

    fn slot_of_whole(key: &str) -> u16 {
        (u32::from(crc16_xmodem(key.as_bytes())) % SLOTS) as u16
    }

    #[test]
    fn cluster_nodes_lines_parse() {
        let view = View::parse(
            "e7d1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460 [93->-07c3]\n\
             07c3 127.0.0.1:30004@40004,host4 slave e7d1 0 1426238317239 4 connected\n\
             67ed 127.0.0.1:30002@40002 master,fail - 1426238316232 1426238315228 2 disconnected 5461 5462-10922\n\
             aaaa :0@0 master,noaddr - 0 0 0 disconnected\n",
        )
        .unwrap();
        assert_eq!(view.nodes.len(), 4);
        let first = &view.nodes[0];
        assert!(first.myself && first.primary && !first.failing);
        assert_eq!(first.slots, [(0, 5460)]);
        assert_eq!(view.nodes[1].primary_id.as_deref(), Some("e7d1"));
        assert_eq!(view.nodes[1].port, 30004);
        assert!(view.nodes[2].failing);
        assert_eq!(view.owner(5461), Some(30002));
        assert_eq!(view.owner(93), Some(30001));
        assert_eq!(view.owner(16000), None);
        assert_eq!(view.nodes[3].port, 0);
    }
}
