//! The `main` of a test binary whose tests share one topology (a cluster, a Sentinel set) and change it (fail over,
//! migrate, kill nodes), so that they must run one after the other: `harness = false` in Cargo.toml, and
//! [`run_in_sequence`] as the whole `main`.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::time::Instant;

/// The table of such a binary's tests, for [`run_in_sequence`]: `module::name` entries (or bare `name`s), each named
/// as libtest would name it.
#[macro_export]
macro_rules! sequence_tests {
    ($($module:ident :: $name:ident),* $(,)?) => {
        &[$((concat!(stringify!($module), "::", stringify!($name)), |t| Box::pin($module::$name(t)))),*]
    };
    ($($name:ident),* $(,)?) => {
        &[$((stringify!($name), |t| Box::pin($name(t)))),*]
    };
}

/// Whether this run leaves out the tests of the store `store` (`"redis"`, `"etcd"`, `"zookeeper"`, `"postgres"`,
/// `"mysql"`), and says so:
/// `LEASEHOLD_TEST_STORES` names the stores whose tests run, comma-separated (all when it is unset). The Valkey pass
/// of `scripts/test.sh` sets it to `redis`, since the other stores' tests never touch the Redis server.
pub fn leaves_out(store: &str) -> bool {
    let Ok(stores) = std::env::var("LEASEHOLD_TEST_STORES") else {
        return false;
    };
    let left_out = !stores.split(',').any(|s| s.trim() == store);
    if left_out {
        println!("{store}: its tests are left out (LEASEHOLD_TEST_STORES={stores})");
    }
    left_out
}

/// Prints what leasehold traces on stderr when `LEASEHOLD_TEST_TRACE` names a level (`debug` when it names none):
/// the first line of a sequence binary's `main`.
pub fn trace_from_env() {
    if let Ok(level) = std::env::var("LEASEHOLD_TEST_TRACE") {
        let level = level.parse().unwrap_or(tracing::Level::DEBUG);
        tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .init();
    }
}

/// One test of such a binary: it borrows the shared topology for its run.
pub type SharedTest<T> = fn(&mut T) -> Pin<Box<dyn Future<Output = ()> + '_>>;

/// Runs the `tests` whose names contain one of the command line's words (all without words), each on a runtime of its
/// own, against one topology made by `start` and dropped at the end; after a failed test, `heal` makes the topology
/// whole again for the next. Prints libtest-like lines, answers `--list`, and exits with status 101 when a test
/// failed.
pub fn run_in_sequence<T>(
    what: &str,
    tests: &[(&str, SharedTest<T>)],
    start: impl FnOnce() -> T,
    heal: impl FnMut(&mut T),
) {
    let failed = run_tests(what, "", tests, start, heal);
    if !failed.is_empty() {
        println!("\nfailures: {failed:?}");
        std::process::exit(101);
    }
}

/// The whole `main` of a binary of one store's tests: [`trace_from_env`], then [`run_in_sequence`] unless
/// [`leaves_out`] says this run leaves out `store`'s tests.
pub fn run_store_in_sequence<T>(
    store: &str,
    what: &str,
    tests: &[(&str, SharedTest<T>)],
    start: impl FnOnce() -> T,
    heal: impl FnMut(&mut T),
) {
    trace_from_env();
    if leaves_out(store) {
        return;
    }
    run_in_sequence(what, tests, start, heal);
}

/// A topology of [`run_on_each`]: its name, and how to start it.
pub type Topology<T> = (&'static str, fn() -> T);

/// Runs the same `tests` on each of `topologies` in turn (each started when its turn comes and dropped after its
/// tests), as [`run_in_sequence`] runs them on one: a test is named `<topology>::<test>`, and the command line's words
/// filter on that name. Exits with status 101 when a test failed on any of them.
pub fn run_on_each<T>(
    topologies: &[Topology<T>],
    tests: &[(&str, SharedTest<T>)],
    heal: impl FnMut(&mut T) + Clone,
) {
    let mut failed = Vec::new();
    for (what, start) in topologies.iter().filter(|(what, _)| !leaves_out(what)) {
        failed.extend(run_tests(what, what, tests, start, heal.clone()));
    }
    if !failed.is_empty() {
        println!("\nfailures: {failed:?}");
        std::process::exit(101);
    }
}

/// The loop of both: returns the names of the failed tests.
fn run_tests<T>(
    what: &str,
    prefix: &str,
    tests: &[(&str, SharedTest<T>)],
    start: impl FnOnce() -> T,
    mut heal: impl FnMut(&mut T),
) -> Vec<String> {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let named = |name: &str| match prefix {
        "" => name.to_owned(),
        prefix => format!("{prefix}::{name}"),
    };
    let chosen: Vec<_> = tests
        .iter()
        .map(|(name, test)| (named(name), test))
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    if std::env::args().any(|a| a == "--list") {
        for (name, _) in &chosen {
            println!("{name}: test");
        }
        return Vec::new();
    }
    println!("\nrunning {} tests (one {what}, in sequence)", chosen.len());
    if chosen.is_empty() {
        return Vec::new();
    }
    let started = Instant::now();
    let mut topology = start();
    println!("{what} ready in {:.1?}", started.elapsed());
    let mut failed = Vec::new();
    for (name, test) in chosen {
        let began = Instant::now();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            runtime.block_on(test(&mut topology));
        }));
        drop(runtime);
        match outcome {
            Ok(()) => println!("test {name} ... ok ({:.1?})", began.elapsed()),
            Err(_) => {
                println!("test {name} ... FAILED ({:.1?})", began.elapsed());
                failed.push(name);
                heal(&mut topology);
            }
        }
    }
    drop(topology);
    if failed.is_empty() {
        println!("\ntest result: ok. ({:.1?})", started.elapsed());
    }
    failed
}

/// Polls `check` every 10 ms until it holds, for at most `within`, and panics naming `what` otherwise. For what the
/// stores do not announce to an outsider (a waiter has queued, a lease was renewed): each poll is one observation.
///
/// # Panics
///
/// When `check` did not hold within `within` (or panicked itself).
pub async fn eventually<F, Fut>(what: &str, within: std::time::Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {within:?}: {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Waits, as [`eventually`] does, until lock `name` has `n` waiters as `client.inspect` counts them.
///
/// # Panics
///
/// When it does not within `within`.
pub async fn waiters(client: &leasehold::Client, name: &str, n: u64, within: std::time::Duration) {
    eventually(&format!("{n} waiters on {name}"), within, || async {
        client
            .inspect(name)
            .await
            .is_ok_and(|info| info.waiting_clients == n)
    })
    .await;
}

/// A lock prefix that no other test of the process uses: `base` and a number.
pub fn fresh_prefix(base: &str) -> String {
    static PREFIXES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = PREFIXES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{base}{n}")
}

/// A client of `url` under `prefix` whose session lives `ttl`.
///
/// # Panics
///
/// When the URL is refused or the client does not connect.
pub async fn session_client(
    url: &str,
    prefix: &str,
    ttl: std::time::Duration,
) -> leasehold::Client {
    leasehold::Client::builder(url)
        .unwrap()
        .prefix(prefix)
        .session_ttl(ttl)
        .connect()
        .await
        .unwrap()
}

/// Waits, as [`eventually`] does, until `lease` was renewed by a keep-alive sent after `after`: its deadline moved
/// past `after + validity` (the part of the session a grant counts on after each answered keep-alive) less the drift
/// allowance. Asserts it stayed held all along.
///
/// # Panics
///
/// When the lease is lost, or not renewed within `within`.
pub async fn renewed_after(
    lease: &leasehold::Lease,
    after: tokio::time::Instant,
    validity: std::time::Duration,
    within: std::time::Duration,
) {
    let drift = validity / 100 + std::time::Duration::from_millis(2);
    eventually("a keep-alive answered after the fault", within, || async {
        assert!(lease.is_held(), "the lease was lost: {:?}", lease.loss());
        lease.valid_until() >= after + validity - drift
    })
    .await;
}

/// An election's observer on a store with a feed of changes (etcd's watch, ZooKeeper's watches) is woken by it, not by
/// its interval: with an interval of an hour (a read at least every ten), `observing`'s observer still says, each
/// within `within`, the vacancy, `leading`'s new term (with its number), its proclamation, and the vacancy again.
///
/// # Panics
///
/// When a change is not said within `within`, or is not the one expected.
pub async fn an_observer_is_woken_by_its_feed(
    leading: &leasehold::Client,
    observing: &leasehold::Client,
    within: std::time::Duration,
) {
    use leasehold::Observed;
    let mut observer = observing
        .election("fed")
        .observe_every(std::time::Duration::from_secs(3600))
        .observe();
    assert_eq!(next(&mut observer, within).await, Observed::Vacant);
    let mut term = leading.election("fed").campaign("a").await.unwrap();
    match next(&mut observer, within).await {
        Observed::Leader(seen) => {
            assert_eq!(
                (seen.fence, seen.term),
                (Some(term.fence()), Some(term.term()))
            );
        }
        other => panic!("{other:?} while a term held"),
    }
    term.proclaim("b").await.unwrap();
    match next(&mut observer, within).await {
        Observed::Leader(seen) => assert_eq!(seen.value.as_deref(), Some("b")),
        other => panic!("{other:?} after a proclamation"),
    }
    term.resign().await.unwrap();
    assert_eq!(next(&mut observer, within).await, Observed::Vacant);
}

/// The observer's next change, within `within`.
async fn next(
    observer: &mut leasehold::Observer,
    within: std::time::Duration,
) -> leasehold::Observed {
    tokio::time::timeout(within, observer.next())
        .await
        .expect("the observer was not woken by the store's feed")
        .unwrap()
}
