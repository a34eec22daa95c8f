//! The etcd lock recipe (`leasehold::__etcd`, feature `etcd`) against one real etcd member, started once for this
//! binary (about 0.5 s) and killed when it ends. The tests run one after the other, each on lock paths of its own.
//! Run one with `cargo test --test etcd_recipe -- NAME_PART`.

mod faults;
mod interop;
mod kinds;

use std::future::Future;
use std::time::Duration;

use leasehold::__etcd::rpc::{Client, ConnectOptions, GetOptions};
use leasehold::__etcd::{Session, SessionOptions};
use leasehold_tests::EtcdServer;

type TestFn = leasehold_tests::sequence::SharedTest<EtcdServer>;

const TESTS: &[(&str, TestFn)] = leasehold_tests::sequence_tests![
    kinds::two_clients_exclude_each_other,
    kinds::three_waiters_are_granted_in_fifo_order,
    kinds::readers_share_and_a_writer_excludes,
    kinds::a_semaphore_of_two_admits_two,
    kinds::fences_strictly_increase_across_holders,
    kinds::measured_latencies,
    faults::a_stale_release_does_not_delete_the_successor,
    faults::the_final_check_catches_a_lease_revoked_while_waiting,
    faults::a_dropped_acquire_leaves_no_key_behind,
    faults::a_session_writes_again_the_key_its_release_deleted,
    faults::a_stopped_holder_loses_its_session_before_another_client_is_granted,
    faults::the_deadline_counts_from_the_keep_alives_send_time,
    interop::etcdctl_lock_excludes_leasehold,
    interop::leasehold_excludes_etcdctl_lock,
    interop::etcdctl_elect_and_leasehold_elections_lead_in_turn,
];

fn main() {
    // Every test uses its own lock paths and leaves its sessions closed or dropped: nothing to heal.
    leasehold_tests::sequence::run_store_in_sequence(
        "etcd",
        "etcd member",
        TESTS,
        EtcdServer::start,
        |_| {},
    );
}

/// The bound on anything a test awaits that should happen.
pub const EVENT: Duration = Duration::from_secs(10);
/// How long a test watches for something that must *not* happen (a grant while another holds the lock).
pub const QUIET: Duration = Duration::from_millis(300);

/// A session of `ttl` seconds.
pub async fn session(etcd: &EtcdServer, ttl: u64) -> Session {
    let options = SessionOptions::default().ttl(Duration::from_secs(ttl));
    Session::connect(&etcd.url(), options).await.unwrap()
}

/// A plain etcd client, to look at and tamper with what the recipe wrote.
pub async fn raw(etcd: &EtcdServer) -> Client {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(2));
    Client::connect([etcd.endpoint()], Some(options))
        .await
        .unwrap()
}

/// How many keys are under `path/`.
pub async fn keys_under(client: &mut Client, path: &str) -> i64 {
    let options = GetOptions::new().with_prefix().with_count_only();
    client
        .get(format!("{path}/"), Some(options))
        .await
        .unwrap()
        .count()
}

/// Polls until `path/` holds `n` keys (a waiter has enqueued), for at most [`EVENT`]. etcd tells an outsider
/// nothing when a key appears short of a watch, and a poll of a few milliseconds is simpler here.
pub async fn wait_keys(client: &mut Client, path: &str, n: i64) {
    let deadline = tokio::time::Instant::now() + EVENT;
    loop {
        let count = keys_under(client, path).await;
        if count == n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path}/ holds {count} keys, not {n}, after {EVENT:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `future`'s output, or a panic naming `what` after [`EVENT`].
pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(EVENT, future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within {EVENT:?}"))
}

/// Panics if `task` finishes within [`QUIET`].
pub async fn still_waiting<T>(what: &str, task: &mut tokio::task::JoinHandle<T>) {
    assert!(
        tokio::time::timeout(QUIET, task).await.is_err(),
        "{what} finished while it should still wait"
    );
}
