//! Holder descriptions and the list of held locks.

use leasehold::{Error, InvalidArgument};
use leasehold_tests::RedisServer;

use crate::{connect, redis_conn};

#[tokio::test]
async fn a_description_is_seen_by_inspect_and_goes_with_the_grant() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let mutex = locks.mutex("described").describe("worker 7 on web-1");
    let guard = mutex.try_lock().await.unwrap();
    let holder = mutex.inspect().await.unwrap().holder.unwrap();
    assert_eq!(holder.description.as_deref(), Some("worker 7 on web-1"));
    assert_eq!(holder.token, guard.token());
    assert!(holder.token.ends_with(" worker 7 on web-1"));
    // Renewal, extension and release compare the whole token: they work as for any grant.
    assert!(guard
        .extend(std::time::Duration::from_secs(60))
        .await
        .is_ok());
    guard.release().await.unwrap();
    assert!(mutex.inspect().await.unwrap().holder.is_none());

    let plain = locks.mutex("plain").try_lock().await.unwrap();
    let holder = locks.inspect("plain").await.unwrap().holder.unwrap();
    assert_eq!(holder.description, None);
    plain.release().await.unwrap();
}

#[tokio::test]
async fn bad_descriptions_are_typed_errors() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    for bad in ["two\nlines".to_owned(), "   ".to_owned(), "x".repeat(257)] {
        match locks.mutex("d").describe(bad.clone()).try_lock().await {
            Err(Error::InvalidArgument(InvalidArgument::BadDescription { .. })) => {}
            other => panic!("{bad:?}: expected BadDescription, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn held_locks_lists_only_held_leasehold_locks_matching_the_pattern() {
    let server = RedisServer::start();
    let locks = connect(&server).await;
    let mut held = Vec::new();
    for name in ["a:1", "a:2", "b:1", "x*y"] {
        held.push(
            locks
                .mutex(name)
                .describe(format!("holder of {name}"))
                .try_lock()
                .await
                .unwrap(),
        );
    }
    // A free lock with a fence on record and the memory of its release, and a key some other program wrote under
    // the prefix: neither is listed.
    crate::lock_and_release(&locks, "free").await;
    let _: () = redis::cmd("SET")
        .arg("leasehold:{foreign}")
        .arg("hello")
        .query_async(&mut redis_conn(&server).await)
        .await
        .unwrap();

    let names = |infos: Vec<leasehold::LockInfo>| -> Vec<String> {
        infos.into_iter().map(|i| i.name).collect()
    };
    assert_eq!(
        names(locks.held_locks("*").await.unwrap()),
        ["a:1", "a:2", "b:1", "x*y"]
    );
    assert_eq!(
        names(locks.held_locks("a:*").await.unwrap()),
        ["a:1", "a:2"]
    );
    assert_eq!(names(locks.held_locks("x\\*y").await.unwrap()), ["x*y"]);
    let listed = locks.held_locks("b:?").await.unwrap();
    assert_eq!(listed.len(), 1);
    let holder = listed[0].holder.as_ref().unwrap();
    assert_eq!(holder.description.as_deref(), Some("holder of b:1"));
    assert!(listed[0].last_fence.is_some());

    // Another prefix sees none of them.
    let other = leasehold::Client::builder(&server.url())
        .unwrap()
        .prefix("other")
        .connect()
        .await
        .unwrap();
    assert!(other.held_locks("*").await.unwrap().is_empty());
    for guard in held {
        guard.release().await.unwrap();
    }
    assert!(locks.held_locks("*").await.unwrap().is_empty());
}
