//! The public API on ZooKeeper under ZooKeeper's own faults: one three-server ensemble for the binary (its tests run
//! in sequence, each under a lock prefix of its own, and kill or pause its servers), plus tests that start a
//! standalone server of their own. What every store must do alike is in the conformance suite; this is what only
//! ZooKeeper has: sessions that expire on the server, elections, creates whose answer is lost, kazoo.
//!
//! Run one with `cargo test --test zookeeper_client -- NAME_PART`.

mod auth;
mod deletion;
mod faults;
#[path = "../shared/helpers.rs"]
mod helpers;
mod interop;
mod processes;
#[path = "../shared/replicated.rs"]
mod replicated;
mod round_trips;
mod session;
mod writes;

use std::time::Duration;

use leasehold_tests::ZkEnsemble;

type TestFn = leasehold_tests::sequence::SharedTest<ZkEnsemble>;

const TESTS: &[(&str, TestFn)] = leasehold_tests::sequence_tests![
    replicated::the_leader_killed_under_a_held_and_a_waited_lock,
    replicated::a_paused_server_does_not_stall_the_lease,
    replicated::a_restarted_server_keeps_the_session_and_its_grants,
    replicated::a_cut_off_session_is_lost_before_the_next_grant_and_replaced,
    faults::creates_whose_answer_is_lost_leave_one_node_each,
    replicated::many_grants_follow_one_session,
    faults::an_unreachable_ensemble_fails_the_connect_at_once,
    faults::the_loss_signal_fires_within_six_eighths_of_the_session_after_a_cut,
    faults::fences_grow_across_a_reaped_and_recreated_lock_node,
    deletion::a_set_on_the_grants_node_does_not_hide_its_delete,
    deletion::a_delete_while_the_holders_connection_is_reset_reaches_it,
    processes::a_killed_waiter_leaves_the_queue_with_its_session,
    interop::kazoo_and_leasehold_exclude_each_other,
    interop::kazoo_read_write_locks_share_and_exclude_with_leaseholds,
    interop::kazoo_locks_wait_for_leasehold_permits,
    interop::a_kazoo_semaphore_is_not_seen_by_leasehold,
    interop::kazoo_elections_and_leasehold_elections_lead_in_turn,
    writes::guarded_writes_commit_only_while_the_grant_holds,
    auth::credentials_in_the_url_authenticate,
    session::a_lease_outside_the_ensembles_bounds_runs_with_the_negotiated_timeout,
    round_trips::an_uncontended_cycle_is_two_round_trips,
    round_trips::a_woken_waiter_is_granted_without_another_round_trip,
    round_trips::a_waiter_whose_node_was_deleted_is_granted_only_on_a_new_one,
    round_trips::an_observer_is_woken_by_watches_not_its_interval,
];

fn main() {
    leasehold_tests::sequence::run_store_in_sequence(
        "zookeeper",
        "ZooKeeper ensemble of 3",
        TESTS,
        ZkEnsemble::start,
        replicated::Replicated::heal,
    );
}

/// The bound on anything a test awaits that should happen.
pub const EVENT: Duration = Duration::from_secs(20);

/// The session timeout these tests ask for (the servers' tick is 500 ms: it is granted as asked).
pub const TIMEOUT: Duration = Duration::from_secs(4);

/// The part of the session timeout a grant counts on after each answered keep-alive (see `session.rs`).
pub const VALIDITY: Duration = Duration::from_millis(2500);

/// The lock prefix of this binary's tests, numbered by `fresh_prefix`.
const PREFIX: &str = "zkc";
/// The session the clients ask for.
const SESSION: Duration = TIMEOUT;

pub use helpers::{client, eventually, fresh_prefix, granted, renewed_after, waiters};
