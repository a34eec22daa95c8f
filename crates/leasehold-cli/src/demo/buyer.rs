//! One buyer of `leasehold demo`: an OS process of its own (`leasehold demo-buyer`, hidden), so that locks are taken by
//! different processes with their own connections, as in real life.
//!
//! Protocol with the demo on stdin/stdout: the buyer connects and prints `ready`; it starts buying when it reads
//! a line (`go`); a buyer told to stall prints `stalling` when its stall begins (in round 2 it then stops itself
//! with SIGSTOP, and the demo sends SIGCONT). It exits 0 when the stock is gone, and with a one-line error otherwise.
//! Everything it did is counted in Redis.

use std::io::{BufRead as _, Write as _};
use std::time::Duration;

use clap::Args;
use leasehold::redis::aio::MultiplexedConnection;
use leasehold::redis::{self, AsyncCommands as _};

use super::{Keys, Round};
use crate::connect;

/// Between reading the stock and writing it back: the window in which unprotected buyers collide.
pub const PAUSE: Duration = Duration::from_millis(5);
/// The textbook lock's fixed TTL (round 2): long beside a purchase (a few ms), so that only the stopped buyer
/// outlives it, even on a busy machine.
pub const TEXTBOOK_TTL: Duration = Duration::from_secs(1);
/// How long a textbook buyer waits before trying `SET NX` again: the recipe polls.
const TEXTBOOK_RETRY: Duration = Duration::from_millis(1);
/// The leasehold lease in round 4, renewed every third of it by the watchdog.
pub const FENCED_TTL: Duration = Duration::from_millis(400);
/// How long the stalling buyer of round 4 freezes with the lock: three leases.
pub const FENCED_STALL: Duration = Duration::from_millis(1200);

const FENCED_WRITE: &str = include_str!("fenced_write.lua");

/// The hidden `leasehold demo-buyer` command.
#[derive(Debug, Args)]
pub struct BuyerArgs {
    /// The Redis server.
    #[arg(long = "store", value_name = "URL")]
    pub store: String,
    /// The prefix of this demo run's keys.
    #[arg(long, value_name = "PREFIX")]
    pub keys: String,
    /// Which round.
    #[arg(long, value_enum)]
    pub round: Round,
    /// This buyer's number, stored as the textbook lock's value so that wrong deletions can be counted.
    #[arg(long, default_value_t = 0)]
    pub buyer: u32,
    /// Stall once, on the first purchase, while holding the lock.
    #[arg(long)]
    pub stall: bool,
}

/// Runs one buyer until the stock is gone.
///
/// # Errors
///
/// Redis failures, with their exit status.
pub async fn buyer(args: BuyerArgs) -> anyhow::Result<u8> {
    let keys = Keys::new(&args.keys);
    let mut store = connect::plain(&args.store).await?;
    let locks = match args.round {
        Round::Leasehold => Some(connect::client(&args.store, Some(leasehold::DEFAULT_TTL)).await?),
        Round::Fenced => Some(connect::client(&args.store, Some(FENCED_TTL)).await?),
        Round::NoLock | Round::Textbook => None,
    };
    say("ready");
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line)? == 0 {
        return Ok(0); // the demo is gone
    }
    let me = format!("buyer-{}", args.buyer);
    let mut stall = args.stall;
    let mut step = 0;
    loop {
        let bought = match (args.round, &locks) {
            (Round::NoLock, _) => unlocked(&mut store, &keys, &mut step).await?,
            (Round::Textbook, _) => textbook(&mut store, &keys, &me, &mut stall).await?,
            (Round::Leasehold, Some(locks)) => {
                let mutex = locks.mutex(&keys.lock_name);
                locked(&mut store, &keys, &mutex, false, &mut false).await?
            }
            (Round::Fenced, Some(locks)) => {
                let mutex = locks.mutex(&keys.lock_name).ttl(FENCED_TTL);
                locked(&mut store, &keys, &mutex, true, &mut stall).await?
            }
            (Round::Leasehold | Round::Fenced, None) => {
                unreachable!("leasehold rounds connect a lock client")
            }
        };
        if !bought {
            return Ok(0);
        }
    }
}

/// Round 1: read, pause, write. Returns false once the stock is gone.
///
/// The buyers of a step meet after their reads (see [`meet`]): every purchase of the step starts together, as a
/// flash sale's requests do, and every run loses the same updates. The lost updates themselves are real: eight
/// processes write back the stock they read, each unaware of the others.
async fn unlocked(
    store: &mut MultiplexedConnection,
    keys: &Keys,
    step: &mut u64,
) -> anyhow::Result<bool> {
    let stock: i64 = store.get(&keys.stock).await?;
    meet(store, keys, *step).await?;
    *step += 1;
    if stock <= 0 {
        return Ok(false);
    }
    tokio::time::sleep(PAUSE).await;
    sell(store, keys, stock).await?;
    Ok(true)
}

/// How long the buyers of round 1 wait for each other at one step before giving up.
const MEET_TIMEOUT: Duration = Duration::from_secs(30);

/// Waits until all [`BUYERS`](super::BUYERS) buyers have reached step `step`: each counts itself in; the last one
/// puts a ticket per buyer on the step's list, and each takes one. Both keys are gone once the step is passed (the
/// count deleted by the last buyer, the list emptied), and expire anyway should a buyer die on the way.
async fn meet(store: &mut MultiplexedConnection, keys: &Keys, step: u64) -> anyhow::Result<()> {
    let count = format!("{}:meet:{step}", keys.prefix);
    let tickets = format!("{}:go:{step}", keys.prefix);
    let expiry = i64::try_from(MEET_TIMEOUT.as_secs()).unwrap_or(i64::MAX);
    let (arrived,): (u32,) = redis::pipe()
        .incr(&count, 1)
        .expire(&count, expiry)
        .ignore()
        .query_async(store)
        .await?;
    if arrived == super::BUYERS {
        let _: () = redis::pipe()
            .del(&count)
            .ignore()
            .rpush(&tickets, vec![1; super::BUYERS as usize])
            .ignore()
            .expire(&tickets, expiry)
            .ignore()
            .query_async(store)
            .await?;
    }
    // Short blocking pops: the connection's response timeout (5s) must not cut one.
    let deadline = tokio::time::Instant::now() + MEET_TIMEOUT;
    while tokio::time::Instant::now() < deadline {
        let ticket: Option<(String, String)> = redis::cmd("BLPOP")
            .arg(&tickets)
            .arg(2)
            .query_async(store)
            .await?;
        if ticket.is_some() {
            return Ok(());
        }
    }
    anyhow::bail!(
        "the other buyers did not reach step {step} within {}",
        crate::duration::show(MEET_TIMEOUT)
    )
}

/// Round 2: the textbook recipe. `SET lock me NX PX ttl` (polled), read, pause, write, then a blind delete: no
/// owner check, no renewal. The value is only read back to count deletions of someone else's lock.
async fn textbook(
    store: &mut MultiplexedConnection,
    keys: &Keys,
    me: &str,
    stall: &mut bool,
) -> anyhow::Result<bool> {
    let ttl_ms = u64::try_from(TEXTBOOK_TTL.as_millis()).unwrap_or(u64::MAX);
    loop {
        let taken: Option<String> = redis::cmd("SET")
            .arg(&keys.textbook_lock)
            .arg(me)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .query_async(store)
            .await?;
        if taken.is_some() {
            break;
        }
        tokio::time::sleep(TEXTBOOK_RETRY).await;
    }
    let stock: i64 = store.get(&keys.stock).await?;
    if stock > 0 {
        if std::mem::take(stall) {
            say("stalling");
            // Stopped by a real signal while it believes it holds the lock, as a GC pause or a VM freeze stops a
            // process. The demo sends SIGCONT once the others are done: the lock expired in Redis meanwhile, and the
            // same interleaving happens on every run, so the demo shows the same numbers every time.
            nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP)?;
        } else {
            tokio::time::sleep(PAUSE).await;
        }
        sell(store, keys, stock).await?;
    }
    // GETDEL deletes exactly as blindly as DEL; it only lets the demo see whose lock went.
    let deleted: Option<String> = redis::cmd("GETDEL")
        .arg(&keys.textbook_lock)
        .query_async(store)
        .await?;
    if deleted.is_some_and(|owner| owner != me) {
        let _: i64 = store.incr(&keys.foreign, 1).await?;
    }
    Ok(stock > 0)
}

/// Rounds 3 and 4: under a leasehold mutex. In round 4 every write goes through the store's fenced write, and a
/// buyer told to stall freezes (the whole process, lease keeper included) between its check and its write.
async fn locked(
    store: &mut MultiplexedConnection,
    keys: &Keys,
    mutex: &leasehold::Mutex,
    fenced: bool,
    stall: &mut bool,
) -> anyhow::Result<bool> {
    let guard = mutex.lock().await?;
    let stock: i64 = store.get(&keys.stock).await?;
    if stock <= 0 {
        guard.release().await?;
        return Ok(false);
    }
    if std::mem::take(stall) && guard.is_held() {
        say("stalling");
        // A blocking sleep on the current-thread runtime stops everything, the lease keeper too: this is a
        // GC pause or a SIGSTOP, not a polite await.
        std::thread::sleep(FENCED_STALL);
    } else {
        tokio::time::sleep(PAUSE).await;
    }
    if fenced {
        let written: i64 = redis::Script::new(FENCED_WRITE)
            .key(&keys.stock)
            .key(&keys.sold)
            .key(&keys.store_fence)
            .arg(guard.fence().get())
            .arg(stock - 1)
            .invoke_async(store)
            .await?;
        if written == 0 {
            let _: i64 = store.incr(&keys.stale, 1).await?;
        }
    } else {
        sell(store, keys, stock).await?;
    }
    match guard.release().await {
        // The stalled buyer's lease ended during its freeze; its write was refused above.
        Ok(()) | Err(leasehold::Error::NotOwner { .. } | leasehold::Error::LeaseLost { .. }) => {
            Ok(true)
        }
        Err(err) => Err(err.into()),
    }
}

/// The sale without a fence: stock := what was read - 1, and one more unit sold.
async fn sell(store: &mut MultiplexedConnection, keys: &Keys, read: i64) -> anyhow::Result<()> {
    let _: () = redis::pipe()
        .atomic()
        .set(&keys.stock, read - 1)
        .ignore()
        .incr(&keys.sold, 1)
        .ignore()
        .query_async(store)
        .await?;
    Ok(())
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
