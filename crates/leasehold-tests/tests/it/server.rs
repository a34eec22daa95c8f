//! What a client checks about its server when it connects: eviction, and the ACL permissions it needs.

use std::time::Duration;

use leasehold::ServerWarning;
use leasehold_tests::RedisServer;
use tokio::time::Instant;

use crate::{connect, redis_conn, within};

/// The minimal ACL rule for a user of the default prefix, exactly as the README documents it.
const MINIMAL_ACL: &[&str] = &[
    "on",
    ">pw",
    "resetkeys",
    "~leasehold:*",
    "resetchannels",
    "&leasehold:wake:*",
    "-@all",
    "+ping",
    "+info",
    "+evalsha",
    "+script|load",
    "+subscribe",
    "+publish",
    "+time",
    "+get",
    "+set",
    "+incr",
    "+del",
    "+rename",
    "+pexpire",
    "+pttl",
    "+lpop",
    "+rpush",
    "+lrem",
    "+llen",
    "+hset",
    "+hget",
    "+hdel",
    "+hlen",
    "+hgetall",
    "+lrange",
    "+type",
    "+lindex",
    "+zadd",
    "+zscore",
    "+zrem",
    "+zcard",
    "+zrangebyscore",
    "+zremrangebyscore",
];

#[tokio::test]
async fn a_server_that_may_evict_keys_is_reported() {
    let evicting =
        RedisServer::start_with(&["--maxmemory", "10mb", "--maxmemory-policy", "allkeys-lru"]);
    let locks = connect(&evicting).await;
    match locks.server_warnings() {
        [ServerWarning::Eviction { policy, maxmemory }] => {
            assert_eq!(policy, "allkeys-lru");
            assert_eq!(*maxmemory, 10 * 1024 * 1024);
        }
        other => panic!("expected one eviction warning, got {other:?}"),
    }
    let safe =
        RedisServer::start_with(&["--maxmemory", "10mb", "--maxmemory-policy", "noeviction"]);
    assert!(connect(&safe).await.server_warnings().is_empty());
    let default = RedisServer::start();
    assert!(connect(&default).await.server_warnings().is_empty());
}

#[tokio::test]
async fn the_documented_minimal_acl_user_can_lock_wait_and_release() {
    let mut user = vec!["--user", "locker"];
    user.extend_from_slice(MINIMAL_ACL);
    let server = RedisServer::start_with(&user);
    let url = format!("redis://locker:pw@127.0.0.1:{}", server.port());
    let holder = leasehold::Client::connect(&url).await.unwrap();
    let waiter = leasehold::Client::connect(&url).await.unwrap();
    let held = holder
        .mutex("acl")
        .ttl(Duration::from_secs(60))
        .try_lock()
        .await
        .unwrap();
    let waiting = tokio::spawn(async move {
        let guard = waiter.mutex("acl").lock().await.unwrap();
        let at = Instant::now();
        guard.release().await.unwrap();
        at
    });
    // Watched as the default user (the rule has no PUBSUB): the waiter is queued, and subscribed to its own
    // wake-up channel, so SUBSCRIBE works under the rule.
    let mut admin = redis_conn(&server).await;
    let queue = &leasehold::lock_keys(leasehold::DEFAULT_PREFIX, "acl").unwrap()[2];
    within(Duration::from_secs(5), "queued and subscribed", async {
        loop {
            let ids: Vec<String> = redis::cmd("LRANGE")
                .arg(queue)
                .arg(0)
                .arg(-1)
                .query_async(&mut admin)
                .await
                .unwrap();
            if let Some(id) = ids.first() {
                let (_, subscribers): (String, u64) = redis::cmd("PUBSUB")
                    .arg("NUMSUB")
                    .arg(format!("leasehold:wake:{id}"))
                    .query_async(&mut admin)
                    .await
                    .unwrap();
                if subscribers == 1 {
                    break;
                }
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    let released = Instant::now();
    // The release script publishes the wake-up: an error here would be a PUBLISH the rule refuses.
    held.release().await.unwrap();
    let granted = within(Duration::from_secs(10), "grant", waiting)
        .await
        .unwrap();
    // Woken by the release over pub/sub, not by the 1 s heartbeat or the 60 s lease.
    assert!(
        granted.duration_since(released) < Duration::from_millis(500),
        "took {:?}",
        granted.duration_since(released)
    );
    // Renewal and extension work under the rule too.
    let guard = holder
        .mutex("acl")
        .ttl(Duration::from_millis(300))
        .try_lock()
        .await
        .unwrap();
    guard.extend(Duration::from_secs(5)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(guard.is_held());
    guard.release().await.unwrap();
    assert!(holder.inspect("acl").await.unwrap().holder.is_none());
    // The queued kinds too: a grant, a wait ended by a release, a renewal, status, a forced release.
    let sem = holder
        .semaphore("acl-pool", 1)
        .ttl(Duration::from_millis(300));
    let permit = sem.try_acquire().await.unwrap();
    let next = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(400)).await; // past one lease: the keeper renewed it
    assert!(permit.is_held());
    assert_eq!(holder.inspect("acl-pool").await.unwrap().holders.len(), 1);
    permit.release().await.unwrap();
    let permit = within(Duration::from_secs(5), "permit handed over", next)
        .await
        .unwrap();
    assert!(holder.force_release("acl-pool").await.unwrap().is_some());
    drop(permit);
    // An election: a counted term (INCR), a proclamation, an observer's read of the count.
    let election = holder.election("acl-leader");
    let mut term = election.campaign("a").await.unwrap();
    term.proclaim("b").await.unwrap();
    assert_eq!(election.terms().await.unwrap(), term.term());
    let leader = election.leader().await.unwrap().unwrap();
    assert_eq!(
        (leader.value.as_deref(), leader.term),
        (Some("b"), Some(term.term()))
    );
    term.resign().await.unwrap();
}

// Current-thread: the trace capture is per thread, and the subscriber task runs on this one.
#[tokio::test]
async fn a_user_who_may_not_subscribe_is_warned_once_and_still_granted_by_heartbeat() {
    let (captured, _default) = crate::capture_traces();
    let mut user = vec!["--user", "locker"];
    user.extend(MINIMAL_ACL.iter().filter(|&&rule| rule != "+subscribe"));
    let server = RedisServer::start_with(&user);
    let url = format!("redis://locker:pw@127.0.0.1:{}", server.port());
    // The connect check publishes on the channel, which the rule allows: it connects.
    let holder = leasehold::Client::connect(&url).await.unwrap();
    let waiter = leasehold::Client::connect(&url).await.unwrap();
    let held = holder
        .mutex("nosub")
        .ttl(Duration::from_secs(60))
        .try_lock()
        .await
        .unwrap();
    let waiting = tokio::spawn(async move { waiter.mutex("nosub").lock().await });
    let said = "refused the subscription to this client's wake-up channel";
    crate::traced(&captured, said).await;
    held.release().await.unwrap();
    // Granted at the waiter's next heartbeat, not at the 60 s lease's end.
    let granted = within(Duration::from_secs(10), "grant by heartbeat", waiting)
        .await
        .unwrap()
        .unwrap();
    granted.release().await.unwrap();
    assert_eq!(
        captured.text().matches(said).count(),
        1,
        "said once per client"
    );
}

#[tokio::test]
async fn a_user_without_channel_permission_is_refused_at_connect() {
    // Redis 7's default for new users: no channels at all.
    let server = RedisServer::start_with(&[
        "--user",
        "nochannels",
        "on",
        ">pw",
        "~*",
        "resetchannels",
        "+@all",
    ]);
    let url = format!("redis://nochannels:pw@127.0.0.1:{}", server.port());
    let err = leasehold::Client::connect(&url).await.unwrap_err();
    assert!(err.is_not_permitted(), "{err:?}");
    assert!(err.to_string().contains("&leasehold:wake:*"), "{err}");
}

#[tokio::test]
async fn a_user_without_the_publish_command_is_told_that_publish_is_missing() {
    let server = RedisServer::start_with(&[
        "--user",
        "nopublish",
        "on",
        ">pw",
        "~*",
        "&*",
        "+@all",
        "-publish",
    ]);
    let url = format!("redis://nopublish:pw@127.0.0.1:{}", server.port());
    let err = leasehold::Client::connect(&url).await.unwrap_err();
    assert!(err.is_not_permitted(), "{err:?}");
    assert!(err.to_string().contains("\"+publish\""), "{err}");
}

#[tokio::test]
async fn a_user_whose_key_pattern_misses_the_prefix_is_refused_at_connect() {
    let server = RedisServer::start_with(&[
        "--user",
        "otherkeys",
        "on",
        ">pw",
        "resetkeys",
        "~other:*",
        "&*",
        "+@all",
    ]);
    let url = format!("redis://otherkeys:pw@127.0.0.1:{}", server.port());
    let err = leasehold::Client::connect(&url).await.unwrap_err();
    assert!(err.is_not_permitted(), "{err:?}");
    assert!(err.to_string().contains("\"~leasehold:*\""), "{err}");
    // The same user is fine under a prefix its pattern covers.
    let locks = leasehold::Client::builder(&url)
        .unwrap()
        .prefix("other")
        .connect()
        .await
        .unwrap();
    crate::lock_and_release(&locks, "ok").await;
}

#[tokio::test]
async fn a_user_without_evalsha_is_told_that_evalsha_is_missing() {
    let server = RedisServer::start_with(&[
        "--user",
        "noscripts",
        "on",
        ">pw",
        "~*",
        "&*",
        "+@all",
        "-evalsha",
    ]);
    let url = format!("redis://noscripts:pw@127.0.0.1:{}", server.port());
    let err = leasehold::Client::connect(&url).await.unwrap_err();
    assert!(err.is_not_permitted(), "{err:?}");
    assert!(err.to_string().contains("\"+evalsha\""), "{err}");
}
