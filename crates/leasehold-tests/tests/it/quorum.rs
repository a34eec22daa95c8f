//! The quorum lock (Redlock with a monotone fence) over independent `redis-server` processes.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::{Error, LossReason, Quorum};
use leasehold_tests::{QuorumNodes, RedisServer};

use crate::within;

fn servers(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

async fn quorum(nodes: &[RedisServer]) -> Quorum {
    Quorum::connect(nodes.iter().map(RedisServer::url))
        .await
        .unwrap()
}

fn get(server: &RedisServer, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query(&mut server.connection())
        .unwrap()
}

fn set(server: &RedisServer, key: &str, value: &str) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query(&mut server.connection())
        .unwrap();
}

/// Waits (at most 5 s) until `done` holds: for what the nodes do in the background (a round's late votes, an undo, a
/// writer's intent), which nothing announces, so it is polled.
async fn poll_until(what: &str, done: impl Fn() -> bool) {
    within(Duration::from_secs(5), what, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn a_majority_grants_the_lock_and_every_node_forgets_it_on_release() {
    let nodes = servers(5);
    let q = quorum(&nodes).await;
    assert_eq!((q.nodes(), q.majority()), (5, 3));
    let guard = q.mutex("jobs").try_lock().await.unwrap();
    let holding = || {
        nodes
            .iter()
            .filter(|n| get(n, "leasehold:{jobs}").as_deref() == Some(guard.token()))
            .count()
    };
    assert!(holding() >= 3, "{} nodes hold it", holding());
    // The round answered at a majority; the others grant too, a moment later.
    poll_until("every node's grant", || holding() == 5).await;
    // The fence was written back: every node that granted has a counter at least the fence.
    let written = nodes
        .iter()
        .filter(|n| {
            get(n, "leasehold:{jobs}:fence")
                .is_some_and(|c| c.parse::<u64>().unwrap() >= guard.fence().get())
        })
        .count();
    assert!(written >= 3, "{written} counters at the fence");
    match q.mutex("jobs").try_lock().await {
        Err(Error::Busy {
            remaining: Some(_), ..
        }) => {}
        other => panic!("expected Busy, got {other:?}"),
    }
    let fence = guard.fence();
    guard.release().await.unwrap();
    for node in &nodes {
        assert_eq!(get(node, "leasehold:{jobs}"), None);
    }
    let again = q.mutex("jobs").try_lock().await.unwrap();
    assert!(again.fence() > fence);
    again.release().await.unwrap();
}

#[tokio::test]
async fn two_of_five_down_still_grant_and_three_down_fail_on_time_leaving_nothing() {
    let mut nodes = servers(5);
    let q = quorum(&nodes).await;
    nodes[0].kill();
    nodes[1].kill();
    let guard = q
        .mutex("jobs")
        .ttl(Duration::from_millis(900))
        .try_lock()
        .await
        .unwrap();
    // Renewals go on with a minority down: the lease outlives two of its lengths.
    tokio::time::sleep(Duration::from_millis(2000)).await; // time passing is what is tested
    assert!(guard.is_held(), "{:?}", guard.loss());
    // A third node down: no majority can confirm a renewal, and the holder is told before the deadline.
    let lost = guard.lost();
    nodes[2].kill();
    let reason = within(Duration::from_secs(3), "the loss signal", lost).await;
    assert_eq!(reason, LossReason::Expired);
    drop(guard);
    let started = Instant::now();
    match q.mutex("other").try_lock().await {
        Err(Error::NoQuorum {
            answered: 2,
            nodes: 5,
            ..
        }) => {}
        other => panic!("expected NoQuorum, got {other:?}"),
    }
    // A waiting call ends on time too, with the same error, however many rounds it made.
    match q
        .mutex("other")
        .lock_timeout(Duration::from_millis(400))
        .await
    {
        Err(Error::NoQuorum { .. }) => {}
        other => panic!("expected NoQuorum, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // The failed rounds left nothing on the nodes that answered.
    poll_until("the undone rounds", || {
        get(&nodes[3], "leasehold:{other}").is_none()
            && get(&nodes[4], "leasehold:{other}").is_none()
    })
    .await;
}

#[tokio::test]
async fn divergent_counters_never_give_a_lower_fence() {
    // Counters A far ahead of B and C (a node that saw many grants, or whose clock ran ahead).
    let nodes = servers(3);
    let q = quorum(&nodes).await;
    let ahead: u64 = 9_000_000_000_000_000;
    set(&nodes[0], "leasehold:{fenced}:fence", &ahead.to_string());
    // C is held by someone else: the first grant is on {A, B}, with a fence above A's counter.
    let c = leasehold::Client::connect(&nodes[2].url()).await.unwrap();
    let on_c = c.mutex("fenced").try_lock().await.unwrap();
    let first = q.mutex("fenced").try_lock().await.unwrap();
    let first_fence = first.fence();
    assert!(first_fence.get() > ahead);
    first.release().await.unwrap();
    on_c.release().await.unwrap();
    // Now A is held by someone else: the next grant is on {B, C}. Only the write-back of the first fence to B keeps
    // it above: "max over the winning majority" would give C's and B's clock-floored counters, far below.
    let a = leasehold::Client::connect(&nodes[0].url()).await.unwrap();
    let on_a = a.mutex("fenced").try_lock().await.unwrap();
    let second = q.mutex("fenced").try_lock().await.unwrap();
    assert!(
        second.fence() > first_fence,
        "fence went back: {} after {first_fence}",
        second.fence(),
    );
    second.release().await.unwrap();
    on_a.release().await.unwrap();
}

#[tokio::test]
async fn bad_quorums_are_typed_errors() {
    let nodes = servers(2);
    match Quorum::connect(nodes.iter().map(RedisServer::url)).await {
        Err(Error::InvalidArgument(_)) => {}
        other => panic!("two nodes are no quorum: {other:?}"),
    }
    match Quorum::connect(["redis://a:1", "not a url", "redis://c:3"]).await {
        Err(Error::InvalidArgument(_)) => {}
        other => panic!("expected a bad URL: {other:?}"),
    }
}

#[test]
fn eight_processes_on_a_five_node_quorum_never_overlap_and_fences_increase() {
    let nodes = servers(5);
    let store = RedisServer::start();
    let urls = nodes
        .iter()
        .map(RedisServer::url)
        .collect::<Vec<_>>()
        .join(",");
    let data = store.url();
    let mut workers: Vec<_> = (0..8)
        .map(|_| crate::worker(&["quorum-count", &urls, &data, "shared", "100"]))
        .collect();
    for w in &mut workers {
        let status = w
            .wait_timeout(Duration::from_secs(180))
            .expect("worker finished in time");
        assert!(status.success(), "worker failed: {status}");
    }
    leasehold_tests::assert_exclusive_sections(&store, 800);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_empty_after_the_longest_lease_gives_no_second_owner() {
    // The Redlock restart rule, which the harness enforces: a node that lost its data comes back only after the
    // longest lease (and the fence proposals' lead) has passed.
    let ttl = Duration::from_millis(900);
    let mut nodes = QuorumNodes::start(3, ttl);
    let q = Quorum::connect(nodes.urls()).await.unwrap();
    // Node 2 is held by someone else, so the holder's majority is {0, 1}.
    let other = leasehold::Client::connect(&nodes.node(2).url())
        .await
        .unwrap();
    let on_2 = other.mutex("restart").try_lock().await.unwrap();
    let holder = q.mutex("restart").ttl(ttl).try_lock().await.unwrap();
    let lost = holder.lost();
    nodes.kill(1);
    // With node 1 gone the holder keeps one node of three: no renewal reaches a majority, and it is told so at its
    // deadline, within a lease.
    let reason = within(ttl * 2, "the holder's loss signal", lost).await;
    assert_eq!(reason, LossReason::Expired);
    let waited = nodes.restart(1).await;
    assert!(
        waited > Duration::ZERO,
        "the loss came after the rule's downtime: the test no longer shows the harness enforcing it"
    );
    on_2.release().await.unwrap();
    let next = q.mutex("restart").try_lock().await.unwrap();
    assert!(!holder.is_held(), "two owners");
    assert!(
        next.fence() > holder.fence(),
        "the restarted node's counter is floored at its clock: {} after {}",
        next.fence(),
        holder.fence()
    );
    next.release().await.unwrap();
}

#[tokio::test]
async fn a_slow_or_partitioned_node_costs_a_round_no_more_than_the_node_timeout() {
    let nodes = servers(5);
    let slow = leasehold_tests::TcpProxy::start(nodes[0].addr()).await;
    let cut = leasehold_tests::TcpProxy::start(nodes[1].addr()).await;
    let mut urls: Vec<String> = vec![slow.url(), cut.url()];
    urls.extend(nodes[2..].iter().map(RedisServer::url));
    let node_timeout = Duration::from_millis(100);
    let q = Quorum::connect_with(&urls, "leasehold", node_timeout)
        .await
        .unwrap();
    // Warm the connections, so that the round below measures answers, not connects.
    q.mutex("warm")
        .try_lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    slow.delay(Duration::from_secs(2));
    cut.blackhole();
    let ttl = Duration::from_secs(5);
    let before = tokio::time::Instant::now();
    let guard = q.mutex("slow").ttl(ttl).try_lock().await.unwrap();
    let took = before.elapsed();
    // One round: every node at once, answered by the three healthy ones without waiting for the other two (generous
    // slack for a loaded machine, far below the 2 s delay).
    assert!(took < node_timeout * 6, "the round took {took:?}");
    // The validity counts from before the first request left: the slow round is paid out of the lease.
    assert!(guard.valid_until() <= before + ttl);
    assert!(guard.is_held());
    guard.release().await.unwrap();
    // With a healthy node held by someone else, the round needs the slow and the cut node's answers: it waits for
    // them no longer than the node timeout (a quarter more for the connection's own retry), and fails.
    let other = leasehold::Client::connect(&nodes[4].url()).await.unwrap();
    let on_4 = other.mutex("needs-slow").try_lock().await.unwrap();
    let before = tokio::time::Instant::now();
    let outcome = q.mutex("needs-slow").ttl(ttl).try_lock().await;
    let took = before.elapsed();
    assert!(
        matches!(outcome, Err(Error::Busy { .. })),
        "two granted, one busy, two silent: {outcome:?}"
    );
    assert!(
        took >= node_timeout && took < node_timeout * 6,
        "the round took {took:?}"
    );
    on_4.release().await.unwrap();
}

#[tokio::test]
async fn a_release_wakes_the_quorum_waiters_at_once() {
    let nodes = servers(3);
    let holder_q = quorum(&nodes).await;
    let waiter_q = quorum(&nodes).await;
    let held = holder_q
        .mutex("wake")
        .ttl(Duration::from_secs(60))
        .try_lock()
        .await
        .unwrap();
    nodes[0].config_resetstat();
    let waiter = tokio::spawn(async move {
        let guard = waiter_q
            .mutex("wake")
            .lock_timeout(Duration::from_secs(30))
            .await
            .unwrap();
        (Instant::now(), guard)
    });
    // The waiter's first round found the lock busy (one acquire script on node 0). Its next poll is a second away (the
    // holder has 60 s left): a grant much sooner than that after the release comes from the release's announcement.
    within(Duration::from_secs(5), "the waiter's first round", async {
        while nodes[0].command_calls("evalsha") < 1 {
            tokio::time::sleep(Duration::from_millis(2)).await; // polls a server counter: no event to await
        }
    })
    .await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (granted, guard) = within(Duration::from_secs(5), "the waiter's grant", waiter)
        .await
        .unwrap();
    let gap = granted - released;
    assert!(gap < Duration::from_millis(500), "woken after {gap:?}");
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_releaser_that_asks_again_at_once_lets_a_waiter_go_first() {
    let nodes = servers(3);
    let a = quorum(&nodes).await;
    let b = quorum(&nodes).await;
    // Both clients have waited before (their subscribers run), as the processes of a contended lock have.
    for q in [&a, &b] {
        q.mutex("turns")
            .lock_timeout(Duration::from_secs(5))
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let mut b_first = 0;
    for _ in 0..10 {
        let held = a
            .mutex("turns")
            .ttl(Duration::from_secs(10))
            .lock_timeout(Duration::from_secs(5))
            .await
            .unwrap();
        // Who is granted first, the waiter or the releaser asking again: each takes a number when granted. The
        // releaser gives its grant back at once, so that a round it wins (a loaded machine) costs a round, not a
        // waiter stuck behind it.
        let turns = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let waiter = tokio::spawn({
            let (b, turns) = (b.clone(), Arc::clone(&turns));
            async move {
                let guard = b
                    .mutex("turns")
                    .lock_timeout(Duration::from_secs(5))
                    .await
                    .unwrap();
                (guard, turns.fetch_add(1, Ordering::SeqCst))
            }
        });
        // The waiter's first round has found the lock held (its acquire reached node 0).
        let calls = nodes[0].command_calls("evalsha");
        within(Duration::from_secs(5), "the waiter's first round", async {
            while nodes[0].command_calls("evalsha") <= calls {
                tokio::time::sleep(Duration::from_millis(1)).await; // polls a server counter
            }
        })
        .await;
        held.release().await.unwrap();
        let again = tokio::spawn({
            let (a, turns) = (a.clone(), Arc::clone(&turns));
            async move {
                let guard = a
                    .mutex("turns")
                    .lock_timeout(Duration::from_secs(5))
                    .await
                    .unwrap();
                let turn = turns.fetch_add(1, Ordering::SeqCst);
                guard.release().await.unwrap();
                turn
            }
        });
        let (waiter, waiter_turn) = within(Duration::from_secs(5), "the waiter", waiter)
            .await
            .unwrap();
        if waiter_turn == 0 {
            b_first += 1;
        }
        waiter.release().await.unwrap();
        within(Duration::from_secs(5), "the releaser's turn", again)
            .await
            .unwrap();
    }
    assert!(b_first >= 8, "the waiter went first {b_first} times of 10");
}

#[tokio::test]
async fn an_uncontended_grant_costs_one_request_per_node() {
    let nodes = servers(5);
    let q = quorum(&nodes).await;
    // Warm up: the scripts are loaded, the client knows the nodes' clocks, and the lock has its fence counters (a
    // lock's first grant on a node floors the new counter at the clock plus the proposal lead, above any proposal, so
    // it always writes the fence back).
    let first = q.mutex("once").try_lock().await.unwrap();
    first.release().await.unwrap();
    for node in &nodes {
        node.config_resetstat();
    }
    let guard = q.mutex("once").try_lock().await.unwrap();
    // The round answered at a majority; the other nodes' requests may still be on their way.
    poll_until("every node's grant", || {
        nodes
            .iter()
            .all(|n| get(n, "leasehold:{once}").as_deref() == Some(guard.token()))
    })
    .await;
    let calls: u64 = nodes.iter().map(|n| n.command_calls("evalsha")).sum();
    assert_eq!(
        calls, 5,
        "one script call per node: the fence came with the grants, no write-back"
    );
    // A majority took the proposal: their counters are the fence. (A node whose counter the first grant left above
    // it draws higher and keeps its own: counters only go up.)
    let counters: Vec<u64> = nodes
        .iter()
        .map(|n| get(n, "leasehold:{once}:fence").unwrap().parse().unwrap())
        .collect();
    let at_fence = counters
        .iter()
        .filter(|&&c| c == guard.fence().get())
        .count();
    assert!(
        at_fence >= 3,
        "{counters:?} for fence {}",
        guard.fence().get()
    );
    assert!(
        counters.iter().all(|&c| c >= guard.fence().get()),
        "{counters:?}"
    );
    guard.release().await.unwrap();
}

#[tokio::test]
async fn many_quorum_leases_are_renewed_in_one_call_per_node() {
    let nodes = servers(3);
    let q = quorum(&nodes).await;
    // Long enough that a loaded machine (two CPU-bound processes beside the suite) cannot stall a renewal round past
    // the lease: this test counts calls, it does not time them.
    let ttl = Duration::from_secs(3);
    let names: Vec<String> = (0..50).map(|i| format!("batch:{i}")).collect();
    let mutexes: Vec<_> = names.iter().map(|name| q.mutex(name).ttl(ttl)).collect();
    let guards: Vec<_> = futures_util::future::join_all(mutexes.iter().map(|m| m.try_lock()))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    // Every node's grant in place (the third node's are not awaited by the rounds), so that only renewals follow.
    poll_until("every node's grants", || {
        nodes.iter().all(|n| {
            names
                .iter()
                .all(|name| get(n, &format!("leasehold:{{{name}}}")).is_some())
        })
    })
    .await;
    for node in &nodes {
        node.config_resetstat();
    }
    let first = guards.iter().map(|g| g.valid_until()).max().unwrap();
    // A whole lease (about three renewal rounds): the leases outlive their length only through renewals, which is
    // what is tested. This sleep is the span measured, not a wait for an event.
    tokio::time::sleep(ttl + ttl / 10).await;
    for guard in &guards {
        assert!(guard.is_held(), "{:?}", guard.loss());
        assert!(guard.valid_until() > first, "a lease was not renewed");
    }
    // Renewal calls carry every lease due at about the same time (a call per lease would be 50 per round, at least
    // 150 here; batched, a handful per round, more on a loaded machine where the grants spread out in time).
    for node in &nodes {
        let calls = node.command_calls("evalsha");
        assert!(
            calls < 50,
            "{calls} renewal calls for 50 leases in 3 rounds"
        );
    }
    for guard in guards {
        guard.release().await.unwrap();
    }
}

#[tokio::test]
async fn extend_counts_with_a_majority_and_never_deletes_or_recreates() {
    let mut nodes = servers(3);
    let q = quorum(&nodes).await;
    let key = "leasehold:{extend}";
    let pttl = |node: &RedisServer| -> i64 {
        redis::cmd("PTTL")
            .arg(key)
            .query(&mut node.connection())
            .unwrap()
    };
    let guard = q
        .mutex("extend")
        .ttl(Duration::from_secs(5))
        .try_lock()
        .await
        .unwrap();
    guard.extend(Duration::from_secs(60)).await.unwrap();
    assert!(guard.valid_until() > tokio::time::Instant::now() + Duration::from_secs(50));
    poll_until("the extension on every node", || {
        nodes.iter().all(|n| pttl(n) >= 50_000)
    })
    .await;
    // The key gone from two nodes of three: no majority can hold it. The extension says so and ends the lease, and
    // it neither re-creates the key on those two nor deletes it from the third.
    for node in &nodes[..2] {
        let _: () = redis::cmd("DEL")
            .arg(key)
            .query(&mut node.connection())
            .unwrap();
    }
    match guard.extend(Duration::from_secs(60)).await {
        Err(Error::NotOwner { .. }) => {}
        other => panic!("expected NotOwner, got {other:?}"),
    }
    assert_eq!(guard.loss(), Some(LossReason::Gone));
    assert_eq!(get(&nodes[0], key), None);
    assert_eq!(get(&nodes[1], key), None);
    assert_eq!(get(&nodes[2], key).as_deref(), Some(guard.token()));
    drop(guard);
    // Too few nodes answer: neither confirmed nor refused, a typed error, and the lease stays as it was.
    let held = q
        .mutex("extend-2")
        .ttl(Duration::from_secs(5))
        .try_lock()
        .await
        .unwrap();
    nodes[0].kill();
    nodes[1].kill();
    match held.extend(Duration::from_secs(60)).await {
        Err(Error::NoQuorum {
            answered: 1,
            nodes: 3,
            ..
        }) => {}
        other => panic!("expected NoQuorum, got {other:?}"),
    }
    assert!(held.is_held());
    assert!(held.valid_until() < tokio::time::Instant::now() + Duration::from_secs(6));
}

#[tokio::test]
async fn quorum_readers_share_a_writer_excludes_them_and_a_waiting_writer_keeps_new_readers_out() {
    let nodes = servers(3);
    let q = quorum(&nodes).await;
    let rw = q.rw_lock("doc").ttl(Duration::from_secs(10));
    let first = rw.try_read().await.unwrap();
    let second = rw.try_read().await.unwrap();
    assert!(first.is_held() && second.is_held());
    match rw.try_write().await {
        Err(Error::Busy { .. }) => {}
        other => panic!("a writer beside readers: {other:?}"),
    }
    // A single try keeps nobody out: readers still get in.
    let third = rw.try_read().await.unwrap();
    // A writer that gives up withdraws its intent at once: readers need not wait for it to lapse (3 s).
    match rw.write_timeout(Duration::from_millis(200)).await {
        Err(Error::Timeout { .. }) => {}
        other => panic!("a writer beside readers: {other:?}"),
    }
    let fourth = within(
        Duration::from_secs(1),
        "a reader after the writer gave up",
        async {
            loop {
                match rw.try_read().await {
                    Ok(guard) => return guard,
                    // The withdrawal runs in the background: asked again.
                    Err(Error::Busy { .. }) => tokio::time::sleep(Duration::from_millis(5)).await,
                    Err(other) => panic!("{other:?}"),
                }
            }
        },
    )
    .await;
    fourth.release().await.unwrap();
    // A waiting writer does keep new readers out, and gets in once the readers it waits for are gone.
    let waiting = tokio::spawn({
        let rw = rw.clone();
        async move { rw.write_timeout(Duration::from_secs(10)).await }
    });
    poll_until("the writer's intent on a majority", || {
        nodes
            .iter()
            .filter(|n| get(n, "leasehold:{doc}:queue").is_some())
            .count()
            >= 2
    })
    .await;
    match rw.try_read().await {
        Err(Error::Busy { .. }) => {}
        other => panic!("a new reader while a writer waits: {other:?}"),
    }
    let read_fences = [first.fence(), second.fence(), third.fence()];
    for reader in [first, second, third] {
        reader.release().await.unwrap();
    }
    let writer = within(Duration::from_secs(5), "the writer's grant", waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(
        read_fences.iter().all(|&f| writer.fence() > f),
        "the writer's fence {} is not above the readers' {read_fences:?}",
        writer.fence()
    );
    match rw.try_read().await {
        Err(Error::Busy { .. }) => {}
        other => panic!("a reader beside the writer: {other:?}"),
    }
    // The same name as a mutex is another kind: refused as such, naming the kind, nothing changed.
    match q.mutex("doc").try_lock().await {
        Err(Error::WrongKind {
            found: leasehold::LockKind::ReadWrite,
            ..
        }) => {}
        other => panic!("a mutex on a read-write lock's name: {other:?}"),
    }
    writer.release().await.unwrap();
    let reader = rw.try_read().await.unwrap();
    reader.release().await.unwrap();
    for node in &nodes {
        let exists: i64 = redis::cmd("EXISTS")
            .arg("leasehold:{doc}")
            .query(&mut node.connection())
            .unwrap();
        assert_eq!(exists, 0, "the set of holds outlived its last share");
    }
}

/// A round trip through the delaying proxies of the ordering test: a chunk waits this long each way.
const ONE_WAY: Duration = Duration::from_millis(150);

#[tokio::test]
async fn a_renewal_that_runs_after_an_extension_on_every_node_bounds_the_deadline() {
    // The outside review's schedule: the keeper's renewal meets NOSCRIPT and is re-sent after the script is loaded;
    // an extension to 60 s sent meanwhile runs first on every node, the renewal last. Each node then expires the key
    // one lease after the renewal ran: the holder must not believe in the 60 s.
    let nodes = servers(3);
    let mut proxies = Vec::new();
    for node in &nodes {
        proxies.push(leasehold_tests::TcpProxy::start(node.addr()).await);
    }
    let urls: Vec<String> = proxies.iter().map(|p| p.url()).collect();
    let q = Quorum::connect_with(&urls, "leasehold", Duration::from_secs(2))
        .await
        .unwrap();
    // Renewed every 2 s: the keeper's next renewal comes long after the reordered one's reply.
    let ttl = Duration::from_secs(6);
    let mut reproduced = None;
    // The schedule needs the extension to reach the nodes within one proxy delay of the script load; on a loaded
    // machine that can miss, so it is tried a few times (each try checks on the nodes whether it got the schedule).
    for attempt in 0..4 {
        for proxy in &proxies {
            proxy.delay(Duration::ZERO);
        }
        let name = format!("reordered-{attempt}");
        let guard = q.mutex(&name).ttl(ttl).try_lock().await.unwrap();
        for proxy in &proxies {
            proxy.delay(ONE_WAY);
        }
        for node in &nodes {
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query(&mut node.connection())
                .unwrap();
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query(&mut node.connection())
                .unwrap();
        }
        // The keeper's renewal met NOSCRIPT and loaded the script on every node: its re-sent call is two proxy
        // delays away, the extension one.
        poll_until("the renewal's script load on every node", || {
            nodes.iter().all(|n| n.command_calls("script|load") >= 1)
        })
        .await;
        let extended = guard.extend(Duration::from_secs(60)).await;
        let key = format!("leasehold:{{{name}}}");
        let pttl = |n: &RedisServer| -> i64 {
            redis::cmd("PTTL")
                .arg(&key)
                .query(&mut n.connection())
                .unwrap()
        };
        // The renewal ran last on every node when each has the key for at most one lease (if the extension ran last
        // somewhere, the keys keep their 60 s and this try did not get the schedule).
        let renewed_last = tokio::time::timeout(Duration::from_secs(3), async {
            while !nodes.iter().all(|n| (0..=6_000).contains(&pttl(n))) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .is_ok();
        if extended.is_ok() && renewed_last {
            // Its reply is one proxy delay away; then cut the holder off before the keeper's next renewal.
            tokio::time::sleep(ONE_WAY + Duration::from_millis(150)).await; // the proxy's fixed delay
            for proxy in &proxies {
                proxy.blackhole();
            }
            reproduced = Some((name, guard));
            break;
        }
        guard.release().await.unwrap();
    }
    let (name, guard) =
        reproduced.expect("the extension never ran before the renewal on every node");
    // The holder's deadline is the renewal's, not the extension's.
    let left = guard
        .valid_until()
        .saturating_duration_since(tokio::time::Instant::now());
    assert!(left <= ttl, "the holder believes {left:?} are left");
    // Another client gets the lock when the nodes expire it, and by then the holder knows it lost it.
    let other = quorum(&nodes).await;
    let second = other
        .mutex(&name)
        .lock_timeout(Duration::from_secs(20))
        .await
        .unwrap();
    assert!(
        !guard.is_held(),
        "two holders: the first still reads held with {:?} left",
        guard.valid_until() - tokio::time::Instant::now()
    );
    assert_eq!(guard.loss(), Some(LossReason::Expired));
    second.release().await.unwrap();
}

#[tokio::test]
async fn a_fence_counter_that_lapses_on_every_node_never_gives_a_lower_fence() {
    // Quorum fences run ahead of the nodes' clocks (by the proposal's lead): a client far from the nodes proposes
    // further ahead than one next to them. When the counters lapse (their retention ran out: fast-forwarded here with
    // PEXPIRE) the next grant must still get a higher fence, whoever asks.
    let nodes = servers(3);
    let mut proxies = Vec::new();
    for node in &nodes {
        proxies.push(leasehold_tests::TcpProxy::start(node.addr()).await);
    }
    let far = Quorum::connect_with(
        proxies.iter().map(|p| p.url()),
        "leasehold",
        Duration::from_secs(2),
    )
    .await
    .unwrap();
    let near = quorum(&nodes).await;
    for trial in 0..3 {
        let name = format!("lapsing-{trial}");
        // Warm both clients at their distances: connections open, clock offsets and round lengths measured (the far
        // client's proposals run about two of its rounds ahead of the nodes' clocks).
        for proxy in &proxies {
            proxy.delay(Duration::from_millis(100));
        }
        for q in [&far, &near] {
            let warm = q.mutex("warm").try_lock().await.unwrap();
            warm.release().await.unwrap();
        }
        let first = far.mutex(&name).try_lock().await.unwrap();
        let fence = first.fence();
        // Released at once (the far client has come closer), so that the near one asks well within the lead.
        for proxy in &proxies {
            proxy.delay(Duration::ZERO);
        }
        first.release().await.unwrap();
        for node in &nodes {
            let _: () = redis::cmd("PEXPIRE")
                .arg(format!("leasehold:{{{name}}}:fence"))
                .arg(1)
                .query(&mut node.connection())
                .unwrap();
        }
        poll_until("the counters lapsed", || {
            nodes
                .iter()
                .all(|n| get(n, &format!("leasehold:{{{name}}}:fence")).is_none())
        })
        .await;
        let second = near.mutex(&name).try_lock().await.unwrap();
        assert!(
            second.fence() > fence,
            "trial {trial}: fence {} after {}",
            second.fence().get(),
            fence.get()
        );
        second.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_vote_that_arrives_after_its_token_was_released_is_refused() {
    // A vote that timed out may still run on its node, from a flow that stalled and recovers after the client had
    // replaced that connection and released the token through the new one. The node must not then hold the lock for
    // nobody for a whole lease.
    let nodes = servers(3);
    let stalled = leasehold_tests::TcpProxy::start(nodes[0].addr()).await;
    let mut urls = vec![stalled.url()];
    urls.extend(nodes[1..].iter().map(RedisServer::url));
    let q = Quorum::connect_with(&urls, "leasehold", Duration::from_millis(200))
        .await
        .unwrap();
    let warm = q.mutex("warm").try_lock().await.unwrap();
    warm.release().await.unwrap();
    stalled.stall();
    // Granted by the other two; the first node's vote waits in the stalled flow.
    let guard = q
        .mutex("late")
        .ttl(Duration::from_secs(30))
        .try_lock()
        .await
        .unwrap();
    // After a second timeout the client opens a new connection to the first node, which passes: rounds until one
    // is granted there too.
    within(
        Duration::from_secs(10),
        "a new connection to the first node",
        async {
            for i in 0.. {
                let probe = q.mutex(&format!("probe-{i}")).try_lock().await.unwrap();
                let key = format!("leasehold:{{probe-{i}}}");
                let reached = tokio::time::timeout(Duration::from_millis(500), async {
                    while get(&nodes[0], &key).as_deref() != Some(probe.token()) {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
                .await
                .is_ok();
                probe.release().await.unwrap();
                if reached {
                    return;
                }
            }
        },
    )
    .await;
    // Released through the new connection: the first node does not hold the token (yet).
    guard.release().await.unwrap();
    let clients = |n: &RedisServer| -> u64 {
        n.info_field("clients", "connected_clients")
            .unwrap()
            .parse()
            .unwrap()
    };
    let before = clients(&nodes[0]);
    let votes = nodes[0].command_calls("evalsha");
    // The stalled flow recovers: it delivers the old vote, then the close of the connection the client dropped.
    stalled.unstall();
    poll_until("the stalled flow delivered and closed", || {
        clients(&nodes[0]) < before
    })
    .await;
    assert!(
        nodes[0].command_calls("evalsha") > votes,
        "the stalled vote never ran"
    );
    assert_eq!(
        get(&nodes[0], "leasehold:{late}"),
        None,
        "the late vote left the node held for nobody"
    );
}

#[tokio::test]
async fn a_described_grant_names_its_holder_on_every_node_that_granted_it() {
    let nodes = servers(3);
    let q = quorum(&nodes).await;
    let guard = q
        .mutex("described")
        .describe("host=a pid=7 nightly")
        .try_lock()
        .await
        .unwrap();
    let share = q
        .rw_lock("described-rw")
        .describe("reader on b")
        .try_read()
        .await
        .unwrap();
    let mut named = (0, 0);
    for node in &nodes {
        let client = leasehold::Client::connect(&node.url()).await.unwrap();
        let info = client.inspect("described").await.unwrap();
        if let Some(holder) = info.holder {
            assert_eq!(holder.token, guard.token());
            assert_eq!(holder.description.as_deref(), Some("host=a pid=7 nightly"));
            named.0 += 1;
        }
        let info = client.inspect("described-rw").await.unwrap();
        if let Some(holder) = info.holder {
            assert_eq!(holder.description.as_deref(), Some("reader on b"));
            named.1 += 1;
        }
    }
    assert!(
        named.0 >= 2 && named.1 >= 2,
        "a majority names the holders: {named:?}"
    );
    guard.release().await.unwrap();
    share.release().await.unwrap();

    let bad = q.mutex("described").describe("two\nlines").try_lock().await;
    assert!(
        matches!(
            bad,
            Err(Error::InvalidArgument(
                leasehold::InvalidArgument::BadDescription { .. }
            ))
        ),
        "{bad:?}"
    );
}

#[tokio::test]
async fn a_read_write_lock_on_a_mutex_name_is_the_wrong_kind_and_changes_nothing() {
    let nodes = servers(3);
    let q = quorum(&nodes).await;
    let guard = q.mutex("kinds").try_lock().await.unwrap();
    for attempt in [
        q.rw_lock("kinds").try_read().await,
        q.rw_lock("kinds").try_write().await,
    ] {
        match attempt {
            Err(Error::WrongKind {
                found: leasehold::LockKind::Mutex,
                ..
            }) => {}
            other => panic!("a share on a mutex's name: {other:?}"),
        }
    }
    // A wait ends at once too: the kind of a name is not something to wait out.
    let started = Instant::now();
    let waited = q
        .rw_lock("kinds")
        .read_timeout(Duration::from_secs(10))
        .await;
    assert!(matches!(waited, Err(Error::WrongKind { .. })), "{waited:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(guard.is_held());
    guard.release().await.unwrap();
    q.rw_lock("kinds")
        .try_read()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}
