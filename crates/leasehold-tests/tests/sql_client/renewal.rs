//! The session's renewal: it never moves the session's expiry back, whatever order renewals land in, and it never
//! brings back a session that has expired on the server's clock.

use std::time::Duration;

use leasehold_tests::TcpProxy;

use crate::admin::{on_table, Admin};
use crate::{client_with, Db, EVENT};

/// A session TTL whose per-statement deadline (a quarter of it, at most 2 s, as PostgreSQL's `lock_timeout`) leaves
/// the test time to act while a renewal of the library's waits for the test's lock.
const LONG: Duration = Duration::from_secs(8);

/// Locks `prefix`'s session table on `operator`'s connection and waits until a renewal waits for it: the start of
/// the renewal statement, as the server shows it.
async fn a_renewal_waits(
    db: &Db,
    prefix: &str,
    operator: &mut Admin,
    watcher: &mut Admin,
) -> String {
    let renewal = on_table(db, "UPDATE", prefix, "session");
    operator.lock_table(prefix, "session").await;
    watcher
        .until_running(
            &renewal,
            true,
            |n| n >= 1,
            "a renewal waits for the table lock",
        )
        .await;
    renewal
}

/// `d` in microseconds.
fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap()
}

pub async fn a_renewal_applied_late_never_moves_the_expiry_back(db: &mut Db) {
    let prefix = db.fresh_prefix();
    let proxy = TcpProxy::start(db.addr()).await;
    let a = client_with(&db.url_at(proxy.addr()), &prefix, LONG).await;
    let b = client_with(&db.url(), &prefix, LONG).await;
    let held = a.mutex("late").lock().await.unwrap();
    let lease = held.lease();
    let id = held.sql_commit_check().unwrap().session;
    let (mut operator, mut watcher) = (Admin::connect(db).await, Admin::connect(db).await);
    // An operator's lock on the session table (a migration's `ALTER TABLE`, a backup's): the next renewal waits for
    // it, and keeps the time it started at.
    let renewal = a_renewal_waits(db, &prefix, &mut operator, &mut watcher).await;
    // A later renewal lands first: written on the operator's connection (which may, under its lock), as the library's
    // next renewal, started after the one waiting, would write it.
    operator.set_expiry(&prefix, &id, micros(LONG)).await;
    let later = operator.expiry(&prefix, &id).await.unwrap();
    operator.unlock_table().await;
    // The renewal that waited lands now, with its older start.
    watcher
        .until_running(&renewal, false, |n| n == 0, "the waiting renewal landed")
        .await;
    let after = watcher.expiry(&prefix, &id).await.unwrap();
    assert!(
        after >= later,
        "a renewal that landed late moved the session's expiry back by {} µs",
        later - after
    );
    assert!(lease.is_held(), "{:?}", lease.loss());
    // Cut off, the holder renews no more: its loss fires before the server lets another client in.
    let waiting = tokio::spawn(async move { b.mutex("late").lock_timeout(EVENT).await });
    proxy.blackhole();
    let next = waiting.await.unwrap().unwrap();
    assert!(
        !lease.is_held(),
        "another client was granted while the holder still held"
    );
    next.release().await.unwrap();
}

pub async fn a_session_expired_on_the_server_is_not_renewed(db: &mut Db) {
    let prefix = db.fresh_prefix();
    let a = client_with(&db.url(), &prefix, LONG).await;
    let held = a.mutex("expired").lock().await.unwrap();
    let lease = held.lease();
    let id = held.sql_commit_check().unwrap().session;
    let mut admin = Admin::connect(db).await;
    // The session has expired on the server's clock (as after a pause of its client longer than the TTL), and its
    // client does not know: its next renewal must not bring it back.
    admin.set_expiry(&prefix, &id, -1_000_000).await;
    let believed = lease.valid_until();
    let reason = tokio::time::timeout(EVENT, lease.lost())
        .await
        .expect("the lease ended");
    assert!(
        tokio::time::Instant::now() < believed,
        "the lease ended at its local deadline, not at the renewal that found the session expired"
    );
    // The store ended the session: its entries may be deleted by anyone, as the contract's `Gone` says.
    assert_eq!(reason, leasehold::LossReason::Gone);
    let alive = match db {
        Db::Postgres(_) => format!(
            "SELECT count(*) FROM \"{prefix}_session\" WHERE id = '{id}' AND expires_at > clock_timestamp()"
        ),
        Db::MySql(_) => format!(
            "SELECT count(*) FROM `{prefix}_session` WHERE id = '{id}' AND expires_at > UTC_TIMESTAMP(6)"
        ),
    };
    assert_eq!(admin.number(&alive).await, 0, "the session came back");
    drop(held);
}

pub async fn renewals_landing_out_of_order_let_nobody_in_before_the_loss(db: &mut Db) {
    let prefix = db.fresh_prefix();
    let proxy = TcpProxy::start(db.addr()).await;
    // The only client under the prefix for now: every renewal of its session table is the holder's.
    let a = crate::client(&db.url_at(proxy.addr()), &prefix).await;
    let held = a.mutex("order").lock().await.unwrap();
    let lease = held.lease();
    let (mut operator, mut watcher) = (Admin::connect(db).await, Admin::connect(db).await);
    // A renewal waits for an operator's lock on the session table; what runs it on the server (a MariaDB thread, a
    // PostgreSQL backend) is then stopped (as a busy server's scheduler may stall it) while the lock is given back,
    // so that the next renewal, started later, lands and is answered first.
    let renewal = a_renewal_waits(db, &prefix, &mut operator, &mut watcher).await;
    // The oldest, if more than one waits by now.
    let stalled = match db {
        Db::Postgres(_) => {
            let pid = watcher
                .number(&format!(
                    "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND state = 'active' \
                     AND strpos(query, $${renewal}$$) > 0 ORDER BY query_start LIMIT 1"
                ))
                .await;
            Stalled::process(i32::try_from(pid).unwrap())
        }
        Db::MySql(_) => {
            let thread = watcher
                .number(&format!(
                    "SELECT TID FROM information_schema.PROCESSLIST WHERE LOCATE('{renewal}', INFO) > 0 \
                     AND ID <> CONNECTION_ID() ORDER BY TIME_MS DESC LIMIT 1"
                ))
                .await;
            Stalled::thread(i32::try_from(thread).unwrap()).await
        }
    };
    let before = lease.valid_until();
    operator.unlock_table().await;
    crate::eventually("a later renewal was answered", || async {
        assert!(lease.is_held(), "{:?}", lease.loss());
        lease.valid_until() > before
    })
    .await;
    // The holder is cut off (it renews no more), and the stalled renewal goes on with its earlier start: it lands on
    // MariaDB; on PostgreSQL its `statement_timeout` (a quarter of the TTL) has passed, and it is cancelled.
    proxy.blackhole();
    drop(stalled);
    watcher
        .until_running(&renewal, false, |n| n == 0, "the stalled renewal is over")
        .await;
    let b = crate::client(&db.url(), &prefix).await;
    let next = b.mutex("order").lock_timeout(EVENT).await.unwrap();
    assert!(
        !lease.is_held(),
        "another client was granted {:?} before the holder's loss",
        lease.valid_until() - tokio::time::Instant::now()
    );
    next.release().await.unwrap();
}

/// What runs a statement on the server, stopped until dropped: one MariaDB thread (stopped with `ptrace`: `SIGSTOP`
/// would stop every thread), or a PostgreSQL backend process (`SIGSTOP`).
enum Stalled {
    Thread(std::sync::mpsc::Sender<()>),
    Process(nix::unistd::Pid),
}

impl Stalled {
    /// Stops process `pid`.
    fn process(pid: i32) -> Stalled {
        let pid = nix::unistd::Pid::from_raw(pid);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
        Stalled::Process(pid)
    }

    /// Stops thread `tid` (of a process the test may trace), and returns once it is stopped.
    async fn thread(tid: i32) -> Stalled {
        use nix::sys::ptrace;
        use nix::sys::wait::{waitpid, WaitPidFlag};
        use nix::unistd::Pid;
        let (stopped, is_stopped) = tokio::sync::oneshot::channel();
        let (resume, on_resume) = std::sync::mpsc::channel::<()>();
        // The tracer is a thread, not a process: the same one must stop, wait for and release the tracee.
        std::thread::spawn(move || {
            let tid = Pid::from_raw(tid);
            let traced = ptrace::seize(tid, ptrace::Options::empty())
                .and_then(|()| ptrace::interrupt(tid))
                .and_then(|()| waitpid(tid, Some(WaitPidFlag::__WALL)).map(drop));
            let ok = traced.is_ok();
            let _ = stopped.send(traced.map_err(|e| format!("ptrace of thread {tid}: {e}")));
            if ok {
                let _ = on_resume.recv();
                ptrace::detach(tid, None).unwrap();
            }
        });
        is_stopped.await.unwrap().unwrap();
        Stalled::Thread(resume)
    }
}

impl Drop for Stalled {
    fn drop(&mut self) {
        match self {
            Stalled::Thread(resume) => {
                let _ = resume.send(());
            }
            Stalled::Process(pid) => {
                let _ = nix::sys::signal::kill(*pid, nix::sys::signal::Signal::SIGCONT);
            }
        }
    }
}
