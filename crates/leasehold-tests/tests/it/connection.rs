//! The command connection recovers from a silently dead flow, and one bad key fails only its own lease.

use std::time::Duration;

use futures_util::future::try_join_all;
use leasehold::LossReason;
use leasehold_tests::{RedisServer, TcpProxy};
use tokio::time::Instant;

use crate::{connect, redis_conn, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_recovers_from_a_silently_dead_connection() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.addr()).await;
    let locks = leasehold::Client::builder(&proxy.url())
        .unwrap()
        .response_timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    crate::lock_and_release(&locks, "flow").await;
    // A NAT or load balancer forgets the flow: nothing arrives, nothing is closed.
    proxy.blackhole();
    for _ in 0..3 {
        let err = locks.mutex("flow").try_lock().await.unwrap_err();
        assert!(err.is_redis(), "{err:?}");
    }
    // The path works again for new connections: the client must find that out by itself.
    proxy.restore();
    let recovered = within(Duration::from_secs(5), "recovery", async {
        loop {
            match locks.mutex("flow").try_lock().await {
                Ok(guard) => return guard,
                Err(e) if e.is_redis() => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(e) => panic!("unexpected {e:?}"),
            }
        }
    })
    .await;
    recovered.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_replaced_by_another_type_fails_only_its_own_lease() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let ttl = Duration::from_millis(1500);
    let every = Duration::from_millis(200);
    // Taken together, so the keeper renews them in one call.
    let guards = try_join_all((0..5).map(|i| {
        let mutex = locks
            .mutex(&format!("batch:{i}"))
            .ttl(ttl)
            .renew_every(every);
        async move { mutex.try_lock().await }
    }))
    .await
    .unwrap();
    // Someone replaces one lock key with a hash.
    let mut conn = redis_conn(&server).await;
    let _: () = redis::cmd("DEL")
        .arg("leasehold:{batch:0}")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg("leasehold:{batch:0}")
        .arg("field")
        .arg("value")
        .query_async(&mut conn)
        .await
        .unwrap();
    let reason = within(
        Duration::from_secs(2),
        "loss of the replaced lock",
        guards[0].lost(),
    )
    .await;
    assert_eq!(reason, LossReason::Taken);
    // Well past the leases' validity: the others were renewed all along.
    let until = Instant::now() + ttl * 2;
    while Instant::now() < until {
        tokio::time::sleep(every).await;
        for guard in &guards[1..] {
            assert!(guard.is_held(), "{} lost with the bad key", guard.name());
        }
    }
    let kind: String = redis::cmd("TYPE")
        .arg("leasehold:{batch:0}")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(kind, "hash", "the foreign key was left untouched");
    for guard in guards.into_iter().skip(1) {
        guard.release().await.unwrap();
    }
}

/// `err` and its sources joined by `: `, as a chain printer shows them.
pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = Vec::new();
    let mut next = Some(err);
    while let Some(cause) = next {
        parts.push(cause.to_string());
        next = cause.source();
    }
    parts.join(": ")
}

/// Every text in `err`'s chain appears once: no error repeats the one under it.
fn assert_no_repeats(err: &(dyn std::error::Error + 'static)) {
    let mut texts: Vec<String> = Vec::new();
    let mut next = Some(err);
    while let Some(cause) = next {
        let text = cause.to_string();
        for earlier in &texts {
            assert!(
                !earlier.contains(&text),
                "{text:?} repeats what {earlier:?} said: {}",
                chain(err)
            );
        }
        texts.push(text);
        next = cause.source();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_names_the_url_without_its_password_and_says_its_cause_once() {
    // A port nobody listens on: bind one, then close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://app:hunter2@127.0.0.1:{port}/2");
    let err = leasehold::Client::connect(&url).await.unwrap_err();
    assert!(err.is_redis(), "{err:?}");
    let text = chain(&err);
    assert!(
        text.starts_with(&format!(
            "cannot connect to Redis at redis://app:***@127.0.0.1:{port}/2: "
        )),
        "{text}"
    );
    assert!(!text.contains("hunter2"), "{text}");
    assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
    assert_no_repeats(&err);
    // The RedisError stays at hand; the chain goes on with the I/O error under it.
    assert!(err.redis_error().unwrap().is_connection_refusal());
    let cause = std::error::Error::source(&err).unwrap();
    assert!(
        cause.to_string().starts_with("Connection refused"),
        "{cause}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_not_redis_is_named_as_such() {
    // An HTTP server on the port: it answers whatever it is sent with an HTTP response, on every connection (the
    // client reconnects once), until the test is over.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let over = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let http = {
        let over = std::sync::Arc::clone(&over);
        std::thread::spawn(move || {
            use std::io::{Read as _, Write as _};
            for stream in listener.incoming() {
                if over.load(std::sync::atomic::Ordering::Acquire) {
                    return;
                }
                let Ok(mut stream) = stream else { continue };
                let mut request = [0u8; 1024];
                let _ = stream.read(&mut request);
                let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
            }
        })
    };
    let err = leasehold::Client::builder(&format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .connection_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap_err();
    let text = chain(&err);
    assert!(matches!(err, leasehold::Error::Connect { .. }), "{err:?}");
    assert!(text.contains("did not answer as Redis does"), "{text}");
    assert_no_repeats(&err);
    over.store(true, std::sync::atomic::Ordering::Release);
    // Wakes the listener's accept, which then sees that the test is over.
    let _ = std::net::TcpStream::connect(("127.0.0.1", port));
    http.join().unwrap();
}

#[tokio::test]
async fn server_errors_and_bad_arguments_say_their_cause_once() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let err = locks.mutex("").try_lock().await.unwrap_err();
    assert_eq!(chain(&err), "invalid argument: lock name is empty");
    assert_no_repeats(&err);
    // A server error reply: the lock's key holds a list.
    let mut raw = redis_conn(&server).await;
    redis::cmd("RPUSH")
        .arg("leasehold:{listed}")
        .arg("x")
        .query_async::<()>(&mut raw)
        .await
        .unwrap();
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query_async::<()>(&mut raw)
        .await
        .unwrap();
    let err = locks.mutex("oom").try_lock().await.unwrap_err();
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("0")
        .query_async::<()>(&mut raw)
        .await
        .unwrap();
    assert!(err.is_redis(), "{err:?}");
    let text = chain(&err);
    assert!(
        text.starts_with("Redis request failed: ") && text.contains("OOM"),
        "{text}"
    );
    assert_no_repeats(&err);
}
