//! `etcdctl lock PREFIX/NAME` (Go's `concurrency.Mutex`, as a real child process) and a leasehold mutex named NAME
//! under the prefix PREFIX exclude each other.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use leasehold_tests::{ChildGuard, EtcdCluster, TempDir};

use crate::{client, fresh_prefix, waiters, EVENT};

pub async fn etcdctl_lock_and_a_leasehold_mutex_exclude_each_other(cluster: &mut EtcdCluster) {
    let prefix = fresh_prefix();
    let a = client(&cluster.url(), &prefix).await;
    let held = a.mutex("shared").lock().await.unwrap();
    let endpoints = cluster.endpoints().join(",");
    // etcdctl runs its command without our stdin: the command ends when the file `done` appears.
    let dir = TempDir::new("etcdctl-lock");
    let done = dir.path().join("done");
    let command = format!(
        "echo held; while [ ! -e '{}' ]; do sleep 0.02; done",
        done.display()
    );
    let mut child = ChildGuard::new(
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoints}"))
            .args([
                "lock",
                &format!("{prefix}/shared"),
                "--",
                "sh",
                "-c",
                &command,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    // etcdctl's key is queued behind leasehold's grant, and inspect counts it as a waiter.
    waiters(&a, "shared", 1).await;
    assert!(
        lines.try_recv().is_err(),
        "etcdctl was granted while leasehold held the lock"
    );
    held.release().await.unwrap();
    let granted = tokio::time::timeout(EVENT, lines.recv()).await.unwrap();
    assert_eq!(granted.as_deref(), Some("held"));
    // Now etcdctl holds it: leasehold is refused, and sees it as the holder.
    assert!(a.mutex("shared").try_lock().await.unwrap_err().is_busy());
    let info = a.inspect("shared").await.unwrap();
    assert!(info
        .holder
        .is_some_and(|h| h.token.starts_with(&format!("{prefix}/shared/"))));
    // Its command ends; then it unlocks, and leasehold is granted.
    std::fs::write(&done, b"").unwrap();
    let next = tokio::time::timeout(EVENT, a.mutex("shared").lock())
        .await
        .unwrap()
        .unwrap();
    next.release().await.unwrap();
    let status = tokio::task::block_in_place(|| child.wait_timeout(EVENT));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}
