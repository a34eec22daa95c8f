//! `etcdctl lock NAME` (Go's `concurrency.Mutex`, as a real child process) and a leasehold mutex on the same path
//! exclude each other, both ways.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use leasehold::__etcd::Kind;
use leasehold_tests::{ChildGuard, EtcdServer, TempDir};

use crate::{raw, session, wait_keys, within, EVENT, QUIET};

/// `etcdctl lock PATH -- sh -c 'echo held; sleep SECS; touch DONE'`, its stdout lines on a channel.
fn etcdctl_lock(
    etcd: &EtcdServer,
    path: &str,
    secs: &str,
    done: &Path,
) -> (ChildGuard, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let command = format!("echo held; sleep {secs}; touch '{}'", done.display());
    etcdctl(etcd, &["lock", path, "--", "sh", "-c", &command])
}

/// `etcdctl ARGS…` against `etcd` as a child process, its stdout lines on a channel.
fn etcdctl(
    etcd: &EtcdServer,
    args: &[&str],
) -> (ChildGuard, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let mut child = ChildGuard::new(
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", etcd.endpoint()))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    (child, rx)
}

pub async fn etcdctl_lock_excludes_leasehold(etcd: &mut EtcdServer) {
    let path = "interop/etcdctl-first";
    let dir = TempDir::new("etcdctl-lock");
    let done = dir.path().join("done");
    let (_child, mut lines) = etcdctl_lock(etcd, path, "2", &done);
    assert_eq!(
        within("etcdctl's grant", lines.recv()).await.unwrap(),
        "held"
    );
    let s = session(etcd, 10).await;
    let grant = within("leasehold's grant", s.acquire(path, Kind::Exclusive))
        .await
        .unwrap();
    // etcdctl unlocks only after its command exited, and the command's last act is the touch.
    assert!(
        done.exists(),
        "leasehold was granted while `etcdctl lock` still ran its command"
    );
    s.release(grant).await.unwrap();
}

pub async fn leasehold_excludes_etcdctl_lock(etcd: &mut EtcdServer) {
    let path = "interop/leasehold-first";
    let s = session(etcd, 10).await;
    let grant = s.acquire(path, Kind::Exclusive).await.unwrap();
    let dir = TempDir::new("etcdctl-lock");
    let (mut child, mut lines) = etcdctl_lock(etcd, path, "0", &dir.path().join("done"));
    let mut look = raw(etcd).await;
    wait_keys(&mut look, path, 2).await;
    assert!(
        tokio::time::timeout(QUIET, lines.recv()).await.is_err(),
        "etcdctl was granted while leasehold held the lock"
    );
    let released = Instant::now();
    s.release(grant).await.unwrap();
    assert_eq!(
        within("etcdctl's grant", lines.recv()).await.unwrap(),
        "held"
    );
    println!(
        "etcd measured: etcdctl granted {:?} after leasehold's release",
        released.elapsed()
    );
    let status = tokio::task::block_in_place(|| child.wait_timeout(EVENT));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}

/// `etcdctl elect leasehold/NAME` and a leasehold election called NAME lead in turn: each waits for the other's
/// leader; leasehold's `leader()` sees etcdctl's, its proposal as the value, and `etcdctl elect -l` prints
/// leasehold's leader's hold text, which ends in its value.
pub async fn etcdctl_elect_and_leasehold_elections_lead_in_turn(etcd: &mut EtcdServer) {
    let locks = leasehold::Client::connect(&etcd.url()).await.unwrap();
    let election = locks.election("interop-elect");
    let (mut campaigner, mut lines) = etcdctl(
        etcd,
        &["elect", "leasehold/interop-elect", "etcdctl-proposal"],
    );
    // Elected: it prints its key, then its proposal.
    let key = within("etcdctl's election", lines.recv()).await.unwrap();
    assert!(key.starts_with("leasehold/interop-elect/"), "{key}");
    assert_eq!(
        within("its proposal", lines.recv()).await.unwrap(),
        "etcdctl-proposal"
    );
    let leader = election.leader().await.unwrap().expect("etcdctl's leader");
    assert_eq!(leader.value.as_deref(), Some("etcdctl-proposal"));
    assert!(election.try_campaign("ours").await.unwrap_err().is_busy());

    let mut ours = tokio::spawn({
        let election = election.clone();
        async move { election.campaign("ours").await }
    });
    crate::still_waiting("leasehold's campaign", &mut ours).await;
    // SIGINT: etcdctl resigns and exits.
    campaigner.signal(nix::sys::signal::Signal::SIGINT).unwrap();
    let term = within("leasehold's term", ours).await.unwrap().unwrap();
    let status = tokio::task::block_in_place(|| campaigner.wait_timeout(EVENT));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");

    let (_observer, mut seen) = etcdctl(etcd, &["elect", "-l", "leasehold/interop-elect"]);
    let key = within("etcdctl's observation", seen.recv()).await.unwrap();
    assert!(key.starts_with("leasehold/interop-elect/"), "{key}");
    let value = within("the value it saw", seen.recv()).await.unwrap();
    assert!(
        value.starts_with("dl1:") && value.ends_with(&format!("\u{1f}ours\u{1f}{}", term.term())),
        "{value:?}"
    );
    term.resign().await.unwrap();
}
