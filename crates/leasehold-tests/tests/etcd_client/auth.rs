//! An etcd with authentication on: credentials in the URL, the password never shown, a wrong one refused.

use std::process::Command;

use leasehold::Client;
use leasehold_tests::{EtcdCluster, EtcdServer};

use crate::{fresh_prefix, renewed_after, TTL};

/// Runs `etcdctl ARGS` against `etcd` as root (once auth is on), and asserts it succeeded.
fn etcdctl(etcd: &EtcdServer, root: bool, args: &[&str]) {
    let mut command = Command::new("etcdctl");
    command
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", etcd.endpoint()));
    if root {
        command.arg("--user=root:r00t");
    }
    let output = command.args(args).output().unwrap();
    assert!(
        output.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Adds user `root` (password `r00t`) and user `app` (password `p@ss:w`, with characters a URL must escape), who
/// may read and write under `prefix/`, and turns authentication on.
fn enable_auth(etcd: &EtcdServer, prefix: &str) {
    etcdctl(
        etcd,
        false,
        &["user", "add", "root:r00t", "--interactive=false"],
    );
    etcdctl(etcd, false, &["role", "add", "locker"]);
    etcdctl(
        etcd,
        false,
        &[
            "role",
            "grant-permission",
            "locker",
            "--prefix=true",
            "readwrite",
            &format!("{prefix}/"),
        ],
    );
    // A password with characters a URL must escape: '@' and ':'.
    etcdctl(
        etcd,
        false,
        &["user", "add", "app:p@ss:w", "--interactive=false"],
    );
    etcdctl(etcd, false, &["user", "grant-role", "app", "locker"]);
    etcdctl(etcd, false, &["auth", "enable"]);
}

pub async fn credentials_in_the_url_authenticate(_cluster: &mut EtcdCluster) {
    let etcd = tokio::task::block_in_place(EtcdServer::start);
    let prefix = fresh_prefix();
    tokio::task::block_in_place(|| enable_auth(&etcd, &prefix));
    let endpoint = etcd.endpoint();
    let connect = |credentials: &str| {
        let url = format!("etcd://{credentials}{endpoint}");
        let prefix = prefix.clone();
        async move {
            Client::builder(&url)
                .unwrap()
                .prefix(prefix)
                .session_ttl(TTL)
                .connect()
                .await
        }
    };
    let locks = connect("app:p%40ss%3Aw@").await.unwrap();
    let guard = locks.mutex("vault").lock().await.unwrap();
    assert!(locks.mutex("vault").try_lock().await.unwrap_err().is_busy());
    guard.release().await.unwrap();
    // A refusal ends even a wait at once: it does not pass by itself, unlike a member going away.
    let revoked = format!("{prefix}/");
    tokio::task::block_in_place(|| {
        etcdctl(
            &etcd,
            true,
            &[
                "role",
                "revoke-permission",
                "locker",
                "--prefix=true",
                &revoked,
            ],
        );
    });
    let refused = tokio::time::timeout(crate::EVENT, locks.mutex("vault").lock())
        .await
        .expect("a refused wait ends at once")
        .unwrap_err();
    assert!(refused.is_store(), "{refused:?}");

    // A wrong password, or none, is refused when the client connects (etcd itself grants leases to anyone: the
    // client checks that it may read its prefix).
    for credentials in ["app:wrong@", ""] {
        let refused = connect(credentials).await.unwrap_err();
        assert!(refused.is_store(), "{refused:?}");
        let shown = format!("{refused} {refused:?}");
        assert!(!shown.contains("wrong"), "the password is shown: {shown}");
        let chain = format!("{:?}", std::error::Error::source(&refused));
        assert!(
            [
                "ermission denied",
                "user name is empty",
                "authentication failed"
            ]
            .iter()
            .any(|refusal| chain.contains(refusal)),
            "{chain}"
        );
    }
    tokio::task::block_in_place(|| etcdctl(&etcd, true, &["auth", "disable"]));
}

/// etcd forgets every token it gave when authentication is turned off and on again (as when a member restarts, or
/// a token's TTL passes): the client authenticates again at the first refusal, and its session, and a hold under
/// it, carry on.
pub async fn a_client_authenticates_again_when_its_token_is_forgotten(_cluster: &mut EtcdCluster) {
    let etcd = tokio::task::block_in_place(EtcdServer::start);
    let prefix = fresh_prefix();
    tokio::task::block_in_place(|| enable_auth(&etcd, &prefix));
    let url = format!("etcd://app:p%40ss%3Aw@{}", etcd.endpoint());
    let locks = crate::client(&url, &prefix).await;
    let held = locks.mutex("vault").lock().await.unwrap();
    tokio::task::block_in_place(|| {
        etcdctl(&etcd, true, &["auth", "disable"]);
        etcdctl(&etcd, false, &["auth", "enable"]);
    });
    let forgotten_at = tokio::time::Instant::now();
    renewed_after(&held.lease(), forgotten_at).await;
    let other = tokio::time::timeout(crate::EVENT, locks.mutex("safe").lock())
        .await
        .expect("a lock after the tokens were forgotten, within the bound")
        .unwrap();
    other.release().await.unwrap();
    held.release().await.unwrap();
    tokio::task::block_in_place(|| etcdctl(&etcd, true, &["auth", "disable"]));
}
