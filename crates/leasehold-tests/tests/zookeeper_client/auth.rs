//! Digest credentials in the URL: a chroot whose node only its creator may write to.

use leasehold_tests::ZkEnsemble;

pub async fn credentials_in_the_url_authenticate(ensemble: &mut ZkEnsemble) {
    let chroot = format!("/{}-secure", crate::fresh_prefix());
    let hosts = ensemble.endpoints().join(",");
    // The operator makes the chroot, writable only by the digest user app:secret.
    let operator = zookeeper_client::Client::connector()
        .with_auth("digest", b"app:secret")
        .connect(&hosts)
        .await
        .unwrap();
    operator
        .create(
            &chroot,
            b"",
            &zookeeper_client::CreateMode::Persistent
                .with_acls(zookeeper_client::Acls::creator_all()),
        )
        .await
        .unwrap();
    let connect = |credentials: &str, prefix: &str| {
        let url = format!("zk://{credentials}{hosts}{chroot}");
        let prefix = prefix.to_owned();
        async move {
            leasehold::Client::builder(&url)
                .unwrap()
                .prefix(prefix)
                .session_ttl(crate::TIMEOUT)
                .connect()
                .await
                .unwrap()
        }
    };
    let app = connect("app:secret@", "jobs").await;
    let guard = app.mutex("jobs").try_lock().await.unwrap();
    guard.release().await.unwrap();
    // Without the credentials, or with a wrong password, a client whose prefix is not there yet cannot make it under
    // the chroot: a refusal, which ends a wait at once rather than being waited out. (The nodes leasehold makes are
    // open to all, as kazoo's and Curator's are: the chroot's ACL is what guards.)
    for credentials in ["", "app:wrong@"] {
        let other = connect(credentials, "others").await;
        let started = tokio::time::Instant::now();
        let refused = other
            .mutex("jobs2")
            .lock_timeout(std::time::Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(refused.is_store(), "{credentials:?}: {refused:?}");
        // The cause, down the error's sources: ZooKeeper's NoAuth.
        let mut causes = Vec::new();
        let mut source = std::error::Error::source(&refused);
        while let Some(cause) = source {
            causes.push(cause.to_string());
            source = cause.source();
        }
        assert!(
            causes.iter().any(|c| c.contains("not authorized")),
            "{credentials:?}: {causes:?}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }
}
