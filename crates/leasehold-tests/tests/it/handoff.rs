//! Direct hand-off: a release grants the lock to the oldest live waiting client in the same script, and the waiter
//! starts without another round trip, with a deadline no later than the server-side expiry.

use std::io::{BufRead, BufReader};
use std::time::Duration;

use leasehold::LossReason;
use leasehold_tests::RedisServer;
use nix::sys::signal::Signal;
use tokio::time::Instant;

use crate::family::wait_for_queue_len;
use crate::{connect, redis_conn, wait_for_busy_attempts, within, worker};

/// The lock `name` held for a minute by a client of its own, a plain connection, and a pattern subscriber (`PSUBSCRIBE
/// *`, as a monitoring tool has) that makes every `PUBLISH` count one receiver.
async fn held_with_a_bystander(
    server: &RedisServer,
    name: &str,
) -> (
    leasehold::MutexGuard,
    redis::aio::MultiplexedConnection,
    redis::aio::PubSub,
) {
    let holder = connect(server)
        .await
        .mutex(name)
        .ttl(Duration::from_secs(60))
        .try_lock()
        .await
        .unwrap();
    let mut bystander = server.client().get_async_pubsub().await.unwrap();
    bystander.psubscribe("*").await.unwrap();
    (holder, redis_conn(server).await, bystander)
}

async fn get(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(conn).await.unwrap()
}

#[tokio::test]
async fn a_handed_over_lease_ends_before_the_server_expires_it() {
    let server = RedisServer::start();
    let holder_client = connect(&server).await;
    let waiter_client = connect(&server).await;
    // Loads the release script, so that the release below is one call (not NOSCRIPT, then a retry).
    crate::lock_and_release(&holder_client, "warm-up").await;
    let holder = holder_client
        .mutex("baton")
        .ttl(Duration::from_secs(60))
        .try_lock()
        .await
        .unwrap();
    // A fixed 2 s lease: the claim is the whole lease, so nothing renews it and its deadline is the hand-off's.
    let waiter = tokio::spawn(async move {
        let guard = waiter_client
            .mutex("baton")
            .ttl(Duration::from_secs(2))
            .fixed_lease()
            .lock()
            .await
            .unwrap();
        (Instant::now(), guard)
    });
    // The first attempt, then the subscribed head's attempt: the client is queued with a fresh token.
    wait_for_busy_attempts(&server, 2).await;
    let scripts_before = server.command_calls("evalsha");

    let first = holder.fence();
    let released = Instant::now();
    holder.release().await.unwrap();
    let (granted, guard) = within(Duration::from_secs(5), "hand-off", waiter)
        .await
        .unwrap();
    assert!(
        granted.duration_since(released) < Duration::from_millis(500),
        "hand-off took {:?}",
        granted.duration_since(released)
    );
    // No round trip of the waiter's own: the one script call since is the release.
    assert_eq!(server.command_calls("evalsha") - scripts_before, 1);
    assert!(guard.fence() > first);
    // The fence was drawn in the hand-off's own step: the counter holds it.
    let info = holder_client.inspect("baton").await.unwrap();
    assert_eq!(info.last_fence, Some(guard.fence()));

    let mut conn = redis_conn(&server).await;
    let token = guard.token().to_owned();
    assert_eq!(
        get(&mut conn, "leasehold:{baton}").await.as_deref(),
        Some(token.as_str())
    );
    let reason = within(Duration::from_secs(5), "loss signal", guard.lost()).await;
    assert_eq!(reason, LossReason::Expired);
    // The loss is signalled while the server still has the grant: nobody else can hold the lock yet.
    let pttl: i64 = redis::cmd("PTTL")
        .arg("leasehold:{baton}")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        get(&mut conn, "leasehold:{baton}").await.as_deref(),
        Some(token.as_str())
    );
    assert!(
        pttl > 0,
        "the key had expired before the loss signal (pttl {pttl})"
    );
    let lasted = granted.elapsed();
    assert!(
        lasted > Duration::from_millis(1500) && lasted < Duration::from_millis(2100),
        "a 2 s claim lasted {lasted:?}"
    );
}

#[tokio::test]
async fn a_fixed_lease_handed_over_is_extended_once_to_its_whole_lease() {
    let server = RedisServer::start();
    let holder_client = connect(&server).await;
    let waiter_client = connect(&server).await;
    let holder = holder_client.mutex("once").try_lock().await.unwrap();
    let client = waiter_client.clone();
    let waiter = tokio::spawn(async move {
        client
            .mutex("once")
            .ttl(Duration::from_secs(8))
            .fixed_lease()
            .lock()
            .await
            .unwrap()
    });
    wait_for_busy_attempts(&server, 2).await;
    let first = holder.fence();
    holder.release().await.unwrap();
    let guard = within(Duration::from_secs(5), "hand-off", waiter)
        .await
        .unwrap();
    assert!(guard.fence() > first);
    let granted = Instant::now();
    // Handed over with a 2 s claim, then extended once, at once, to the 8 s it asked for; then no more renewals.
    let deadline = Instant::now() + Duration::from_secs(2);
    while guard.valid_until() < granted + Duration::from_secs(6) || waiter_client.kept_leases() != 0
    {
        assert!(
            Instant::now() < deadline,
            "the claim was not extended: {guard:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let pttl: i64 = redis::cmd("PTTL")
        .arg("leasehold:{once}")
        .query_async(&mut redis_conn(&server).await)
        .await
        .unwrap();
    assert!(pttl > 6_000 && pttl <= 8_000, "pttl {pttl}");
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_waiter_that_died_within_its_liveness_window_costs_at_most_its_claim() {
    let server = RedisServer::start();
    let patient = connect(&server).await;
    // A client that queued a moment ago and then froze: its entry is live by server time, and a pattern subscriber
    // makes every PUBLISH count one receiver, so nothing tells the release that it is gone.
    let (holder, mut conn, _bystander) = held_with_a_bystander(&server, "ghost").await;
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let alive_until = secs * 1000 + micros / 1000 + 3000;
    let ghost_token = "dl1:0123456789abcdef0123456789abcdef";
    let _: () = redis::pipe()
        .cmd("RPUSH")
        .arg("leasehold:{ghost}:queue")
        .arg("ghost")
        .ignore()
        .cmd("HSET")
        .arg("leasehold:{ghost}:waiters")
        .arg("ghost")
        .arg(format!("{alive_until} 2000 {ghost_token}"))
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        let guard = patient.mutex("ghost").lock().await.unwrap();
        (Instant::now(), guard)
    });
    wait_for_busy_attempts(&server, 2).await;

    let released = Instant::now();
    holder.release().await.unwrap();
    // The frozen client got the lock, with a claim, not a whole lease.
    assert_eq!(
        get(&mut conn, "leasehold:{ghost}").await.as_deref(),
        Some(ghost_token)
    );
    let pttl: i64 = redis::cmd("PTTL")
        .arg("leasehold:{ghost}")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(pttl > 0 && pttl <= 2000, "claim of {pttl} ms");
    let ghost_fence: u64 = get(&mut conn, "leasehold:{ghost}:fence")
        .await
        .unwrap()
        .parse()
        .unwrap();
    let (granted, guard) = within(Duration::from_secs(10), "grant after the claim", waiter)
        .await
        .unwrap();
    let waited = granted.duration_since(released);
    // The live waiter gets it once the claim lapses (it looks again at the holder's lease end): never a lease later.
    assert!(
        waited > Duration::from_millis(1500) && waited < Duration::from_millis(3500),
        "waited {waited:?} behind a 2 s claim"
    );
    assert!(guard.fence().get() > ghost_fence);
    guard.release().await.unwrap();
}

/// How long the first waiter in `name`'s queue stays live without another attempt, by the server's clock (both queue
/// layouts keep "<alive until, server ms> …" per waiter).
async fn first_waiter_live_for(
    conn: &mut redis::aio::MultiplexedConnection,
    name: &str,
) -> Duration {
    let (first, time): (Option<String>, (u64, u64)) = redis::pipe()
        .cmd("LINDEX")
        .arg(format!("leasehold:{{{name}}}:queue"))
        .arg(0)
        .cmd("TIME")
        .query_async(conn)
        .await
        .unwrap();
    let Some(first) = first else {
        return Duration::ZERO;
    };
    let entry: Option<String> = redis::cmd("HGET")
        .arg(format!("leasehold:{{{name}}}:waiters"))
        .arg(first)
        .query_async(conn)
        .await
        .unwrap();
    let alive_until: u64 = entry
        .as_deref()
        .and_then(|entry| entry.split(' ').next())
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(0);
    let now_ms = time.0 * 1000 + time.1 / 1000;
    Duration::from_millis(alive_until.saturating_sub(now_ms))
}

/// With `holder` holding the lock `name` and the waiter process `frozen` (asking for a 30 s lease) on its way into the
/// queue: queues `next` behind it, then freezes that process while its entry is live (it looks again every second,
/// and liveness lasts 3 s) and its connection open, so that the release cannot tell it from a live waiter, and
/// releases at once. Returns who held the lock right after the release, and how long `next` waited for it.
async fn wait_behind_a_frozen_process(
    server: &RedisServer,
    name: &str,
    holder: leasehold::Guard,
    frozen: &leasehold_tests::ChildGuard,
    next: impl std::future::Future<Output = leasehold::Guard> + Send + 'static,
) -> (Option<leasehold::Holder>, Duration) {
    let locks = connect(server).await;
    wait_for_queue_len(server, name, 1).await;
    let next = tokio::spawn(async move {
        let guard = next.await;
        (Instant::now(), guard)
    });
    wait_for_queue_len(server, name, 2).await;
    // Frozen just before the release, while its last attempt keeps it live for long enough that the release, a few
    // milliseconds later, cannot tell it from a live waiter. Read, not assumed: on a loaded machine its heartbeat (due
    // every second) can come late, and a release then rightly passes it over.
    let mut conn = redis_conn(server).await;
    within(
        Duration::from_secs(20),
        "the waiter frozen while live",
        async {
            loop {
                frozen.signal(Signal::SIGSTOP).unwrap();
                if first_waiter_live_for(&mut conn, name).await > Duration::from_millis(1000) {
                    return;
                }
                frozen.signal(Signal::SIGCONT).unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        },
    )
    .await;

    let released = Instant::now();
    holder.release().await.unwrap();
    let claimed = locks.inspect(name).await.unwrap().holder;
    let (granted, guard) = within(
        Duration::from_secs(6),
        "the next waiter's grant after the claim",
        next,
    )
    .await
    .unwrap();
    guard.release().await.unwrap();
    (claimed, granted.duration_since(released))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_fair_waiter_costs_the_next_one_its_claim_not_its_lease() {
    let server = RedisServer::start();
    let holder = connect(&server)
        .await
        .fair_mutex("relay")
        .lock()
        .await
        .unwrap();
    let mut frozen = worker(&["fair-wait", &server.url(), "relay", "1"]);
    let next = connect(&server).await.fair_mutex("relay");
    let (claimed, waited) =
        wait_behind_a_frozen_process(&server, "relay", holder, &frozen, async move {
            next.lock().await.unwrap()
        })
        .await;
    assert_eq!(
        claimed.and_then(|h| h.description),
        Some(format!("{}-0", frozen.id())),
        "the release handed the lock to the frozen waiter"
    );
    // It waited for the claim (2 s), never for the 30 s lease the frozen waiter asked for.
    assert!(
        waited > Duration::from_millis(1500),
        "granted after {waited:?}, inside the claim"
    );
    // Thawed, the frozen waiter finds its grant lapsed, queues again, and gets the lock in its turn.
    frozen.signal(Signal::SIGCONT).unwrap();
    let status = tokio::task::block_in_place(|| frozen.wait_timeout(Duration::from_secs(10)))
        .expect("the thawed waiter finished");
    assert!(status.success(), "the thawed waiter failed: {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_mutex_waiter_costs_the_next_one_its_claim_not_its_lease() {
    let server = RedisServer::start();
    let holder = connect(&server).await.mutex("relay").lock().await.unwrap();
    let handed = holder.token().to_owned();
    let mut frozen = worker(&["hold", &server.url(), "relay", "30000"]);
    let next = connect(&server).await.mutex("relay");
    let (claimed, waited) =
        wait_behind_a_frozen_process(&server, "relay", holder, &frozen, async move {
            next.lock().await.unwrap()
        })
        .await;
    // The release handed the lock on, to the head of the queue: the frozen process (the next waiter is behind it).
    let claimed = claimed.expect("the release handed the lock on");
    assert_ne!(claimed.token, handed);
    assert!(
        waited > Duration::from_millis(1500),
        "granted after {waited:?}, inside the claim"
    );
    // Thawed, the frozen waiter finds its grant lapsed, and takes the lock by a later attempt.
    frozen.signal(Signal::SIGCONT).unwrap();
    let stdout = frozen.stdout.take().unwrap();
    let line = within(
        Duration::from_secs(10),
        "the thawed waiter's grant",
        tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).unwrap();
            line
        }),
    )
    .await
    .unwrap();
    assert!(line.starts_with("acquired "), "{line:?}");
}

#[tokio::test]
async fn a_grant_whose_message_was_lost_is_taken_by_the_next_attempt() {
    let server = RedisServer::start();
    let patient = connect(&server).await;
    let (holder, mut conn, _bystander) = held_with_a_bystander(&server, "lost-note").await;
    let waiter = tokio::spawn(async move {
        let guard = patient.mutex("lost-note").lock().await.unwrap();
        (Instant::now(), guard)
    });
    wait_for_busy_attempts(&server, 2).await;
    // Re-address the waiter's queue entry to a channel it does not listen on: the release still grants its token
    // (the bystander makes the PUBLISH count one), but the grant message never reaches it.
    let ids: Vec<String> = redis::cmd("HKEYS")
        .arg("leasehold:{lost-note}:waiters")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(ids.len(), 1);
    let entry: String = redis::cmd("HGET")
        .arg("leasehold:{lost-note}:waiters")
        .arg(&ids[0])
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::pipe()
        .atomic()
        .cmd("LSET")
        .arg("leasehold:{lost-note}:queue")
        .arg(0)
        .arg("elsewhere")
        .ignore()
        .cmd("HDEL")
        .arg("leasehold:{lost-note}:waiters")
        .arg(&ids[0])
        .ignore()
        .cmd("HSET")
        .arg("leasehold:{lost-note}:waiters")
        .arg("elsewhere")
        .arg(&entry)
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();

    let released = Instant::now();
    holder.release().await.unwrap();
    let handed = get(&mut conn, "leasehold:{lost-note}").await.unwrap();
    assert!(entry.ends_with(&handed), "the waiter's token was granted");
    let (granted, guard) = within(Duration::from_secs(10), "grant without its message", waiter)
        .await
        .unwrap();
    // The waiter's heartbeat attempt (at most a second) finds the lock held by its own previous token and takes it,
    // long before the 2 s claim would lapse.
    assert!(
        granted.duration_since(released) < Duration::from_millis(1500),
        "took {:?}",
        granted.duration_since(released)
    );
    assert_eq!(guard.token(), handed);
    assert!(guard.is_held());
    // It is kept like any lease: renewed to its whole 30 s at once.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let pttl: i64 = redis::cmd("PTTL")
            .arg("leasehold:{lost-note}")
            .query_async(&mut conn)
            .await
            .unwrap();
        if pttl > 20_000 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the claim was never renewed (pttl {pttl})"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_second_copy_of_a_grant_message_never_releases_the_grant_in_use() {
    // One message can arrive twice: a replica delivers what its primary published, and after a failover a client can
    // be subscribed on both (the cluster torture run found it). The copy must not be given back as a grant nobody
    // waits for: that release would free the lock its holder is using.
    let server = RedisServer::start();
    let holder_client = connect(&server).await;
    let waiter_client = connect(&server).await;
    crate::lock_and_release(&waiter_client, "warm-up").await;
    let holder = holder_client
        .mutex("twice")
        .ttl(Duration::from_secs(60))
        .try_lock()
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        let guard = waiter_client.mutex("twice").lock().await.unwrap();
        (waiter_client, guard)
    });
    wait_for_busy_attempts(&server, 1).await;
    let mut conn = crate::redis_conn(&server).await;
    let clients: Vec<String> = redis::cmd("HKEYS")
        .arg("leasehold:{twice}:waiters")
        .query_async(&mut conn)
        .await
        .unwrap();
    let [client_id] = clients.as_slice() else {
        panic!("one waiting client expected: {clients:?}");
    };
    holder.release().await.unwrap();
    let (_waiter_client, guard) = within(Duration::from_secs(5), "the hand-off", waiter)
        .await
        .unwrap();
    let channel = format!("leasehold:wake:{client_id}");
    let copy = format!(
        "g {} 1 2000 {}\nleasehold:{{twice}}",
        guard.fence().get(),
        guard.token()
    );
    // A decoy for a token nobody here knows, after the copy: the subscriber handles messages in order, and gives the
    // decoy back with one release call, so once that call has reached the server, the copy has been handled too.
    let decoy = "g 1 1 2000 dl1:00000000000000000000000000000000\nleasehold:{twice}";
    // The new holder extends its 2 s claim to its whole lease (30 s) right after the hand-off, with one renewal call:
    // let that pass first, so that the count below is the decoy's alone (the next renewal is 10 s away).
    within(Duration::from_secs(5), "the claim extended", async {
        loop {
            let left: i64 = redis::cmd("PTTL")
                .arg("leasehold:{twice}")
                .query_async(&mut conn)
                .await
                .unwrap();
            if left > 2_500 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await; // polls server state: no event to await
        }
    })
    .await;
    server.config_resetstat();
    for message in [copy.as_str(), decoy] {
        let receivers: i64 = redis::cmd("PUBLISH")
            .arg(&channel)
            .arg(message)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(receivers, 1);
    }
    within(Duration::from_secs(5), "the decoy's release", async {
        while server.command_calls("evalsha") < 1 {
            tokio::time::sleep(Duration::from_millis(5)).await; // polls a server counter: no event to await
        }
    })
    .await;
    assert_eq!(
        server.command_calls("evalsha"),
        1,
        "the copy was given back too"
    );
    assert!(guard.is_held());
    assert_eq!(
        get(&mut conn, "leasehold:{twice}").await.as_deref(),
        Some(guard.token())
    );
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_mutex_release_never_hands_the_lock_to_a_queued_kind_entry() {
    // A name used by a read-write lock (say) and then by a mutex can still have the read-write waiters' entries in its
    // queue (the command's plain run and -s/-x runs switch kinds on one name). Such an entry has another format: read
    // as a mutex's, its tail would become the owner token, held by nobody.
    let server = RedisServer::start();
    let (holder, mut conn, _bystander) = held_with_a_bystander(&server, "mixed").await;
    let alive = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
        + 60_000;
    let entry = format!("{alive} 2000 0 client-1 w dl1:0123456789abcdef0123456789abcdef");
    let _: () = redis::pipe()
        .atomic()
        .cmd("RPUSH")
        .arg("leasehold:{mixed}:queue")
        .arg("wait-1")
        .ignore()
        .cmd("HSET")
        .arg("leasehold:{mixed}:waiters")
        .arg("wait-1")
        .arg(&entry)
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    holder.release().await.unwrap();
    assert_eq!(
        get(&mut conn, "leasehold:{mixed}").await,
        None,
        "the release handed the lock to another kind's entry"
    );
    // The lock is free for anyone at once.
    let locks = connect(&server).await;
    locks
        .mutex("mixed")
        .try_lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// A waiting client joins the lock's queue only once a release can reach it. On one server a release takes a grant
/// that nobody heard (`PUBLISH` counted no receiver) for proof that the waiter is gone, and passes it over: a client
/// queued before its subscriber subscribed would lose its place to the next one, or take the lock only once it looks
/// again. A client whose user may publish but not `SUBSCRIBE` (an ACL) is not reachable: its first attempt, made before
/// its subscriber gave up (the response timeout, 10 s here; then it is queued and looks again at lease ends), leaves
/// it out of the queue.
#[tokio::test]
async fn a_waiter_is_queued_only_once_a_release_can_reach_it() {
    let server = RedisServer::start();
    let mut conn = redis_conn(&server).await;
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "deaf",
            "on",
            ">deaf",
            "~*",
            "allchannels",
            "+@all",
            "-subscribe",
        ])
        .query_async(&mut conn)
        .await
        .unwrap();
    let holder = connect(&server).await.mutex("reach").lock().await.unwrap();
    let deaf = leasehold::Client::builder(&format!("redis://deaf:deaf@{}", server.addr()))
        .unwrap()
        .response_timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    // Its first attempt ran by the time it gives up, well inside the response timeout.
    let waited = deaf
        .mutex("reach")
        .lock_timeout(Duration::from_millis(300))
        .await;
    assert!(waited.is_err(), "the deaf client took a held lock");
    let queue: Vec<String> = redis::cmd("LRANGE")
        .arg("leasehold:{reach}:queue")
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        queue.is_empty(),
        "a client that cannot hear a release was queued: {queue:?}"
    );
    holder.release().await.unwrap();
}
