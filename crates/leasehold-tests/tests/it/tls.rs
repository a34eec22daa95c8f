//! `rediss://` against a real TLS `redis-server` with a throwaway CA: server verification, mutual TLS,
//! `#insecure`, and settings that cannot work.

use std::time::Duration;

use leasehold::{Error, InvalidArgument};
use leasehold_tests::TlsRedisServer;

use crate::within;

async fn tls_client(server: &TlsRedisServer) -> leasehold::Client {
    leasehold::Client::builder(&server.url())
        .unwrap()
        .tls_ca_pem(server.ca.ca.cert.clone())
        .connect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_and_wake_ups_work_over_tls_with_a_private_ca() {
    let server = TlsRedisServer::start(false);
    let first = tls_client(&server).await;
    let second = tls_client(&server).await;
    let held = first.mutex("tls").try_lock().await.unwrap();
    let waiter = tokio::spawn(async move { second.mutex("tls").lock().await });
    // The waiter has queued, and its wake-up subscriber (a second TLS connection) has subscribed, so the release
    // below wakes it through that subscriber.
    let mut plain = crate::redis_conn(&server.server).await;
    within(Duration::from_secs(5), "the waiter queueing", async {
        loop {
            let channels: Vec<String> = redis::cmd("PUBSUB")
                .arg("CHANNELS")
                .arg("leasehold:wake:*")
                .query_async(&mut plain)
                .await
                .unwrap();
            if !channels.is_empty() && first.inspect("tls").await.unwrap().waiting_clients > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let fence = held.fence();
    held.release().await.unwrap();
    let granted = within(Duration::from_secs(5), "the wake-up", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(granted.fence() > fence);
    granted.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_ca_fails_the_connect_with_an_error() {
    let server = TlsRedisServer::start(false);
    // The system trust store does not know the test CA.
    let err = leasehold::Client::connect(&server.url()).await.unwrap_err();
    assert!(err.is_redis(), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_skips_verification() {
    let server = TlsRedisServer::start(false);
    let url = format!("{}/#insecure", server.url());
    let locks = leasehold::Client::connect(&url).await.unwrap();
    let guard = locks.mutex("insecure").try_lock().await.unwrap();
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_needs_the_client_identity() {
    let server = TlsRedisServer::start(true);
    let without = leasehold::Client::builder(&server.url())
        .unwrap()
        .tls_ca_pem(server.ca.ca.cert.clone())
        .connect()
        .await
        .unwrap_err();
    assert!(without.is_redis(), "{without:?}");

    let locks = leasehold::Client::builder(&server.url())
        .unwrap()
        .tls_ca_pem(server.ca.ca.cert.clone())
        .tls_client_identity_pem(server.ca.client.cert.clone(), server.ca.client.key.clone())
        .connect()
        .await
        .unwrap();
    let guard = locks.mutex("mtls").try_lock().await.unwrap();
    assert!(locks.inspect("mtls").await.unwrap().holder.is_some());
    guard.release().await.unwrap();
}

fn bad_tls(err: Error) -> String {
    match err {
        Error::InvalidArgument(InvalidArgument::BadTls(why)) => why,
        other => panic!("expected BadTls, got {other:?}"),
    }
}

#[tokio::test]
async fn unusable_tls_settings_are_typed_errors() {
    let ca = leasehold_tests::TestCa::new();
    // Nothing listens there: the settings are refused before any connection is tried.
    let url = "rediss://127.0.0.1:1";

    let why = bad_tls(
        leasehold::Client::builder("redis://127.0.0.1:1")
            .unwrap()
            .tls_ca_pem(ca.ca.cert.clone())
            .connect()
            .await
            .unwrap_err(),
    );
    assert!(why.contains("rediss://"), "{why}");

    let why = bad_tls(
        leasehold::Client::builder(url)
            .unwrap()
            .tls_ca_pem("not a certificate")
            .connect()
            .await
            .unwrap_err(),
    );
    assert!(why.contains("no certificate"), "{why}");

    let why = bad_tls(
        leasehold::Client::builder(url)
            .unwrap()
            .tls_ca_pem(ca.ca.cert.clone())
            .tls_client_identity_pem(ca.client.cert.clone(), "-----BEGIN PRIVATE KEY-----\n!!\n")
            .connect()
            .await
            .unwrap_err(),
    );
    assert!(why.contains("private key"), "{why}");

    // A key where the certificate should be.
    let why = bad_tls(
        leasehold::Client::builder(url)
            .unwrap()
            .tls_client_identity_pem(ca.client.key.clone(), ca.client.key.clone())
            .connect()
            .await
            .unwrap_err(),
    );
    assert!(why.contains("client certificate"), "{why}");
}

/// A client certificate made the old way (`openssl x509 -req` without extensions gives X.509 v1), signed by `ca`.
fn v1_client_certificate(ca: &leasehold_tests::TestCa) -> (Vec<u8>, Vec<u8>) {
    let dir = ca.dir();
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl runs");
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    run(&[
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "v1.key", "-out", "v1.csr", "-subj",
        "/CN=v1",
    ]);
    let (ca_cert, ca_key) = (
        ca.ca.cert_path.to_str().unwrap(),
        ca.ca.key_path.to_str().unwrap(),
    );
    run(&[
        "x509",
        "-req",
        "-in",
        "v1.csr",
        "-CA",
        ca_cert,
        "-CAkey",
        ca_key,
        "-CAcreateserial",
        "-days",
        "1",
        "-out",
        "v1.crt",
    ]);
    (
        std::fs::read(dir.join("v1.crt")).unwrap(),
        std::fs::read(dir.join("v1.key")).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1_client_certificate_is_named_with_how_to_make_a_v3_one() {
    let server = TlsRedisServer::start(true);
    let (cert, key) = v1_client_certificate(&server.ca);
    let err = leasehold::Client::builder(&server.url())
        .unwrap()
        .tls_ca_pem(server.ca.ca.cert.clone())
        .tls_client_identity_pem(cert, key)
        .connect()
        .await
        .unwrap_err();
    let text = crate::connection::chain(&err);
    assert!(text.contains("X.509 v3"), "{text}");
    assert!(text.contains("openssl x509 -req"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_url_to_a_tls_port_suggests_rediss() {
    let server = TlsRedisServer::start(false);
    let url = format!("redis://127.0.0.1:{}", server.tls_port());
    let err = leasehold::Client::builder(&url)
        .unwrap()
        .connection_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap_err();
    let text = crate::connection::chain(&err);
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    assert!(text.contains("use rediss://"), "{text}");
}
