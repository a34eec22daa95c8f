//! kazoo (the Python ZooKeeper client) and leasehold on one lock: kazoo's `Lock` writes `<uuid>__lock__<seq>` under
//! the lock's path, leasehold's mutex `lh1-<grant>__lock__<seq>`, and each waits for the other's earlier node.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};

use leasehold_tests::{kazoo_python, ZkEnsemble};

use crate::{client, fresh_prefix, waiters, EVENT};

/// A kazoo lock (`Lock`, `ReadLock` or `WriteLock`: KIND lock, read, write) on `path` in a process of its own. Modes:
/// `hold` (acquire, print `held`, release after a line on stdin, print `released`), `try` (print `got` or `busy`,
/// release at once), `wait` (acquire, print `held`, release).
const KAZOO: &str = r#"
import sys
from kazoo.client import KazooClient
hosts, path, mode, kind = sys.argv[1:5]
zk = KazooClient(hosts=hosts, timeout=4.0)
zk.start()
lock = {"lock": zk.Lock, "read": zk.ReadLock, "write": zk.WriteLock}[kind](path, "kazoo")
if mode == "hold":
    lock.acquire()
    print("held", flush=True)
    sys.stdin.readline()
    lock.release()
    print("released", flush=True)
elif mode == "try":
    got = lock.acquire(blocking=False)
    print("got" if got else "busy", flush=True)
    if got:
        lock.release()
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
        let mut child = Command::new(kazoo_python())
            .args(["-c", KAZOO, hosts, path, mode, kind])
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

    fn tell(&mut self) {
        writeln!(self.child.stdin.as_mut().unwrap()).unwrap();
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
    holder.tell();
    assert_eq!(holder.line().await, "released");
    let guard = tokio::time::timeout(EVENT, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    // leasehold holds: kazoo is refused, waits behind leasehold's node, and is granted when leasehold releases.
    let mut tried = Kazoo::start(&hosts, &path, "try", "lock");
    assert_eq!(tried.line().await, "busy");
    let mut waiter = Kazoo::start(&hosts, &path, "wait", "lock");
    waiters(&a, "shared", 1).await;
    guard.release().await.unwrap();
    assert_eq!(waiter.line().await, "held");
}

pub async fn kazoo_read_write_locks_share_and_exclude_with_leaseholds(ensemble: &mut ZkEnsemble) {
    let prefix = fresh_prefix();
    let hosts = ensemble.endpoints().join(",");
    let a = client(&ensemble.url(), &prefix).await;
    let path = format!("/{prefix}/report");
    // A leasehold reader: kazoo's readers share with it, kazoo's writers wait for it.
    let reader = a.rw_lock("report").read().await.unwrap();
    assert_eq!(
        Kazoo::start(&hosts, &path, "try", "read").line().await,
        "got"
    );
    assert_eq!(
        Kazoo::start(&hosts, &path, "try", "write").line().await,
        "busy"
    );
    // A kazoo writer waiting behind it holds back a later leasehold reader, and is granted at the release.
    let mut writer = Kazoo::start(&hosts, &path, "hold", "write");
    waiters(&a, "report", 1).await;
    assert!(a.rw_lock("report").try_read().await.unwrap_err().is_busy());
    reader.release().await.unwrap();
    assert_eq!(writer.line().await, "held");
    assert!(a.rw_lock("report").try_write().await.unwrap_err().is_busy());
    writer.tell();
    assert_eq!(writer.line().await, "released");
    a.rw_lock("report")
        .try_write()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}
