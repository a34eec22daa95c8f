//! Ownership checks and the loss signal under the faults they exist for.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use leasehold::__etcd::{EngineError, EtcdError, Kind, Released, Session, SessionOptions};
use leasehold_tests::{monotonic_ns, ChildGuard, EtcdServer};
use nix::sys::signal::Signal;

use crate::{keys_under, raw, session, wait_keys, within, EVENT};

pub async fn a_stale_release_does_not_delete_the_successor(etcd: &mut EtcdServer) {
    let path = "stale/release";
    let mut admin = raw(etcd).await;
    let (a, b) = (session(etcd, 10).await, session(etcd, 10).await);
    let old = a.acquire(path, Kind::Exclusive).await.unwrap();
    // The server ends a's lease (as an expiry would) while a still has its grant in hand.
    admin.lease_revoke(a.lease_id()).await.unwrap();
    let new = within("the successor's grant", b.acquire(path, Kind::Exclusive))
        .await
        .unwrap();
    assert_eq!(a.release(old).await.unwrap(), Released::AlreadyGone);
    assert!(
        b.is_owner(&new).await.unwrap(),
        "the successor's key survives"
    );
    assert_eq!(keys_under(&mut admin, path).await, 1);
    assert_eq!(b.release(new).await.unwrap(), Released::Released);
}

pub async fn the_final_check_catches_a_lease_revoked_while_waiting(etcd: &mut EtcdServer) {
    let path = "final/check";
    let mut admin = raw(etcd).await;
    let holder = session(etcd, 10).await;
    let held = holder.acquire(path, Kind::Exclusive).await.unwrap();
    // A 30 s session sends its next keep-alive after 10 s: only the check after the wait can notice.
    let waiter = Arc::new(session(etcd, 30).await);
    let w = Arc::clone(&waiter);
    let mut waiting = tokio::spawn(async move { w.acquire(path, Kind::Exclusive).await });
    wait_keys(&mut admin, path, 2).await;
    // Its key exists before it watches the holder's: revoked in between, the check before the watch would catch it,
    // and this test is about the check after a wait.
    within("the waiter's watch", async {
        while etcd.watchers() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await; // a server gauge: nothing announces it
        }
    })
    .await;
    admin.lease_revoke(waiter.lease_id()).await.unwrap();
    // The waiter's watch follows its own key too: the delete ends the wait at once (before issue 36, only the
    // holder's release did), and the check after it finds the key gone, the holder still holding.
    let outcome = within("the waiter's answer", &mut waiting).await.unwrap();
    holder.release(held).await.unwrap();
    assert!(
        matches!(
            outcome,
            Err(EtcdError::Engine(EngineError::LostWhileWaiting { .. }))
        ),
        "{outcome:?}"
    );
    assert_eq!(waiter.loss(), None, "the keeper had not noticed yet");
}

pub async fn a_dropped_acquire_leaves_no_key_behind(etcd: &mut EtcdServer) {
    let path = "cancel/drop";
    let mut look = raw(etcd).await;
    let (a, b) = (session(etcd, 10).await, Arc::new(session(etcd, 10).await));
    let held = a.acquire(path, Kind::Exclusive).await.unwrap();
    let w = Arc::clone(&b);
    let waiting = tokio::spawn(async move { w.acquire(path, Kind::Exclusive).await });
    wait_keys(&mut look, path, 2).await;
    waiting.abort();
    // The clean-up deletes the abandoned key in the background, with b's session still open.
    wait_keys(&mut look, path, 1).await;
    a.release(held).await.unwrap();
    let again = within(
        "a grant after the clean-up",
        b.acquire(path, Kind::Exclusive),
    )
    .await
    .unwrap();
    b.release(again).await.unwrap();
}

/// The holder, a process of its own with a 2 s session, is stopped past its TTL; etcd expires its lease and grants
/// another client. The holder's deadline (what its loss signal fires at) must come before that grant, and once
/// continued, its loss signal must fire at once.
pub async fn a_stopped_holder_loses_its_session_before_another_client_is_granted(
    etcd: &mut EtcdServer,
) {
    let path = "stopped/holder";
    let mut holder = ChildGuard::new(
        Command::new(env!("CARGO_BIN_EXE_etcd-holder"))
            .args([&etcd.url(), path, "2"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let stdout = holder.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    let first = within("the holder's grant", lines.recv()).await.unwrap();
    assert!(first.starts_with("granted "), "{first}");
    // Let it renew at least once, so the deadline comes from a keep-alive and not from the grant.
    let mut deadline = 0u64;
    let mut renewals = 0;
    while renewals < 2 {
        let line = within("the holder's deadline", lines.recv()).await.unwrap();
        deadline = line.strip_prefix("deadline ").unwrap().parse().unwrap();
        renewals += 1;
    }
    holder.signal(Signal::SIGSTOP).unwrap();
    // Lines it printed before the stop may still be in the pipe: the last deadline counts.
    while let Ok(line) = lines.try_recv() {
        if let Some(d) = line.strip_prefix("deadline ") {
            deadline = d.parse().unwrap();
        }
    }

    let other = session(etcd, 10).await;
    let grant = within(
        "the other client's grant",
        other.acquire(path, Kind::Exclusive),
    )
    .await
    .unwrap();
    let granted_at = monotonic_ns();
    assert!(
        deadline < granted_at,
        "the stopped holder's deadline {deadline} is not before the other grant at {granted_at}"
    );
    println!(
        "etcd measured: other client granted {:?} after the stopped holder's deadline",
        Duration::from_nanos(granted_at - deadline)
    );

    holder.signal(Signal::SIGCONT).unwrap();
    let lost = loop {
        let line = within("the holder's loss signal", lines.recv())
            .await
            .unwrap();
        if line.starts_with("lost ") {
            break line;
        }
    };
    let fired: u64 = lost.split(' ').nth(1).unwrap().parse().unwrap();
    assert!(fired >= deadline, "{lost} before the deadline {deadline}");
    let status = tokio::task::block_in_place(|| holder.wait_timeout(EVENT));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    other.release(grant).await.unwrap();
}

/// The session's deadline counts from each keep-alive's send time, not its answer's arrival: behind a proxy that
/// delays every chunk by `D` each way, a keep-alive answered at `R` renewed the lease on the server at `R − D` at the
/// latest, so the deadline it gives is at most `R − D + TTL` (the send time is `R − 2D`, less the drift allowance).
/// A deadline counted from the answer (`R + TTL − drift`) is later than that by `D − drift`.
pub async fn the_deadline_counts_from_the_keep_alives_send_time(etcd: &mut EtcdServer) {
    const D: Duration = Duration::from_millis(250);
    let proxy = leasehold_tests::TcpProxy::start(etcd.addr()).await;
    // 6 s: its per-call deadline (2 s) leaves room for a reconnect through the delayed path (a TCP and an HTTP/2
    // handshake, then the call: two delayed round trips). With 3 s (a 1 s deadline) one keep-alive that timed out on a
    // loaded machine left the session unable to reconnect at all.
    let options = SessionOptions::default().ttl(Duration::from_secs(6));
    let session = Session::connect(&format!("etcd://{}", proxy.addr()), options)
        .await
        .unwrap();
    let ttl = session.ttl();
    proxy.delay(D);
    let mut last = session.deadline();
    // The first change may come from a keep-alive sent before the delay: only the ones after it are judged.
    let mut changes = 0;
    let mut judged = 0;
    // A keep-alive round takes a third of the TTL plus the delayed round trip (2.5 s here), and one that times out on
    // a loaded machine reopens its stream first: three judged rounds get far more than the usual event bound.
    let rounds = async {
        while judged < 3 {
            tokio::time::sleep(Duration::from_millis(2)).await;
            let deadline = session.deadline();
            // Read after the deadline: the keep-alive that moved it was answered before now.
            let answered_by = tokio::time::Instant::now();
            if deadline == last {
                continue;
            }
            last = deadline;
            changes += 1;
            if changes == 1 {
                continue;
            }
            assert!(
                deadline <= answered_by - D + ttl,
                "a deadline {:?} past the answer, more than the TTL less one delay ({:?})",
                deadline - answered_by,
                ttl - D
            );
            judged += 1;
        }
    };
    tokio::time::timeout(Duration::from_secs(40), rounds)
        .await
        .expect("three delayed keep-alives within 40 s");
    assert!(session.loss().is_none(), "{:?}", session.loss());
}
