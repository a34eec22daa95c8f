//! TLS: `sslmode=require` on PostgreSQL verifies the server against the builder's CA and carries every connection of
//! the client (its pool and its listener) over TLS; MySQL refuses TLS material, which it does not support yet.

use leasehold::{Client, Error};
use leasehold_tests::{PgServer, TestCa};

use crate::{Db, TTL};

pub async fn sslmode_require_verifies_and_encrypts_every_connection(db: &mut Db) {
    let ca = TestCa::new();
    let Db::Postgres(_) = db else {
        // MySQL: TLS material is refused before anything is sent.
        let refused = Client::builder(&db.url())
            .unwrap()
            .tls_ca_pem(ca.ca.cert.as_bytes())
            .connect()
            .await;
        assert!(
            matches!(&refused, Err(Error::InvalidArgument(_))),
            "{refused:?}"
        );
        return;
    };
    let server = tokio::task::spawn_blocking(move || {
        let server = PgServer::start_tls(&ca);
        (server, ca)
    })
    .await
    .unwrap();
    let (server, ca) = server;
    let url = format!("{}?sslmode=require", server.url());
    let locks = Client::builder(&url)
        .unwrap()
        .session_ttl(TTL)
        .tls_ca_pem(ca.ca.cert.as_bytes())
        .connect()
        .await
        .unwrap();
    let held = locks.mutex("secret").lock().await.unwrap();
    let waiting = tokio::spawn({
        let locks = locks.clone();
        async move { locks.mutex("secret").lock().await }
    });
    crate::waiters(&locks, "secret", 1).await;
    held.release().await.unwrap();
    waiting.await.unwrap().unwrap().release().await.unwrap();
    // Every backend of the client (pool and listener, named `leasehold`) is on TLS.
    let plain = server.psql(
        "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
         WHERE a.application_name = 'leasehold' AND NOT s.ssl",
    );
    let encrypted = server.psql(
        "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
         WHERE a.application_name = 'leasehold' AND s.ssl",
    );
    assert_eq!(plain, "0");
    assert!(encrypted.parse::<u32>().unwrap() >= 2, "{encrypted}");
    // Without the CA the server's certificate is not trusted: the connect fails.
    let untrusted = Client::builder(&url).unwrap().connect().await;
    assert!(untrusted.is_err(), "an untrusted server was accepted");
    // TLS material without sslmode=require is a mistake, said before connecting.
    let mistaken = Client::builder(&server.url())
        .unwrap()
        .tls_ca_pem(ca.ca.cert.as_bytes())
        .connect()
        .await;
    assert!(
        matches!(&mistaken, Err(Error::InvalidArgument(_))),
        "{mistaken:?}"
    );
    drop(locks);
    tokio::task::spawn_blocking(move || drop(server))
        .await
        .unwrap();
}
