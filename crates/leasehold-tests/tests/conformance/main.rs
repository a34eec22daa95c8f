//! The conformance suite: the same tests, written against the public API only, on every store leasehold supports
//! (one Redis server, one etcd member, one ZooKeeper server, one PostgreSQL and one MariaDB server; each started once
//! for the binary, the tests run in sequence on it, each under
//! a lock prefix of its own). A behaviour that differs by store is in the store's own test binary, or in
//! `caps::supports_agrees_with_what_the_store_does`, which checks each store's column of the capabilities
//! against what the store does.
//!
//! Run one test on one store with `cargo test --test conformance -- etcd::basics::NAME`.

mod basics;
mod caps;
mod election;
mod kinds;
mod loss;
mod multi;
mod observe;
mod ttl;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use leasehold::Client;
use leasehold_tests::{EtcdServer, MariaDbServer, PgServer, RedisServer, TcpProxy, ZkServer};

/// The bound on anything a test awaits that should happen.
pub const EVENT: Duration = Duration::from_secs(15);

/// The shortest lease every store grants (etcd's shortest lease is 2 s): the lease of the loss tests (on etcd and
/// ZooKeeper, the session's).
pub const SHORT: Duration = Duration::from_secs(2);

/// One store under test.
pub enum Store {
    Redis(RedisServer),
    Etcd(EtcdServer),
    ZooKeeper(ZkServer),
    Postgres(PgServer),
    MySql(MariaDbServer),
}

static PREFIXES: AtomicU64 = AtomicU64::new(0);

impl Store {
    pub fn name(&self) -> &'static str {
        match self {
            Store::Redis(_) => "redis",
            Store::Etcd(_) => "etcd",
            Store::ZooKeeper(_) => "zookeeper",
            Store::Postgres(_) => "postgres",
            Store::MySql(_) => "mysql",
        }
    }

    /// Whether every grant of a client lives in one session (etcd, ZooKeeper, the SQL stores), not in a lease of its
    /// own.
    pub fn has_sessions(&self) -> bool {
        !matches!(self, Store::Redis(_))
    }

    /// The server's address, for a proxy in front of it.
    pub fn addr(&self) -> SocketAddr {
        match self {
            Store::Redis(server) => server.addr(),
            Store::Etcd(server) => server.endpoint().parse().unwrap(),
            Store::ZooKeeper(server) => server.addr(),
            Store::Postgres(server) => server.addr(),
            Store::MySql(server) => server.addr(),
        }
    }

    /// The store's URL for a server at `addr` (the server's own address, or a proxy's).
    pub fn url_at(&self, addr: SocketAddr) -> String {
        match self {
            Store::Redis(_) => format!("redis://{addr}"),
            Store::Etcd(_) => format!("etcd://{addr}"),
            Store::ZooKeeper(_) => format!("zk://{addr}"),
            Store::Postgres(_) => format!("postgres://postgres@{addr}/leasehold"),
            Store::MySql(_) => format!("mysql://root@{addr}/leasehold"),
        }
    }

    /// On the SQL stores, the session rows under `prefix` (its table `PREFIX_session`); `None` elsewhere.
    pub fn session_rows(&self, prefix: &str) -> Option<usize> {
        let count = format!("SELECT count(*) FROM {prefix}_session");
        let rows = match self {
            Store::Postgres(server) => server.psql(&count),
            Store::MySql(server) => server.sql(&count),
            _ => return None,
        };
        Some(rows.trim().parse().unwrap())
    }

    /// A prefix no other test uses: the namespace of one test's locks.
    pub fn fresh_prefix(&self) -> String {
        format!("conf{}", PREFIXES.fetch_add(1, Ordering::Relaxed))
    }

    /// A client under `prefix`.
    pub async fn client(&self, prefix: &str) -> Client {
        self.client_at(self.addr(), prefix).await
    }

    /// A client under `prefix` whose leases are [`SHORT`] (on etcd and ZooKeeper, its session's; on Redis, give each
    /// lock handle `.ttl(SHORT)`), through `addr`.
    pub async fn client_at(&self, addr: SocketAddr, prefix: &str) -> Client {
        let mut builder = Client::builder(&self.url_at(addr)).unwrap().prefix(prefix);
        if self.has_sessions() {
            builder = builder.session_ttl(SHORT);
        }
        builder.connect().await.unwrap()
    }

    /// A client under `prefix` through a fresh proxy in front of the server (for partitions).
    pub async fn client_through_proxy(&self, prefix: &str) -> (Client, TcpProxy) {
        let proxy = TcpProxy::start(self.addr()).await;
        (self.client_at(proxy.addr(), prefix).await, proxy)
    }
}

type TestFn = leasehold_tests::sequence::SharedTest<Store>;

const TESTS: &[(&str, TestFn)] = leasehold_tests::sequence_tests![
    basics::a_try_excludes_and_a_release_frees,
    basics::fences_strictly_increase_across_holders,
    basics::a_waiter_is_granted_by_the_release,
    basics::fair_waiters_are_granted_in_fifo_order,
    basics::a_wait_times_out_while_the_lock_is_held,
    basics::a_dropped_guard_frees_the_lock,
    basics::a_cancelled_wait_leaves_nothing_behind,
    basics::run_hands_the_lease_to_the_work_and_releases,
    basics::a_waiter_that_gave_up_in_an_exited_process_blocks_nobody,
    kinds::readers_share_and_a_writer_excludes,
    kinds::a_waiting_writer_holds_back_later_readers,
    kinds::a_semaphore_admits_its_permits,
    kinds::a_reentrant_mutex_reenters_and_excludes_others,
    kinds::a_semaphore_refuses_a_count_that_disagrees_with_its_holders,
    kinds::a_permit_is_not_granted_behind_an_exclusive_holder,
    loss::a_force_release_ends_the_holders_lease,
    loss::a_cut_off_holder_is_told_before_another_is_granted,
    loss::run_drops_the_work_when_the_lease_is_lost,
    election::campaigns_lead_in_turn_with_growing_fences,
    election::a_leader_proclaims_and_an_observer_sees_every_term_in_order,
    election::a_lost_term_says_so_and_its_proclamation_is_refused,
    election::a_proclaimed_term_is_renewed_like_any_other,
    election::terms_are_counted_and_an_observer_counts_the_ones_it_missed,
    multi::a_set_is_taken_whole_or_not_at_all,
    multi::sets_in_opposite_orders_never_deadlock_or_overlap,
    multi::a_set_waits_in_each_queue_and_times_out_as_a_whole,
    multi::a_members_loss_ends_the_set,
    multi::a_set_mixes_kinds,
    observe::inspect_and_list_name_the_holder,
    ttl::each_lock_is_granted_under_its_own_ttl,
    ttl::a_short_ttl_frees_a_cut_off_holder_within_it,
    ttl::closing_the_client_closes_the_session_of_every_ttl,
    ttl::a_ttl_the_store_cannot_grant_is_refused_before_anything_is_taken,
    caps::supports_agrees_with_what_the_store_does,
    caps::a_refused_downgrade_leaves_nothing_held,
];

fn main() {
    leasehold_tests::sequence::trace_from_env();
    let stores: &[leasehold_tests::sequence::Topology<Store>] = &[
        ("redis", || Store::Redis(RedisServer::start())),
        ("etcd", || Store::Etcd(EtcdServer::start())),
        ("zookeeper", || Store::ZooKeeper(ZkServer::start())),
        ("postgres", || Store::Postgres(PgServer::start())),
        ("mysql", || Store::MySql(MariaDbServer::start())),
    ];
    // Every test uses a prefix of its own and leaves nothing behind that another test could see.
    leasehold_tests::sequence::run_on_each(stores, TESTS, |_| {});
}

/// Polls `check` until it holds, for at most [`EVENT`] (see `leasehold_tests::sequence::eventually`).
pub async fn eventually<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    leasehold_tests::sequence::eventually(what, EVENT, check).await;
}

/// Waits until lock `name` has `n` waiters, as `inspect` counts them.
pub async fn waiters(client: &Client, name: &str, n: u64) {
    leasehold_tests::sequence::waiters(client, name, n, EVENT).await;
}
