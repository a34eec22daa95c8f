//! leasehold on a real Redis Cluster: 3 primaries and 3 replicas, started once for this whole binary (about 2.5 s)
//! and killed when it ends.
//!
//! The binary has its own `main` (`harness = false`): the tests share one cluster and some of them kill, fail over or
//! migrate its nodes, so they run one after the other, each leaving the cluster whole (3 + 3, every slot served) for
//! the next. Run one test with `cargo test --test cluster -- NAME_PART`.

// The futures of the fault tests nest deeper than the default limit lets rustc lay out (faults.rs).
#![recursion_limit = "256"]

mod faults;
mod kinds;
mod node_url;
mod processes;

use std::future::Future;
use std::time::Duration;

use leasehold_tests::RedisCluster;

type TestFn = leasehold_tests::sequence::SharedTest<RedisCluster>;

const TESTS: &[(&str, TestFn)] = leasehold_tests::sequence_tests![
    kinds::every_kind_locks_and_waits_on_the_cluster,
    kinds::a_release_hands_the_lock_to_a_waiter_on_its_sharded_channel,
    kinds::a_fair_release_hands_over_on_the_sharded_channel,
    kinds::leases_in_many_slots_are_renewed_and_released,
    kinds::one_pipeline_per_node_carries_many_slots_and_survives_a_moved_slot,
    kinds::held_locks_walks_every_primary,
    kinds::a_call_to_a_sleeping_primary_is_bounded,
    kinds::grants_wait_for_replicas_on_the_locks_own_node,
    node_url::a_redis_url_naming_one_node_locks_waits_and_hands_off_across_slots,
    node_url::a_database_other_than_0_on_a_cluster_node_is_refused,
    node_url::a_redirection_on_a_single_server_client_fails_at_once,
    processes::eight_processes_never_overlap_on_a_cluster,
    faults::a_lock_held_and_waited_for_survives_a_manual_failover,
    faults::a_lock_whose_slot_migrates_while_held_and_waited_for_stays_exclusive,
    faults::kill_9_of_the_locks_primary_never_gives_two_owners,
];

fn main() {
    // `LEASEHOLD_TEST_TRACE=debug` prints what leasehold traces.
    leasehold_tests::sequence::trace_from_env();
    // Whatever a failed test left broken, the next one gets a whole cluster.
    leasehold_tests::sequence::run_in_sequence("cluster", TESTS, RedisCluster::start, heal);
}

/// Restarts every killed node and waits until the cluster is whole again.
pub fn heal(cluster: &mut RedisCluster) {
    for i in 0..6 {
        if cluster.pid(i).is_none() {
            cluster.restart(i);
        }
    }
    cluster.wait_stable();
}

/// A leasehold client of the cluster.
pub async fn connect(cluster: &RedisCluster) -> leasehold::Client {
    leasehold::Client::connect(&cluster.url()).await.unwrap()
}

/// A client with a short response timeout, for tests that make the cluster misbehave.
pub async fn connect_with(cluster: &RedisCluster, response: Duration) -> leasehold::Client {
    leasehold::Client::builder(&cluster.url())
        .unwrap()
        .response_timeout(response)
        .connect()
        .await
        .unwrap()
}

/// The raw value of `key` on the node that serves its slot.
pub fn get(cluster: &RedisCluster, key: &str) -> Option<String> {
    let node = cluster.primary_of_slot(leasehold_tests::cluster::slot_of(key));
    redis::cmd("GET")
        .arg(key)
        .query(&mut cluster.connection(node))
        .unwrap()
}

/// Bounds a test step in time so a hang fails the test instead of stalling the suite.
pub async fn within<F: Future>(limit: Duration, what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what} did not happen within {limit:?}"),
    }
}

/// Polls `condition` (server state: nothing announces it) every 5 ms until it holds, at most `limit`.
pub async fn eventually(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} did not happen within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Whether client `client_id`'s sharded wake-up channel for the lock `name` is subscribed on the lock's primary, and
/// the lock's queue holds an entry: a release now hands the lock over through the channel.
pub fn waiter_ready(cluster: &RedisCluster, name: &str) -> bool {
    let lock = format!("leasehold:{{{name}}}");
    let node = cluster.primary_of_slot(leasehold_tests::cluster::slot_of(&lock));
    let mut con = cluster.connection(node);
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("SHARDCHANNELS")
        .arg(format!("{lock}:wake:*"))
        .query(&mut con)
        .unwrap();
    let queued: u64 = redis::cmd("LLEN")
        .arg(format!("{lock}:queue"))
        .query(&mut con)
        .unwrap();
    !channels.is_empty() && queued > 0
}
