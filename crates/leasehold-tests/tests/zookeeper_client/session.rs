//! A lock's TTL on ZooKeeper: the session timeout its grants' session asks for, which the ensemble negotiates within
//! its bounds.

use std::time::Duration;

use leasehold_tests::ZkEnsemble;

/// The ensemble's `maxSessionTimeout`: its default, 20 ticks of 500 ms.
const MAX_SESSION: Duration = Duration::from_secs(10);

pub async fn a_lease_outside_the_ensembles_bounds_runs_with_the_negotiated_timeout(
    ensemble: &mut ZkEnsemble,
) {
    let prefix = crate::fresh_prefix();
    let a = crate::client(&ensemble.url(), &prefix).await;
    // Asked for twice the ensemble's maximum: the session of that TTL is granted the maximum, and every grant in it
    // runs with it (its lease is five eighths of it, the local validity after each keep-alive: see `session.rs`),
    // not with the client's default session (`crate::TIMEOUT`) and not with the timeout asked.
    let guard = a.mutex("long").ttl(MAX_SESSION * 2).lock().await.unwrap();
    assert_eq!(guard.ttl(), MAX_SESSION * 5 / 8);
    // A lock of the default TTL is still in the default session.
    let default = a.mutex("default").lock().await.unwrap();
    assert_eq!(default.ttl(), crate::VALIDITY);
    guard.release().await.unwrap();
    default.release().await.unwrap();
}
