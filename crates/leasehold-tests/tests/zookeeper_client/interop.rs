//! kazoo (the Python ZooKeeper client) and leasehold on one lock, a case per cell of the table in README ("On
//! ZooKeeper"): kazoo's `Lock` and `WriteLock` write `<uuid>__lock__<seq>` under the lock's path, its `ReadLock`
//! `<uuid>__rlock__<seq>`; every leasehold node ends in `__lock__` (`lh1-<grant>__lock__<seq>`, `lh1-s-…` for a
//! reader, `lh1-p<N>-…` for a permit), so each of kazoo's locks waits for every leasehold holder ahead of it.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};

use leasehold_tests::{kazoo_python, ZkEnsemble};

use crate::{client, fresh_prefix, granted, waiters};

/// A kazoo lock (`Lock`, `ReadLock`, `WriteLock` or a `Semaphore` of one lease: KIND lock, read, write, sem) on `path`
/// in a process of its own. Modes:
/// `hold` (acquire, print `held`, release after a line on stdin, print `released`), `try` (release at once if
/// granted, then print `got` or `busy`), `wait` (acquire, print `held`, release).
const KAZOO: &str = r#"
import sys
from kazoo.client import KazooClient
hosts, path, mode, kind = sys.argv[1:5]
zk = KazooClient(hosts=hosts, timeout=4.0)
zk.start()
if kind == "sem":
    lock = zk.Semaphore(path, "kazoo", max_leases=1)
else:
    lock = {"lock": zk.Lock, "read": zk.ReadLock, "write": zk.WriteLock}[kind](path, "kazoo")
if mode == "hold":
    lock.acquire()
    print("held", flush=True)
    sys.stdin.readline()
    lock.release()
    print("released", flush=True)
elif mode == "try":
    got = lock.acquire(blocking=False)
    if got:
        lock.release()
    print("got" if got else "busy", flush=True)
elif mode == "wait":
    lock.acquire()
    print("held", flush=True)
    lock.release()
zk.stop()
"#;

struct Kazoo {
    child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Kazoo {
    fn start(hosts: &str, path: &str, mode: &str, kind: &str) -> Kazoo {
        Kazoo::script(KAZOO, &[hosts, path, mode, kind])
    }

    /// `script` run by kazoo's Python with `args`.
    fn script(script: &str, args: &[&str]) -> Kazoo {
        let mut child = Command::new(kazoo_python())
            .args(["-c", script])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Kazoo { child, lines }
    }

    /// The next line kazoo prints.
    async fn line(&mut self) -> String {
        tokio::task::block_in_place(|| self.lines.next())
            .expect("kazoo ended early")
            .unwrap()
    }

    /// Waits until kazoo has ended: its lock released, its session closed.
    fn ended(mut self) {
        tokio::task::block_in_place(|| self.child.wait()).unwrap();
    }

    /// Tells a `hold` kazoo to release, and waits until it has.
    async fn release(&mut self) {
        writeln!(self.child.stdin.as_mut().unwrap()).unwrap();
        assert_eq!(self.line().await, "released");
    }
}

impl Drop for Kazoo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub async fn kazoo_and_leasehold_exclude_each_other(ensemble: &mut ZkEnsemble) {
    let prefix = fresh_prefix();
    let hosts = ensemble.endpoints().join(",");
    let a = client(&ensemble.url(), &prefix).await;
    // leasehold's lock `shared` under prefix P is the node /P/shared.
    let path = format!("/{prefix}/shared");

    // kazoo holds: leasehold is refused, waits behind kazoo's node, and is granted when kazoo releases.
    let mut holder = Kazoo::start(&hosts, &path, "hold", "lock");
    assert_eq!(holder.line().await, "held");
    assert!(a.mutex("shared").try_lock().await.unwrap_err().is_busy());
    let waiting = tokio::spawn({
        let a = a.clone();
        async move { a.mutex("shared").lock().await }
    });
    waiters(&a, "shared", 1).await;
    holder.release().await;
    let guard = granted(waiting).await;

    // leasehold holds: kazoo is refused, waits behind leasehold's node, and is granted when leasehold releases.
    let mut tried = Kazoo::start(&hosts, &path, "try", "lock");
    assert_eq!(tried.line().await, "busy");
    let mut waiter = Kazoo::start(&hosts, &path, "wait", "lock");
    waiters(&a, "shared", 1).await;
    guard.release().await.unwrap();
    assert_eq!(waiter.line().await, "held");
}

/// What a kazoo `try` of each of `kinds` on `path` answers.
async fn kazoo_tries(hosts: &str, path: &str, kinds: &[&str]) -> Vec<String> {
    let mut answers = Vec::new();
    for kind in kinds {
        answers.push(Kazoo::start(hosts, path, "try", kind).line().await);
    }
    answers
}

pub async fn kazoo_read_write_locks_share_and_exclude_with_leaseholds(ensemble: &mut ZkEnsemble) {
    let prefix = fresh_prefix();
    let hosts = ensemble.endpoints().join(",");
    let a = client(&ensemble.url(), &prefix).await;
    let path = format!("/{prefix}/report");
    // A kazoo reader: leasehold's readers share with it, its writers wait for it.
    let mut kazoo_reader = Kazoo::start(&hosts, &path, "hold", "read");
    assert_eq!(kazoo_reader.line().await, "held");
    let reader = a.rw_lock("report").try_read().await.unwrap();
    assert!(a.rw_lock("report").try_write().await.unwrap_err().is_busy());
    kazoo_reader.release().await;
    // A leasehold reader: every kazoo lock waits for it, a `ReadLock` too (it waits for every `__lock__` node ahead).
    assert_eq!(
        kazoo_tries(&hosts, &path, &["lock", "read", "write"]).await,
        ["busy", "busy", "busy"]
    );
    // A kazoo writer waiting behind it holds back a later leasehold reader, and is granted at the release.
    let mut writer = Kazoo::start(&hosts, &path, "hold", "write");
    waiters(&a, "report", 1).await;
    assert!(a.rw_lock("report").try_read().await.unwrap_err().is_busy());
    reader.release().await.unwrap();
    assert_eq!(writer.line().await, "held");
    assert!(a.rw_lock("report").try_write().await.unwrap_err().is_busy());
    writer.release().await;
    a.rw_lock("report")
        .try_write()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

pub async fn kazoo_locks_wait_for_leasehold_permits(ensemble: &mut ZkEnsemble) {
    let prefix = fresh_prefix();
    let hosts = ensemble.endpoints().join(",");
    let a = client(&ensemble.url(), &prefix).await;
    let path = format!("/{prefix}/slots");
    // A semaphore of one permit is a one-holder lock: every kazoo recipe waits for it (a kazoo `Semaphore` counts
    // every child of the path as a lease).
    let permit = a.semaphore("slots", 1).try_acquire().await.unwrap();
    assert_eq!(
        kazoo_tries(&hosts, &path, &["lock", "read", "write", "sem"]).await,
        ["busy", "busy", "busy", "busy"]
    );
    // A kazoo `Lock` waiting behind it is granted at the release.
    let mut waiter = Kazoo::start(&hosts, &path, "wait", "lock");
    waiters(&a, "slots", 1).await;
    permit.release().await.unwrap();
    assert_eq!(waiter.line().await, "held");
    waiter.ended();
    // A permit of several: kazoo's locks wait for it as well.
    let permit = a.semaphore("slots", 3).try_acquire().await.unwrap();
    assert_eq!(
        kazoo_tries(&hosts, &path, &["lock", "write"]).await,
        ["busy", "busy"]
    );
    permit.release().await.unwrap();
    // The other way: a permit waits for a kazoo `Lock` holder.
    let mut holder = Kazoo::start(&hosts, &path, "hold", "lock");
    assert_eq!(holder.line().await, "held");
    assert!(a
        .semaphore("slots", 1)
        .try_acquire()
        .await
        .unwrap_err()
        .is_busy());
    holder.release().await;
}

pub async fn a_kazoo_semaphore_is_not_seen_by_leasehold(ensemble: &mut ZkEnsemble) {
    // The limit the README states: a kazoo `Semaphore`'s lease is a plain child of the path, with no sequence, which
    // leasehold cannot tell from a nested lock's node; so leasehold grants beside it.
    let prefix = fresh_prefix();
    let hosts = ensemble.endpoints().join(",");
    let a = client(&ensemble.url(), &prefix).await;
    let path = format!("/{prefix}/leases");
    let mut holder = Kazoo::start(&hosts, &path, "hold", "sem");
    assert_eq!(holder.line().await, "held");
    a.mutex("leases")
        .try_lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    holder.release().await;
}

/// kazoo's `Election` on `path` (its identifier `kazoo-id`): `contenders` prints `repr(election.contenders())`; `run`
/// prints `leading` once it leads, resigns after a line on stdin and prints `resigned`.
const KAZOO_ELECTION: &str = r#"
import sys
from kazoo.client import KazooClient
hosts, path, mode = sys.argv[1:4]
zk = KazooClient(hosts=hosts, timeout=4.0)
zk.start()
election = zk.Election(path, "kazoo-id")
if mode == "contenders":
    print(repr(election.contenders()), flush=True)
elif mode == "run":
    def lead():
        print("leading", flush=True)
        sys.stdin.readline()
    election.run(lead)
    print("resigned", flush=True)
zk.stop()
"#;

/// kazoo's `Election` (its `Lock`, data = its identifier) and leasehold's elections on one path lead in turn; each sees
/// the other's leader and value.
pub async fn kazoo_elections_and_leasehold_elections_lead_in_turn(ensemble: &mut ZkEnsemble) {
    let prefix = fresh_prefix();
    let hosts = ensemble.endpoints().join(",");
    let a = client(&ensemble.url(), &prefix).await;
    let path = format!("/{prefix}/elected");
    let election = a.election("elected");
    let term = election.campaign("ours").await.unwrap();
    let seen = Kazoo::script(KAZOO_ELECTION, &[&hosts, &path, "contenders"])
        .line()
        .await;
    // The hold text ends in the value and the term's number, each after U+001F.
    assert!(
        seen.contains(&format!("\\x1fours\\x1f{}'", term.term())),
        "{seen}"
    );

    let mut kazoo = Kazoo::script(KAZOO_ELECTION, &[&hosts, &path, "run"]);
    waiters(&a, "elected", 1).await;
    term.resign().await.unwrap();
    assert_eq!(kazoo.line().await, "leading");
    let leader = election.leader().await.unwrap().expect("kazoo's leader");
    assert_eq!(leader.value.as_deref(), Some("kazoo-id"));
    assert!(election.try_campaign("ours").await.unwrap_err().is_busy());
    let ours = tokio::spawn({
        let election = election.clone();
        async move {
            let term = election.campaign("ours again").await?;
            Ok(term.into_guard())
        }
    });
    waiters(&a, "elected", 1).await;
    writeln!(kazoo.child.stdin.as_mut().unwrap()).unwrap();
    assert_eq!(kazoo.line().await, "resigned");
    granted(ours).await.release().await.unwrap();
}
