//! The bench's raw store: Redis on one server or on a Redis Cluster (the connections of the floor, and what is read
//! from the servers themselves: CPU time, script calls, the raw round trip, where keys live), etcd (see
//! [`super::etcd`]), ZooKeeper (see [`super::zookeeper`]), PostgreSQL (see [`super::postgres`]) or MySQL and MariaDB
//! (see [`super::mysql`]). On a cluster, server figures are summed over every primary; on etcd, ZooKeeper and
//! PostgreSQL, over the servers the URL names.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, Context as _};
use leasehold::redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use leasehold::redis::cluster::{ClusterClient, ClusterClientBuilder};
use leasehold::redis::cluster_async::ClusterConnection;
use leasehold::redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use leasehold::redis::{self, Cmd, Pipeline, RedisFuture, Value};

use super::etcd::Etcd;
use super::mysql::{self, MySql};
use super::postgres::{self, Pg};
use super::zookeeper::Zk;

/// Where the bench sends its raw commands: the server, cluster, etcd cluster, ZooKeeper ensemble, PostgreSQL or MySQL
/// server of `--store`.
#[derive(Clone)]
// One per run: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Raw {
    Single(redis::Client),
    Cluster(ClusterClient),
    Etcd(Etcd),
    ZooKeeper(Zk),
    Postgres(Pg),
    MySql(MySql),
}

/// What reads a store's own figures over a measured window: a connection to the Redis server (or cluster), the
/// etcd members' `/metrics` pages, the ZooKeeper servers' processes and `mntr`, or the SQL server's processes and a
/// connection for its statistics.
pub enum Meter {
    Redis(Conn),
    Etcd(Etcd),
    ZooKeeper(Zk),
    Postgres(postgres::Meter),
    MySql(mysql::Meter),
}

/// A raw connection of either kind; every command on a cluster goes to the node of its key.
#[derive(Clone)]
pub enum Conn {
    /// One server, reconnecting: the in-process floor and the raw round trip.
    Manager(ConnectionManager),
    /// One server: the floor's worker processes and the readings of the server.
    Multiplexed(MultiplexedConnection),
    /// redis-rs's cluster connection: follows `MOVED`/`ASK`, reaches every primary.
    Cluster(ClusterConnection),
}

/// Where the keys of a scenario live on a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spread {
    pub keys: usize,
    pub slots: usize,
    /// The primaries that own at least one of the keys.
    pub primaries: usize,
    /// Every primary of the cluster.
    pub of_primaries: usize,
}

impl Raw {
    /// A cluster for a `redis+cluster://` URL (reached through every node it names), etcd for an `etcd://` URL,
    /// ZooKeeper for a `zk://` URL, PostgreSQL for `postgres://` and `postgresql://`, MySQL for `mysql://` and
    /// `mariadb://`, else one server.
    pub fn open(url: &str) -> anyhow::Result<Raw> {
        if let Some(etcd) = Etcd::parse(url) {
            return Ok(Raw::Etcd(etcd));
        }
        if let Some(zk) = Zk::parse(url) {
            return Ok(Raw::ZooKeeper(zk));
        }
        if let Some(pg) = Pg::parse(url)? {
            return Ok(Raw::Postgres(pg));
        }
        if let Some(mysql) = MySql::parse(url)? {
            return Ok(Raw::MySql(mysql));
        }
        let Some(seeds) = leasehold::__private::cluster_seeds(url) else {
            return Ok(Raw::Single(redis::Client::open(url)?));
        };
        let client = ClusterClientBuilder::new(seeds)
            .connection_timeout(leasehold::DEFAULT_CONNECTION_TIMEOUT)
            // redis-rs waits forever for a cluster's reply by default; the floor gets leasehold's bound instead.
            .response_timeout(leasehold::DEFAULT_RESPONSE_TIMEOUT)
            .overall_response_timeout(Some(leasehold::DEFAULT_RESPONSE_TIMEOUT))
            .build()?;
        Ok(Raw::Cluster(client))
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, Raw::Cluster(_))
    }

    /// The etcd cluster, when the store is one.
    pub fn etcd(&self) -> Option<&Etcd> {
        match self {
            Raw::Etcd(etcd) => Some(etcd),
            _ => None,
        }
    }

    /// The ZooKeeper ensemble, when the store is one.
    pub fn zookeeper(&self) -> Option<&Zk> {
        match self {
            Raw::ZooKeeper(zk) => Some(zk),
            _ => None,
        }
    }

    /// The PostgreSQL server, when the store is one.
    pub fn postgres(&self) -> Option<&Pg> {
        match self {
            Raw::Postgres(pg) => Some(pg),
            _ => None,
        }
    }

    /// The MySQL or MariaDB server, when the store is one.
    pub fn mysql(&self) -> Option<&MySql> {
        match self {
            Raw::MySql(mysql) => Some(mysql),
            _ => None,
        }
    }

    /// Connects once to a PostgreSQL or MySQL server, as the floor does (the other stores are tried through the
    /// library's client).
    pub async fn reach(&self) -> anyhow::Result<()> {
        match self {
            Raw::Postgres(pg) => drop(pg.connect().await?),
            Raw::MySql(mysql) => mysql.connect().await?.disconnect().await?,
            _ => {}
        }
        Ok(())
    }

    /// How many servers the store's figures are summed over, when more than one: every primary of a cluster is
    /// counted as it is read, every member or server the URL names on etcd, ZooKeeper and PostgreSQL.
    pub fn summed(&self) -> bool {
        match self {
            Raw::Single(_) | Raw::MySql(_) => false,
            Raw::Cluster(_) => true,
            Raw::Etcd(etcd) => etcd.members() > 1,
            Raw::ZooKeeper(zk) => zk.servers() > 1,
            Raw::Postgres(pg) => pg.servers() > 1,
        }
    }

    /// The in-process floor's connection: a `ConnectionManager` on one server.
    pub async fn manager(&self) -> anyhow::Result<Conn> {
        Ok(match self {
            Raw::Single(client) => Conn::Manager(client.get_connection_manager().await?),
            Raw::Cluster(client) => Conn::Cluster(client.get_async_connection().await?),
            _ => bail!("a Redis connection was asked of another store"),
        })
    }

    /// What reads the store's CPU time and renewal calls.
    pub async fn meter(&self) -> anyhow::Result<Meter> {
        Ok(match self {
            Raw::Etcd(etcd) => Meter::Etcd(etcd.clone()),
            Raw::ZooKeeper(zk) => Meter::ZooKeeper(zk.clone()),
            Raw::Postgres(pg) => Meter::Postgres(pg.meter().await?),
            Raw::MySql(mysql) => Meter::MySql(mysql.meter().await?),
            redis => Meter::Redis(redis.multiplexed().await?),
        })
    }

    /// A connection for the floor's worker processes and the readings of the server: a multiplexed connection on
    /// one server.
    pub async fn multiplexed(&self) -> anyhow::Result<Conn> {
        Ok(match self {
            Raw::Single(client) => {
                Conn::Multiplexed(client.get_multiplexed_async_connection().await?)
            }
            Raw::Cluster(client) => Conn::Cluster(client.get_async_connection().await?),
            _ => bail!("a Redis connection was asked of another store"),
        })
    }
}

impl Meter {
    /// The store's CPU time so far (user + system, all its threads), by node: `INFO cpu` of the server or of every
    /// primary of a cluster; `process_cpu_seconds_total` of every etcd member; each ZooKeeper server's process,
    /// the PostgreSQL server's processes, the MySQL server's, when they run on this machine.
    pub async fn cpu_seconds(&mut self) -> anyhow::Result<BTreeMap<String, f64>> {
        let conn = match self {
            Meter::Etcd(etcd) => return etcd.cpu_seconds().await,
            Meter::ZooKeeper(zk) => return zk.cpu_seconds().await,
            Meter::Postgres(pg) => return pg.cpu_seconds(),
            Meter::MySql(mysql) => return mysql.cpu_seconds(),
            Meter::Redis(conn) => conn,
        };
        let mut seconds = BTreeMap::new();
        for (node, info) in conn.info("cpu").await? {
            let field = |name: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                    .and_then(|v| v.trim().parse::<f64>().ok())
            };
            match (field("used_cpu_user"), field("used_cpu_sys")) {
                (Some(user), Some(sys)) => seconds.insert(node, user + sys),
                _ => bail!("INFO cpu of {node} has no used_cpu_user/used_cpu_sys"),
            };
        }
        Ok(seconds)
    }

    /// The renewal calls the store has counted so far: script calls (`EVALSHA` + `EVAL`) of the server or every
    /// primary; lease renewals (keep-alives) on etcd; every request the servers received on ZooKeeper (the
    /// session's `sync`s and pings), PostgreSQL (transactions) and MySQL (`Questions`), while the bench runs alone
    /// there.
    pub async fn renewal_calls(&mut self) -> anyhow::Result<u64> {
        let conn = match self {
            Meter::Etcd(etcd) => return etcd.lease_renewals().await,
            Meter::ZooKeeper(zk) => return zk.requests_received().await,
            Meter::Postgres(pg) => return pg.transactions().await,
            Meter::MySql(mysql) => return mysql.questions().await,
            Meter::Redis(conn) => conn,
        };
        let infos = conn.info("commandstats").await?;
        let mut total = 0;
        for line in infos.values().flat_map(|info| info.lines()) {
            for cmd in ["cmdstat_evalsha:", "cmdstat_eval:"] {
                if let Some(rest) = line.strip_prefix(cmd) {
                    let calls = rest
                        .split(',')
                        .find_map(|f| f.strip_prefix("calls="))
                        .and_then(|n| n.parse::<u64>().ok())
                        .unwrap_or(0);
                    total += calls;
                }
            }
        }
        Ok(total)
    }
}

impl Conn {
    /// `INFO section` of the server, or of every primary of the cluster, by node address.
    pub async fn info(&mut self, section: &str) -> anyhow::Result<BTreeMap<String, String>> {
        let mut cmd = redis::cmd("INFO");
        cmd.arg(section);
        let Conn::Cluster(conn) = self else {
            let text: String = cmd.query_async(self).await?;
            return Ok(BTreeMap::from([("server".to_owned(), text)]));
        };
        let all = conn
            .route_command(
                cmd,
                RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
            )
            .await?;
        let Value::Map(replies) = all else {
            bail!("INFO from every primary: not one reply per primary: {all:?}");
        };
        let mut texts = BTreeMap::new();
        for (node, reply) in replies {
            let node: String = redis::from_redis_value(node)?;
            let text: String = redis::from_redis_value(reply)
                .with_context(|| format!("INFO {section} from {node}"))?;
            texts.insert(node, text);
        }
        Ok(texts)
    }

    /// One `PING`, on a cluster to the primary of the lock `name` (the node a lock call on it goes to).
    pub async fn ping(&mut self, name: &str) -> anyhow::Result<()> {
        let Conn::Cluster(conn) = self else {
            let _: String = redis::cmd("PING").query_async(self).await?;
            return Ok(());
        };
        let slot = leasehold::__private::slot_of(leasehold::DEFAULT_PREFIX, name)
            .with_context(|| format!("no slot for the lock {name:?}"))?;
        let route = Route::new(slot, SlotAddr::Master);
        conn.route_command(
            redis::cmd("PING"),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
        )
        .await?;
        Ok(())
    }

    /// Where the locks `names` live on a cluster (`None` on one server). The floor's key for a lock is its name,
    /// which has no hash tag: its slot is that of the whole name, the same as the slot of the lock (whose keys
    /// are tagged with the name), so this is where the floor's keys live too.
    pub async fn spread(&mut self, names: &[String]) -> anyhow::Result<Option<Spread>> {
        let Conn::Cluster(conn) = self else {
            return Ok(None);
        };
        let ranges =
            primaries_by_slot(redis::cmd("CLUSTER").arg("SLOTS").query_async(conn).await?)?;
        let mut slots = BTreeSet::new();
        let mut owners = BTreeSet::new();
        for name in names {
            let slot = leasehold::__private::slot_of(leasehold::DEFAULT_PREFIX, name)
                .with_context(|| format!("no slot for the lock {name:?}"))?;
            slots.insert(slot);
            let owner = ranges
                .iter()
                .find(|(start, end, _)| (*start..=*end).contains(&slot))
                .with_context(|| format!("no primary serves slot {slot}"))?;
            owners.insert(owner.2.clone());
        }
        let of_primaries = ranges.iter().map(|r| &r.2).collect::<BTreeSet<_>>().len();
        Ok(Some(Spread {
            keys: names.len(),
            slots: slots.len(),
            primaries: owners.len(),
            of_primaries,
        }))
    }
}

/// `(first slot, last slot, primary's host:port)` of every range of a `CLUSTER SLOTS` reply.
fn primaries_by_slot(reply: Value) -> anyhow::Result<Vec<(u16, u16, String)>> {
    let ranges: Vec<Vec<Value>> = redis::from_redis_value(reply)?;
    let mut out = Vec::new();
    for range in ranges {
        let [start, end, primary, ..] = &range[..] else {
            bail!("CLUSTER SLOTS: a range without a primary");
        };
        let node: Vec<Value> = redis::from_redis_value_ref(primary)?;
        let [host, port, ..] = &node[..] else {
            bail!("CLUSTER SLOTS: a primary without host and port");
        };
        let host: String = redis::from_redis_value_ref(host)?;
        let port: u16 = redis::from_redis_value_ref(port)?;
        out.push((
            redis::from_redis_value_ref(start)?,
            redis::from_redis_value_ref(end)?,
            format!("{host}:{port}"),
        ));
    }
    Ok(out)
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Manager(conn) => conn.req_packed_command(cmd),
            Conn::Multiplexed(conn) => conn.req_packed_command(cmd),
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Manager(conn) => conn.req_packed_commands(pipeline, offset, count),
            Conn::Multiplexed(conn) => conn.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Manager(conn) => conn.get_db(),
            Conn::Multiplexed(conn) => conn.get_db(),
            Conn::Cluster(conn) => conn.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_slots_name_the_primary_of_each_range() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(7000), bulk("id0")]),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(7003), bulk("id3")]),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(7001), bulk("id1")]),
            ]),
        ]);
        assert_eq!(
            primaries_by_slot(reply).unwrap(),
            [
                (0, 5460, "127.0.0.1:7000".to_owned()),
                (5461, 16383, "127.0.0.1:7001".to_owned())
            ]
        );
    }
}
