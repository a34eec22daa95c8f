//! The public API on etcd under etcd's own faults: one three-member cluster for the binary (its tests run in
//! sequence, each under a lock prefix of its own, and kill, pause or partition its members), plus tests that start
//! a member of their own. What every store must do alike is in the conformance suite; this is what only etcd has:
//! elections, members that disappear, sessions, `etcdctl lock`.
//!
//! Run one with `cargo test --test etcd_client -- NAME_PART`.

mod auth;
mod cancel;
mod faults;
#[path = "../shared/helpers.rs"]
mod helpers;
mod interop;
#[path = "../shared/replicated.rs"]
mod replicated;
mod round_trips;
mod tls;

use std::time::Duration;

use leasehold_tests::EtcdCluster;

type TestFn = leasehold_tests::sequence::SharedTest<EtcdCluster>;

const TESTS: &[(&str, TestFn)] = leasehold_tests::sequence_tests![
    replicated::the_leader_killed_under_a_held_and_a_waited_lock,
    faults::a_partitioned_member_is_routed_around,
    replicated::a_paused_server_does_not_stall_the_lease,
    replicated::a_restarted_server_keeps_the_session_and_its_grants,
    faults::a_cut_keep_alive_stream_is_reopened,
    replicated::a_cut_off_session_is_lost_before_the_next_grant_and_replaced,
    replicated::many_grants_follow_one_session,
    faults::a_silently_dead_connection_is_replaced_within_the_lease,
    cancel::acquisitions_dropped_at_random_points_leave_nothing_behind,
    interop::etcdctl_lock_and_a_leasehold_mutex_exclude_each_other,
    auth::credentials_in_the_url_authenticate,
    auth::a_client_authenticates_again_when_its_token_is_forgotten,
    tls::etcds_trusts_a_private_ca,
    tls::etcds_presents_a_client_certificate_when_asked,
    round_trips::a_waiter_is_granted_by_the_release_alone,
    round_trips::a_reader_behind_a_reader_is_granted_in_one_request,
    round_trips::an_observer_is_woken_by_the_watch_not_its_interval,
];

fn main() {
    leasehold_tests::sequence::run_store_in_sequence(
        "etcd",
        "etcd cluster of 3",
        TESTS,
        EtcdCluster::start,
        replicated::Replicated::heal,
    );
}

/// The bound on anything a test awaits that should happen.
pub const EVENT: Duration = Duration::from_secs(20);

/// The session TTL of these tests: long enough to ride out an election (about 1.3 s) between keep-alives.
pub const TTL: Duration = Duration::from_secs(5);

/// The lock prefix of this binary's tests, numbered by `fresh_prefix`.
const PREFIX: &str = "etcdc";
/// The session the clients ask for.
const SESSION: Duration = TTL;
/// The part of the session a grant counts on after each answered keep-alive: all of it on etcd.
const VALIDITY: Duration = TTL;

pub use helpers::{client, eventually, fresh_prefix, granted, renewed_after, waiters};
