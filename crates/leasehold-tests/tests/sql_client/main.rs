//! The SQL stores under their own faults, on one PostgreSQL and one MariaDB server (each started once for the binary,
//! the tests in sequence on it): the server restarted under held and waited locks, the client's connections killed
//! server-side, a holder frozen past its lease, the caller's transaction outliving the lease, names a default
//! collation would fold together, wake-ups across clients (also after the waiter's listener reconnected into a
//! partition, or when the waiter enqueued during the release), no notification where nobody waits, one round trip per
//! uncontended acquisition, a user with only the documented grants, reads that write nothing, a crashed client's rows
//! cleaned up, and TLS.
//!
//! Run one test on one store with `cargo test --test sql_client -- mysql::faults::NAME`.

mod admin;
mod bells;
mod clean_up;
mod commit_check;
mod faults;
mod fences;
#[path = "../shared/helpers.rs"]
mod helpers;
mod least_privilege;
mod names;
mod reads;
mod renewal;
mod round_trips;
mod takeover;
mod tls;
mod transactions;
mod wake_ups;

use std::net::SocketAddr;
use std::time::Duration;

use leasehold::Client;
use leasehold_tests::sql::{Dialect, SqlServer};
use leasehold_tests::{MariaDbServer, PgServer};

/// The bound on anything a test awaits that should happen.
pub const EVENT: Duration = Duration::from_secs(20);

/// The session TTL of the tests' clients.
pub const TTL: Duration = Duration::from_secs(2);

/// The lock prefix of this binary's tests, numbered by `fresh_prefix`.
const PREFIX: &str = "sqlc";
/// The session the clients ask for.
const SESSION: Duration = TTL;
/// The part of the session a grant counts on after each answered renewal: all of it.
const VALIDITY: Duration = TTL;

pub use helpers::{client, eventually, granted, renewed_after, waiters};

/// One database under test.
pub enum Db {
    Postgres(PgServer),
    MySql(MariaDbServer),
}

impl Db {
    /// The server's address, for a proxy in front of it.
    pub fn addr(&self) -> SocketAddr {
        match self {
            Db::Postgres(server) => server.addr(),
            Db::MySql(server) => server.addr(),
        }
    }

    /// The URL of the server's `leasehold` database at `addr` (the server's own address, or a proxy's).
    pub fn url_at(&self, addr: SocketAddr) -> String {
        match self {
            Db::Postgres(_) => format!("postgres://postgres@{addr}/leasehold"),
            Db::MySql(_) => format!("mysql://root@{addr}/leasehold"),
        }
    }

    pub fn url(&self) -> String {
        self.url_at(self.addr())
    }

    /// The URL of the server's `leasehold` database for the login `user` (no password: the test servers trust
    /// 127.0.0.1).
    pub fn url_as(&self, user: &str) -> String {
        let addr = self.addr();
        match self {
            Db::Postgres(_) => format!("postgres://{user}@{addr}/leasehold"),
            Db::MySql(_) => format!("mysql://{user}@{addr}/leasehold"),
        }
    }

    /// Runs `sql` through the server's command-line client; its output.
    pub fn sql(&self, sql: &str) -> String {
        match self {
            Db::Postgres(server) => server.psql(sql),
            Db::MySql(server) => server.sql(sql),
        }
    }

    /// Kills every connection of the server but the command-line client's own (leasehold's pool, its listener):
    /// `pg_terminate_backend`, `KILL CONNECTION`.
    pub fn kill_connections(&self) -> usize {
        match self {
            Db::Postgres(server) => server
                .psql(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
                )
                .trim()
                .parse()
                .unwrap(),
            Db::MySql(server) => {
                let ids = server.sql(
                    "SELECT id FROM information_schema.processlist \
                     WHERE id <> CONNECTION_ID() AND command <> 'Daemon' AND user <> 'system user'",
                );
                let ids: Vec<&str> = ids.split_whitespace().collect();
                for id in &ids {
                    // Gone already (it ended meanwhile) is fine.
                    let _ = server.try_sql(&format!("KILL CONNECTION {id}"));
                }
                ids.len()
            }
        }
    }

    /// Kills the server (`SIGKILL`) and starts it again on the same port with the same data.
    pub fn crash_and_restart(&mut self) {
        match self {
            Db::Postgres(server) => server.restart(),
            Db::MySql(server) => server.restart(),
        }
    }

    /// A prefix no other test uses: the namespace (the tables) of one test's locks.
    pub fn fresh_prefix(&self) -> String {
        helpers::fresh_prefix()
    }
}

/// A client under `prefix` with a session of `ttl`, at `url`.
pub async fn client_with(url: &str, prefix: &str, ttl: Duration) -> Client {
    connect(url, prefix, ttl).await.unwrap()
}

/// A client under `prefix` with a session of `ttl`, at `url`, or why it could not connect.
pub async fn connect(url: &str, prefix: &str, ttl: Duration) -> Result<Client, leasehold::Error> {
    Client::builder(url)
        .unwrap()
        .prefix(prefix)
        .session_ttl(ttl)
        .connect()
        .await
}

/// A client under `prefix` with sessions of a minute, at `url`: its waiters' only other way to learn of a release is
/// the holder's expiry, past [`EVENT`]. Its listener pings every 2 s (the per-call deadline), its keeper renews every
/// 15 s.
pub async fn long_session_client(url: &str, prefix: &str) -> Client {
    client_with(url, prefix, Duration::from_secs(60)).await
}

type TestFn = leasehold_tests::sequence::SharedTest<Db>;

const TESTS: &[(&str, TestFn)] = leasehold_tests::sequence_tests![
    faults::a_crashed_server_keeps_held_and_waited_locks_apart,
    faults::connections_killed_server_side_are_replaced,
    faults::a_frozen_holder_is_lost_before_another_is_granted,
    faults::a_release_wakes_another_clients_waiter,
    faults::a_waiter_whose_connections_went_silent_still_hears_the_release,
    wake_ups::a_waiter_whose_listener_reconnected_into_a_partition_still_hears_the_release,
    bells::a_waiter_blocks_on_the_holders_bell_instead_of_polling,
    bells::a_waiter_behind_an_entry_without_its_bell_is_granted_at_the_release,
    bells::a_permit_waiter_blocks_on_the_oldest_holders_bell_and_hears_any_release,
    wake_ups::only_a_release_with_an_entry_behind_it_notifies,
    wake_ups::a_waiter_enqueued_while_the_release_runs_is_woken_by_it,
    round_trips::an_uncontended_acquisition_is_one_round_trip,
    least_privilege::a_user_with_the_documented_grants_locks_waits_and_releases,
    least_privilege::a_user_missing_any_one_right_is_refused_at_connect_naming_it,
    least_privilege::a_user_who_may_not_create_the_missing_tables_is_told_both_ways_out,
    reads::reads_write_nothing_and_need_only_select,
    clean_up::a_crashed_clients_rows_go_though_nobody_waits_for_its_locks,
    transactions::a_transaction_commits_while_the_grant_is_live,
    transactions::a_transaction_outliving_the_lease_cannot_commit,
    names::names_a_collation_folds_stay_apart,
    renewal::a_renewal_applied_late_never_moves_the_expiry_back,
    renewal::a_session_expired_on_the_server_is_not_renewed,
    renewal::renewals_landing_out_of_order_let_nobody_in_before_the_loss,
    fences::a_cached_fence_sequence_still_gives_one_holder_and_rising_fences,
    takeover::a_renewal_committed_while_the_reaper_waits_wins,
    commit_check::a_transaction_checked_after_the_expiry_is_refused,
    commit_check::the_commit_check_holds_a_takeover_off_until_the_commit,
    tls::sslmode_require_verifies_and_encrypts_every_connection,
];

fn main() {
    leasehold_tests::sequence::trace_from_env();
    let dbs: &[leasehold_tests::sequence::Topology<Db>] = &[
        ("postgres", || {
            Db::Postgres(PgServer::start_counting_statements())
        }),
        ("mysql", || Db::MySql(MariaDbServer::start())),
    ];
    leasehold_tests::sequence::run_on_each(dbs, TESTS, |db| match db {
        Db::Postgres(server) => heal(server),
        Db::MySql(server) => heal(server),
    });
}

/// After a failed test, which may leave the server killed or paused: running again.
fn heal<D: Dialect>(server: &mut SqlServer<D>) {
    if server.pid().is_none() {
        server.restart();
    } else {
        server.resume();
    }
}
