//! A worker process for leasehold's multi-process tests. Each mode is one role a test needs a real OS process for.
//!
//! ```text
//! leasehold-worker count URL NAME SECTIONS        # SECTIONS critical sections: a non-atomic counter increment
//! leasehold-worker hold URL NAME TTL_MS           # acquire, print "acquired FENCE", then hold until killed
//! leasehold-worker hold-then-write URL NAME TTL_MS  # acquire, print "acquired FENCE", wait for a stdin line,
//!                                             # then print "held=BOOL" and try a fenced write: "write=0|1"
//! leasehold-worker drop-at-end URL NAME current|multi  # acquire (30 s lease), print "acquired FENCE", and let `main`
//!                                             # return with the guard still alive, as user code does
//! leasehold-worker script-source NAME             # print a script as the library loads it (scripts/profile-server.sh)
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
        let guard = locks.mutex(name).lock().await?;
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
            Ok(n) => count(url, name, n).await,
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
    eprintln!("usage: leasehold-worker count|hold|hold-then-write|drop-at-end URL NAME N|FLAVOR");
    ExitCode::from(2)
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Critical sections that would corrupt the counter without mutual exclusion: read, yield, write. An occupancy
/// marker set with NX on entry detects any overlap; every section appends its fence to a list, in order.
async fn count(url: &str, name: &str, sections: u32) -> Result<()> {
    let locks = leasehold::Client::connect(url).await?;
    let mut redis = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let mutex = locks.mutex(name).ttl(Duration::from_secs(10));
    let me = std::process::id().to_string();
    for _ in 0..sections {
        let guard = mutex.lock().await?;
        let entered: bool = redis::cmd("SET")
            .arg("test:occupant")
            .arg(&me)
            .arg("NX")
            .query_async::<Option<String>>(&mut redis)
            .await?
            .is_some();
        if !entered {
            let _: i64 = redis.incr("test:overlaps", 1).await?;
        }
        let value: i64 = redis
            .get::<_, Option<i64>>("test:counter")
            .await?
            .unwrap_or(0);
        let _: i64 = redis.rpush("test:fences", guard.fence().get()).await?;
        tokio::task::yield_now().await;
        let _: () = redis.set("test:counter", value + 1).await?;
        if entered {
            let _: i64 = redis.del("test:occupant").await?;
        }
        guard.release().await?;
    }
    Ok(())
}

async fn hold(url: &str, name: &str, ttl_ms: u64, then_write: bool) -> Result<()> {
    let locks = leasehold::Client::connect(url).await?;
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
