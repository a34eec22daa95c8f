//! A worker process for leasehold's multi-process tests. Each mode is one role a test needs a real OS process for.
//!
//! ```text
//! leasehold-worker count URL NAME SECTIONS        # SECTIONS critical sections: a non-atomic counter increment
//! leasehold-worker count-on URL DATA NAME SECTIONS  # the same, the lock on URL (a cluster), the data on DATA
//! leasehold-worker quorum-count URL,URL,… DATA NAME SECTIONS  # the same on a quorum of independent servers
//! leasehold-worker hold URL NAME TTL_MS           # acquire, print "acquired FENCE", then hold until killed (on
//!                                             # etcd, ZooKeeper and SQL TTL_MS is the session's)
//! leasehold-worker hold-then-write URL NAME TTL_MS  # acquire, print "acquired FENCE", wait for a stdin line,
//!                                             # then print "held=BOOL" and try a fenced write: "write=0|1" (in a
//!                                             # SQL database, a fenced transaction inserting 'stale-writer' into
//!                                             # the table fenced_writes)
//! leasehold-worker drop-at-end URL NAME current|multi  # acquire (30 s lease), print "acquired FENCE", and let `main`
//!                                             # return with the guard still alive, as user code does
//! leasehold-worker script-source NAME             # print a script as the library loads it (scripts/profile-server.sh)
//! leasehold-worker fair-wait URL NAME TASKS        # TASKS tasks wait on the fair mutex NAME, described "<pid>-<i>";
//!                                             # each appends its description to test:grants when granted
//! leasehold-worker sem-count URL NAME PERMITS SECTIONS  # SECTIONS sections under one permit each: the number
//!                                             # inside is counted in test:inside, its maximum kept in test:max
//! leasehold-worker rw-mix URL NAME SECTIONS        # SECTIONS sections, one write in ten: overlaps counted in
//!                                             # test:overlaps, the most readers at once in test:max
//! leasehold-worker read-loop URL NAME             # reads (5 ms each) until killed; prints "reading" once
//! leasehold-worker kind-hold URL NAME KIND TTL_MS  # takes a read share (KIND read), the write lock (write) or a
//!                                             # permit of N (permits:N), prints "acquired FENCE", holds until killed
//! leasehold-worker give-up URL PREFIX NAME TTL_MS WAIT_MS  # wait WAIT_MS for the mutex NAME (on etcd, ZooKeeper and
//!                                             # SQL a session of TTL_MS), print "gave up" when the wait times out,
//!                                             # then `flush_releases` (10 s at most) and let `main` return
//! leasehold-worker cycles URL leasehold|peer N   # N lock + release cycles on one lock, one task (the client's work
//!                                             # per cycle, counted by scripts/profile-client.sh)
//! ```
//!
//! Exit status: 0 on success, 1 on any error (printed on stderr), 2 on bad usage.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::Duration;

use redis::AsyncCommands;

/// The fenced write the tests use as "the protected resource": refuses a fence lower than the highest seen.
pub const FENCED_WRITE: &str = r"
local seen = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) < seen then return 0 end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return 1
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [mode, name] = args.as_slice() {
        if mode == "script-source" {
            return match leasehold::__private::script_source(name) {
                Some(source) => {
                    print!("{source}");
                    ExitCode::SUCCESS
                }
                None => usage(),
            };
        }
    }
    if let [mode, url, name, flavor] = args.as_slice() {
        if mode == "drop-at-end" {
            return drop_at_end(url, name, flavor);
        }
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(dispatch(args))
}

/// What `#[tokio::main] async fn main() { let guard = …lock().await?; …; Ok(()) }` does: the guard and the client
/// are dropped as the async block ends, and the runtime is dropped right after.
fn drop_at_end(url: &str, name: &str, flavor: &str) -> ExitCode {
    let runtime = match flavor {
        "current" => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        "multi" => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
        _ => return usage(),
    }
    .expect("a runtime");
    let result: Result<()> = runtime.block_on(async {
        let locks = leasehold::Client::connect(url).await?;
        // Two locks: the client's drop releases every one left, not only the first.
        let guard = locks.mutex(name).lock().await?;
        let _second = locks.mutex(&format!("{name}-2")).lock().await?;
        println!("acquired {}", guard.fence());
        std::io::stdout().flush()?;
        Ok(())
    });
    drop(runtime);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("leasehold-worker: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn dispatch(args: Vec<String>) -> ExitCode {
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["count", url, name, sections] => match sections.parse() {
            Ok(n) => count(url, url, name, n).await,
            Err(e) => Err(e.into()),
        },
        // The lock on a quorum of the comma-separated `urls`, the shared data on the one server `data`.
        ["quorum-count", urls, data, name, sections] => match sections.parse() {
            Ok(n) => quorum_count(urls, data, name, n).await,
            Err(e) => Err(e.into()),
        },
        // The lock on `url` (a cluster, say), the shared data on the one server `data`.
        ["count-on", url, data, name, sections] => match sections.parse() {
            Ok(n) => count(url, data, name, n).await,
            Err(_) => return usage(),
        },
        ["hold", url, name, ttl_ms] => match ttl_ms.parse() {
            Ok(ms) => hold(url, name, ms, false).await,
            Err(_) => return usage(),
        },
        ["hold-then-write", url, name, ttl_ms] => match ttl_ms.parse() {
            Ok(ms) => hold(url, name, ms, true).await,
            Err(_) => return usage(),
        },
        ["fair-wait", url, name, tasks] => match tasks.parse() {
            Ok(n) => fair_wait(url, name, n).await,
            Err(_) => return usage(),
        },
        ["sem-count", url, name, permits, sections] => match (permits.parse(), sections.parse()) {
            (Ok(p), Ok(n)) => sem_count(url, name, p, n).await,
            _ => return usage(),
        },
        ["rw-mix", url, name, sections] => match sections.parse() {
            Ok(n) => rw_mix(url, name, n).await,
            Err(_) => return usage(),
        },
        ["read-loop", url, name] => read_loop(url, name).await,
        ["cycles", url, recipe, n] => match n.parse() {
            Ok(n) => cycles(url, recipe, n).await,
            Err(e) => Err(e.into()),
        },
        ["give-up", url, prefix, name, ttl_ms, wait_ms] => {
            match (ttl_ms.parse(), wait_ms.parse()) {
                (Ok(ttl), Ok(wait)) => give_up(url, prefix, name, ttl, wait).await,
                _ => return usage(),
            }
        }
        ["kind-hold", url, name, kind, ttl_ms] => match ttl_ms.parse() {
            Ok(ms) => kind_hold(url, name, kind, ms).await,
            Err(_) => return usage(),
        },
        _ => return usage(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("leasehold-worker: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: leasehold-worker count|hold|hold-then-write|drop-at-end|fair-wait|sem-count|rw-mix|read-loop|kind-hold URL NAME ... | give-up URL PREFIX NAME TTL_MS WAIT_MS | cycles URL leasehold|peer N"
    );
    ExitCode::from(2)
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// `n` lock + release cycles on one lock from one task: with leasehold's mutex, or with the recipe of rslock (the
/// best Rust peer: `SET NX PX` with a random token, then an owner-checked delete script) on a multiplexed connection.
async fn cycles(url: &str, recipe: &str, n: u32) -> Result<()> {
    match recipe {
        "leasehold" => {
            let locks = leasehold::Client::connect(url).await?;
            let mutex = locks.mutex("profile");
            for _ in 0..n {
                mutex.lock().await?.release().await?;
            }
        }
        "peer" => {
            let mut conn = redis::Client::open(url)?
                .get_multiplexed_async_connection()
                .await?;
            let delete = redis::Script::new(
                "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
            );
            for i in 0..n {
                let token = format!("{:032x}", u128::from(i) * 0x9e37_79b9_7f4a_7c15);
                let set: Option<String> = redis::cmd("SET")
                    .arg("profile")
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async(&mut conn)
                    .await?;
                if set.is_none() {
                    return Err("the lock was busy".into());
                }
                let _: i64 = delete
                    .key("profile")
                    .arg(&token)
                    .invoke_async(&mut conn)
                    .await?;
            }
        }
        _ => return Err(format!("unknown recipe {recipe:?}").into()),
    }
    Ok(())
}

/// Critical sections that would corrupt the counter without mutual exclusion: read, yield, write. An occupancy
/// marker set with NX on entry detects any overlap; every section appends its fence to a list, in order.
async fn count(url: &str, data: &str, name: &str, sections: u32) -> Result<()> {
    let locks = leasehold::Client::connect(url).await?;
    let mut redis = redis::Client::open(data)?
        .get_multiplexed_async_connection()
        .await?;
    let mutex = locks.mutex(name).ttl(Duration::from_secs(10));
    let me = std::process::id().to_string();
    for _ in 0..sections {
        let guard = mutex.lock().await?;
        section(&mut redis, &me, guard.fence()).await?;
        guard.release().await?;
    }
    Ok(())
}

/// One critical section on the shared data: marks it occupied (counting an overlap when another process already
/// did), records the fence, and increments the counter non-atomically (read, yield, write), so that two holders at
/// once lose an increment.
async fn section(
    redis: &mut redis::aio::MultiplexedConnection,
    me: &str,
    fence: leasehold::Fence,
) -> Result<()> {
    let entered: bool = redis::cmd("SET")
        .arg("test:occupant")
        .arg(me)
        .arg("NX")
        .query_async::<Option<String>>(&mut *redis)
        .await?
        .is_some();
    if !entered {
        let _: i64 = redis.incr("test:overlaps", 1).await?;
    }
    let value: i64 = redis
        .get::<_, Option<i64>>("test:counter")
        .await?
        .unwrap_or(0);
    let _: i64 = redis.rpush("test:fences", fence.get()).await?;
    tokio::task::yield_now().await;
    let _: () = redis.set("test:counter", value + 1).await?;
    if entered {
        let _: i64 = redis.del("test:occupant").await?;
    }
    Ok(())
}

async fn quorum_count(urls: &str, data: &str, name: &str, sections: u32) -> Result<()> {
    let quorum = leasehold::Quorum::connect(urls.split(',')).await?;
    let mut redis = redis::Client::open(data)?
        .get_multiplexed_async_connection()
        .await?;
    let mutex = quorum.mutex(name).ttl(Duration::from_secs(10));
    let me = std::process::id().to_string();
    for _ in 0..sections {
        let guard = mutex.lock_timeout(Duration::from_secs(60)).await?;
        section(&mut redis, &me, guard.fence()).await?;
        guard.release().await?;
    }
    Ok(())
}

/// A waiter that gives up: what a program does whose wait times out and which then ends, calling `flush_releases` on
/// its way out as the docs ask.
async fn give_up(url: &str, prefix: &str, name: &str, ttl_ms: u64, wait_ms: u64) -> Result<()> {
    let mut builder = leasehold::Client::builder(url)?.prefix(prefix);
    if !url.starts_with("redis") && !url.starts_with("unix") {
        builder = builder.session_ttl(Duration::from_millis(ttl_ms));
    }
    let locks = builder.connect().await?;
    match locks
        .mutex(name)
        .lock_timeout(Duration::from_millis(wait_ms))
        .await
    {
        Err(e) if e.is_timeout() => println!("gave up"),
        Err(e) => return Err(e.into()),
        Ok(_) => return Err("granted while the test holds the lock".into()),
    }
    if !locks.flush_releases(Duration::from_secs(10)).await {
        return Err("the background releases were not answered within 10 s".into());
    }
    Ok(())
}

async fn hold(url: &str, name: &str, ttl_ms: u64, then_write: bool) -> Result<()> {
    // On a store with sessions the lease is the session's: TTL_MS sets it (whole seconds on etcd).
    let locks = if url.starts_with("redis") || url.starts_with("unix") {
        leasehold::Client::connect(url).await?
    } else {
        leasehold::Client::builder(url)?
            .session_ttl(Duration::from_millis(ttl_ms))
            .connect()
            .await?
    };
    let guard = locks
        .mutex(name)
        .ttl(Duration::from_millis(ttl_ms))
        .lock()
        .await?;
    println!("acquired {}", guard.fence());
    std::io::stdout().flush()?;
    if !then_write {
        std::future::pending::<()>().await;
    }
    // The test pauses us here (SIGSTOP) past the lease, lets another owner take over, resumes us and writes a line.
    let mut line = String::new();
    tokio::task::spawn_blocking(move || std::io::stdin().lock().read_line(&mut line)).await??;
    println!("held={}", guard.is_held());
    if !url.starts_with("redis") && !url.starts_with("unix") {
        let written = sql_fenced_write(url, &guard).await?;
        println!("write={}", u8::from(written));
        std::io::stdout().flush()?;
        return Ok(());
    }
    let mut store = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let written: i64 = redis::Script::new(FENCED_WRITE)
        .key("test:record")
        .arg(guard.fence().get())
        .arg("stale-writer")
        .invoke_async(&mut store)
        .await?;
    println!("write={written}");
    std::io::stdout().flush()?;
    drop(guard);
    Ok(())
}

/// A fenced transaction on the SQL database of `url` (the lock's own), inserting `stale-writer` into `fenced_writes`:
/// whether it committed. Any refusal of the commit counts as not written.
async fn sql_fenced_write(url: &str, guard: &leasehold::Guard) -> Result<bool> {
    if url.starts_with("postgres") {
        use leasehold::tokio_postgres;
        let (mut db, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        let tx = db.transaction().await?;
        tx.execute(
            "INSERT INTO fenced_writes (writer) VALUES ('stale-writer')",
            &[],
        )
        .await?;
        return Ok(guard.commit_postgres(tx).await.is_ok());
    }
    use leasehold::mysql_async::prelude::Queryable;
    let url = url.replacen("mariadb://", "mysql://", 1);
    let pool = leasehold::mysql_async::Pool::new(url.as_str());
    let mut db = pool.get_conn().await?;
    let mut tx = db
        .start_transaction(leasehold::mysql_async::TxOpts::default())
        .await?;
    tx.query_drop("INSERT INTO fenced_writes (writer) VALUES ('stale-writer')")
        .await?;
    Ok(guard.commit_mysql(tx).await.is_ok())
}

/// Increments `test:inside` and keeps its maximum in `test:max`.
const ENTER: &str = r"
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
return n
";

async fn store(url: &str) -> Result<redis::aio::MultiplexedConnection> {
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?)
}

async fn fair_wait(url: &str, name: &str, tasks: usize) -> Result<()> {
    let locks = leasehold::Client::connect(url).await?;
    let pid = std::process::id();
    let mut handles = Vec::new();
    for i in 0..tasks {
        let fair = locks.fair_mutex(name).describe(format!("{pid}-{i}"));
        let mut redis = store(url).await?;
        handles.push(tokio::spawn(async move {
            let guard = fair.lock().await?;
            let _: i64 = redis.rpush("test:grants", format!("{pid}-{i}")).await?;
            guard.release().await?;
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for handle in handles {
        handle.await?.map_err(|e| e.to_string())?;
    }
    Ok(())
}

async fn sem_count(url: &str, name: &str, permits: u64, sections: u32) -> Result<()> {
    let locks = leasehold::Client::connect(url).await?;
    let mut redis = store(url).await?;
    let enter = redis::Script::new(ENTER);
    let semaphore = locks.semaphore(name, permits).ttl(Duration::from_secs(10));
    for _ in 0..sections {
        let permit = semaphore.acquire().await?;
        let _: i64 = enter
            .key("test:inside")
            .key("test:max")
            .invoke_async(&mut redis)
            .await?;
        tokio::time::sleep(Duration::from_millis(2)).await;
        let _: i64 = redis.decr("test:inside", 1).await?;
        permit.release().await?;
    }
    Ok(())
}

async fn rw_mix(url: &str, name: &str, sections: u32) -> Result<()> {
    let locks = leasehold::Client::connect(url).await?;
    let mut redis = store(url).await?;
    let enter = redis::Script::new(ENTER);
    let rw = locks.rw_lock(name).ttl(Duration::from_secs(10));
    for i in 0..sections {
        if i % 10 == 0 {
            let guard = rw.write().await?;
            let alone: bool = redis::cmd("SET")
                .arg("test:writer")
                .arg(1)
                .arg("NX")
                .query_async::<Option<String>>(&mut redis)
                .await?
                .is_some();
            let readers: i64 = redis
                .get::<_, Option<i64>>("test:inside")
                .await?
                .unwrap_or(0);
            if !alone || readers != 0 {
                let _: i64 = redis.incr("test:overlaps", 1).await?;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
            let _: i64 = redis.del("test:writer").await?;
            guard.release().await?;
        } else {
            let guard = rw.read().await?;
            let _: i64 = enter
                .key("test:inside")
                .key("test:max")
                .invoke_async(&mut redis)
                .await?;
            if redis.exists::<_, bool>("test:writer").await? {
                let _: i64 = redis.incr("test:overlaps", 1).await?;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
            let _: i64 = redis.decr("test:inside", 1).await?;
            guard.release().await?;
        }
    }
    Ok(())
}

async fn read_loop(url: &str, name: &str) -> Result<()> {
    let locks = leasehold::Client::connect(url).await?;
    let rw = locks.rw_lock(name);
    let mut first = true;
    loop {
        let guard = rw.read().await?;
        if first {
            println!("reading");
            std::io::stdout().flush()?;
            first = false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        guard.release().await?;
    }
}

async fn kind_hold(url: &str, name: &str, kind: &str, ttl_ms: u64) -> Result<()> {
    let locks = leasehold::Client::connect(url).await?;
    let ttl = Duration::from_millis(ttl_ms);
    let guard = match kind {
        "read" => locks.rw_lock(name).ttl(ttl).read().await?,
        "write" => locks.rw_lock(name).ttl(ttl).write().await?.into_guard(),
        _ => match kind.strip_prefix("permits:").and_then(|n| n.parse().ok()) {
            Some(permits) => locks.semaphore(name, permits).ttl(ttl).acquire().await?,
            None => return Err(format!("unknown kind {kind:?}").into()),
        },
    };
    println!("acquired {}", guard.fence());
    std::io::stdout().flush()?;
    std::future::pending::<()>().await;
    Ok(())
}
