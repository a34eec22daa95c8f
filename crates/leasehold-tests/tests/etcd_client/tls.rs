//! `etcds://`: a member that speaks TLS, trusted through a private CA, with and without client certificates.

use leasehold::Client;
use leasehold_tests::{EtcdCluster, EtcdServer, TestCa};

use crate::{fresh_prefix, TTL};

async fn connect(
    url: &str,
    ca: Option<&TestCa>,
    identity: bool,
) -> Result<Client, leasehold::Error> {
    let mut builder = Client::builder(url)?
        .prefix(fresh_prefix())
        .session_ttl(TTL);
    if let Some(ca) = ca {
        builder = builder.tls_ca_pem(ca.ca.cert.clone());
        if identity {
            builder =
                builder.tls_client_identity_pem(ca.client.cert.clone(), ca.client.key.clone());
        }
    }
    builder.connect().await
}

async fn lock_and_release(locks: &Client) {
    let guard = locks.mutex("sealed").lock().await.unwrap();
    assert!(guard.is_held());
    guard.release().await.unwrap();
}

pub async fn etcds_trusts_a_private_ca(_cluster: &mut EtcdCluster) {
    let ca = TestCa::new();
    let etcd = tokio::task::block_in_place(|| EtcdServer::start_tls(&ca, false));
    assert!(etcd.url().starts_with("etcds://"));
    lock_and_release(&connect(&etcd.url(), Some(&ca), false).await.unwrap()).await;
    // The system's trust store does not know the private CA.
    let untrusted = connect(&etcd.url(), None, false).await.unwrap_err();
    assert!(untrusted.is_store(), "{untrusted:?}");
    // Plain etcd:// to a TLS port is refused too, and CA material for a plain URL is a usage error.
    let plain = etcd.url().replacen("etcds://", "etcd://", 1);
    assert!(connect(&plain, None, false).await.unwrap_err().is_store());
    let misused = connect(&plain, Some(&ca), false).await.unwrap_err();
    assert!(
        matches!(misused, leasehold::Error::InvalidArgument(_)),
        "{misused:?}"
    );
}

pub async fn etcds_presents_a_client_certificate_when_asked(_cluster: &mut EtcdCluster) {
    let ca = TestCa::new();
    let etcd = tokio::task::block_in_place(|| EtcdServer::start_tls(&ca, true));
    lock_and_release(&connect(&etcd.url(), Some(&ca), true).await.unwrap()).await;
    let anonymous = connect(&etcd.url(), Some(&ca), false).await.unwrap_err();
    assert!(anonymous.is_store(), "{anonymous:?}");
}
