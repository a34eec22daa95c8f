//! A waiter in a process of its own, killed while it waits: its node goes with its session, and the waiter behind it
//! is granted.

use std::process::{Command, Stdio};

use leasehold_tests::{ChildGuard, ZkEnsemble};
use nix::sys::signal::Signal;

use crate::{client, fresh_prefix, granted, waiters};

pub async fn a_killed_waiter_leaves_the_queue_with_its_session(ensemble: &mut ZkEnsemble) {
    // The worker uses the default prefix: the lock's name is what keeps it apart from other tests'.
    let name = format!("{}:queue", fresh_prefix());
    let url = ensemble.url();
    let (a, b) = (
        client(&url, "leasehold").await,
        client(&url, "leasehold").await,
    );
    let held = a.mutex(&name).lock().await.unwrap();
    // The process waits behind the holder, on a session of 2 s (`leasehold-worker hold` makes TTL_MS the session's).
    let worker = ChildGuard::new(
        Command::new(env!("CARGO_BIN_EXE_leasehold-worker"))
            .args(["hold", &url, &name, "2000"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    waiters(&a, &name, 1).await;
    let behind = tokio::spawn({
        let (b, name) = (b.clone(), name.clone());
        async move { b.mutex(&name).lock().await }
    });
    waiters(&a, &name, 2).await;
    worker.signal(Signal::SIGKILL).unwrap();
    held.release().await.unwrap();
    // The killed waiter's node stays until the server expires its session; then the one behind it is granted.
    let next = granted(behind).await;
    assert!(next.is_held());
    let info = a.inspect(&name).await.unwrap();
    assert_eq!(info.waiting_clients, 0, "{info:?}");
    next.release().await.unwrap();
}
