//! Test harness for `leasehold`: real servers, real sockets, real processes.
//!
//! Nothing here is mocked. The pieces, one module each:
//!
//! - [`program`]: which server program all of them run ([`server_binary`]: `LEASEHOLD_TEST_SERVER`, or
//!   `redis-server` from `PATH`), and what it is ([`server_version`]: Redis or Valkey, and which version).
//! - [`server`]: [`RedisServer`] runs a private `redis-server` (or the [`server_binary`]) on a free port of
//!   127.0.0.1, with no persistence and its own temporary directory. It can be killed and
//!   restarted on the same port, and prints its log to stderr when dropped during a panic, so a
//!   failing test shows what the server saw.
//! - [`cluster`]: [`RedisCluster`], a local Redis Cluster of three primaries and three replicas
//!   (and [`slot_of`], a key's hash slot). It kills, restarts, fails over and migrates slots on
//!   demand, and waits until every node agrees on the result.
//! - [`sentinel`]: [`SentinelSet`], one primary, two replicas and three sentinels; it kills,
//!   restarts, fails over and puts a node to sleep on demand.
//! - [`quorum`]: [`QuorumNodes`], independent servers for a quorum lock, whose restarts keep the Redlock restart
//!   rule (down for [`restart_downtime`]).
//! - [`etcd`]: [`EtcdServer`] (one member) and [`EtcdCluster`] (three) run private `etcd` members on free ports of
//!   127.0.0.1 with their data in temporary directories; they kill, restart, pause and resume members on demand,
//!   name the leader, and print the members' logs when dropped during a panic.
//! - [`zookeeper`]: [`ZkServer`] (standalone) and [`ZkEnsemble`] (three) run private ZooKeeper servers the same way,
//!   and show ZooKeeper's own view of sessions and ephemeral nodes; [`kazoo_python`] is a Python with the kazoo client.
//! - [`ensemble`]: what those two share, [`Standalone`](ensemble::Standalone) (one member) and
//!   [`Ensemble`](ensemble::Ensemble) (three: start, kill, restart, pause, resume, the leader, URL and addresses,
//!   drop) over a [`Store`](ensemble::Store) that brings a member's command line, configuration, readiness probe and
//!   leader query; [`EtcdServer`], [`EtcdCluster`], [`ZkServer`] and [`ZkEnsemble`] are their aliases.
//! - [`postgres`]: [`PgServer`] runs a private PostgreSQL server (as the `postgres` user when the tests run as root)
//!   with a database `leasehold`; it kills, restarts, stops, pauses and resumes it (all its processes), and runs SQL
//!   through `psql`.
//! - [`mariadb`]: [`MariaDbServer`] does the same with a private MariaDB server (as the `mysql` user), running SQL
//!   through the `mariadb` client.
//! - [`sql`]: what those two share, [`SqlServer`](sql::SqlServer) (start, kill, restart, stop, pause, resume, its
//!   URL and address) over a [`Dialect`](sql::Dialect) that brings its programs, its command line and how its
//!   processes are signalled; [`PgServer`] and [`MariaDbServer`] are its two aliases.
//! - `daemon` (private): what those four store harnesses share, one server process with the directory of its log
//!   (spawn, wait until ready, kill, signal, reap, print the log on a panic) and the retries on a taken port; each
//!   store's module keeps only its command line, its readiness probe and its configuration.
//! - [`proxy`]: [`TcpProxy`] forwards TCP between a client and Redis and can turn into a black
//!   hole (bytes read and dropped, nothing closed) or reset every connection. This is how tests
//!   cut a lock holder off from Redis without it noticing at once.
//! - [`process`]: [`ChildGuard`] kills and reaps a child process on drop; [`send_signal`]
//!   sends `SIGSTOP`, `SIGCONT`, `SIGKILL` and friends.
//! - [`tls`]: [`TlsRedisServer`], a server that also speaks TLS, with certificates from a throwaway [`TestCa`]
//!   (on `redis-server` when the [`server_binary`] has no TLS: [`tls_server_binary`]).
//! - [`sequence`]: the `main` of a test binary whose tests share one topology and run one after the other.
//! - [`TempDir`]: a uniquely named directory removed on drop.
//! - [`rng`]: [`XorShift`], a seeded generator for replayable tests, and [`monotonic_ns`], the clock that several
//!   processes' histories share.
//!
//! Everything that can fail in a way a test cannot recover from panics with a message that
//! says what went wrong: this crate is only ever used from tests and benches.
//!
//! # Examples
//!
//! ```no_run
//! use leasehold_tests::{RedisServer, TcpProxy};
//!
//! # async fn dox() {
//! let server = RedisServer::start();
//! let proxy = TcpProxy::start(server.addr()).await;
//! let mut con = proxy.client().get_multiplexed_async_connection().await.unwrap();
//! let _: () = redis::cmd("PING").query_async(&mut con).await.unwrap();
//!
//! proxy.blackhole(); // from here on, `con` hears nothing and nothing it says arrives
//! # }
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod cluster;
mod daemon;
pub mod ensemble;
pub mod etcd;
pub mod mariadb;
pub mod postgres;
pub mod process;
pub mod program;
pub mod proxy;
pub mod quorum;
pub mod rng;
pub mod sentinel;
pub mod sequence;
pub mod server;
pub mod sql;
mod temp;
pub mod tls;
pub mod zookeeper;

pub use cluster::{slot_of, RedisCluster};
pub use etcd::{EtcdCluster, EtcdServer};
pub use mariadb::MariaDbServer;
pub use postgres::PgServer;
pub use process::{send_signal, ChildGuard};
pub use program::{
    is_default_server, server_binary, server_binary_path, server_version, Flavour, ServerVersion,
    DEFAULT_SERVER, SERVER_ENV,
};
pub use proxy::TcpProxy;
pub use quorum::{restart_downtime, QuorumNodes};
pub use rng::{monotonic_ns, XorShift};
pub use sentinel::SentinelSet;
pub use server::{assert_exclusive_sections, RedisServer};
pub use temp::TempDir;
pub use tls::{tls_server_binary, TestCa, TlsRedisServer};
pub use zookeeper::{kazoo_python, ZkEnsemble, ZkServer};
