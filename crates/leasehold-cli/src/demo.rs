//! `leasehold demo`: the oversell problem and its cure, end to end, in one command.
//!
//! A stock of [`STOCK`] units lives in Redis as a plain key. [`BUYERS`] buyer processes (`leasehold demo-buyer`, see
//! [`buyer`]) each loop: read the stock, stop at 0, pause a moment, write back what they read minus one and record
//! a sale. Every run shows the same numbers: round 1's buyers meet after each read, and round 2's stalling buyer is
//! stopped by a signal and resumed only when the others are done. Four rounds, one per [`Round`], each from a fresh stock; the demo starts the buyers, lets them go at
//! the same instant (or the stalling buyer first, so that it is the one holding the lock), shows progress, and
//! reads the outcome from Redis.

pub mod buyer;
mod report;

use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use leasehold::redis::aio::MultiplexedConnection;
use leasehold::redis::{self, AsyncCommands as _};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines};
use tokio::process::{Child, ChildStdout};
use tokio::time::Instant;

use crate::args::STORE_ENV;
use crate::connect;
use crate::exit::{self, fail};
use crate::progress::Bar;
use crate::server::{PrivateServer, StartError};
use crate::signals::{self, Signals};

/// Units in stock at the start of every round.
pub const STOCK: i64 = 100;
/// Buyer processes per round.
pub const BUYERS: u32 = 8;
/// The longest a round may take before the demo gives up.
const ROUND_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest a buyer may take to start and connect.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the progress bar reads the stock.
const PROGRESS_EVERY: Duration = Duration::from_millis(50);

/// The four rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Round {
    /// No lock at all.
    NoLock,
    /// `SET lock NX PX ttl` … `DEL lock`: no owner check, no renewal; one buyer stalls past the TTL.
    Textbook,
    /// A leasehold mutex.
    Leasehold,
    /// A leasehold mutex, a store that checks fences, and one buyer that freezes past its lease.
    Fenced,
}

impl Round {
    const ALL: [Round; 4] = [
        Round::NoLock,
        Round::Textbook,
        Round::Leasehold,
        Round::Fenced,
    ];

    fn number(self) -> usize {
        self as usize + 1
    }

    fn title(self) -> &'static str {
        match self {
            Round::NoLock => "no lock",
            Round::Textbook => "textbook lock",
            Round::Leasehold => "leasehold",
            Round::Fenced => "leasehold + fenced store",
        }
    }

    fn has_staller(self) -> bool {
        matches!(self, Round::Textbook | Round::Fenced)
    }

    fn arg(self) -> &'static str {
        match self {
            Round::NoLock => "no-lock",
            Round::Textbook => "textbook",
            Round::Leasehold => "leasehold",
            Round::Fenced => "fenced",
        }
    }
}

/// The Redis names of one demo run; the prefix holds our pid so that runs sharing a server do not collide.
#[derive(Debug)]
pub struct Keys {
    prefix: String,
    stock: String,
    sold: String,
    stale: String,
    store_fence: String,
    textbook_lock: String,
    foreign: String,
    /// The name of the leasehold mutex of rounds 3 and 4.
    lock_name: String,
}

impl Keys {
    fn new(prefix: &str) -> Keys {
        let key = |what: &str| format!("{prefix}:{what}");
        Keys {
            prefix: prefix.to_owned(),
            stock: key("stock"),
            sold: key("sold"),
            stale: key("stale"),
            store_fence: key("store-fence"),
            textbook_lock: key("textbook-lock"),
            foreign: key("foreign-deletes"),
            lock_name: key("stock"),
        }
    }

    /// Every key a run writes, the leasehold mutex's own keys included.
    fn all(&self) -> Vec<String> {
        let mut all = vec![
            self.stock.clone(),
            self.sold.clone(),
            self.stale.clone(),
            self.store_fence.clone(),
            self.textbook_lock.clone(),
            self.foreign.clone(),
        ];
        // The name is ours and valid; were it not, there would be no leasehold keys to delete either.
        if let Ok(lock) = leasehold::lock_keys(leasehold::DEFAULT_PREFIX, &self.lock_name) {
            all.extend(lock);
        }
        all
    }
}

/// What one round ended with.
#[derive(Debug, Clone)]
pub struct Outcome {
    round: Round,
    sold: i64,
    stock: i64,
    /// Round 4 only.
    stale_rejected: Option<i64>,
    /// Round 2 only: blind deletes that removed another buyer's lock.
    foreign_deletes: Option<i64>,
    elapsed: Duration,
}

impl Outcome {
    fn oversold(&self) -> i64 {
        (self.sold - STOCK).max(0)
    }
}

/// `leasehold demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Use this Redis server instead of starting a private one (also --redis; env LEASEHOLD_STORE, or
    /// LEASEHOLD_REDIS_URL). Redis only: an etcd://, zk://, postgres:// or mysql:// store exits 2 before connecting.
    #[arg(long = "store", visible_alias = "redis", value_name = "URL", env = STORE_ENV)]
    pub store: Option<String>,

    /// Print the results as one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `leasehold demo`. SIGINT, SIGTERM and SIGHUP stop it, and the private server and the buyers go with it.
///
/// # Errors
///
/// 69 when `redis-server` is missing or Redis cannot be reached; others as they come.
pub async fn demo(args: DemoArgs) -> anyhow::Result<u8> {
    crate::stores::check_demo(args.store.as_deref())?;
    let mut signals = Signals::catch()?;
    tokio::select! {
        biased;
        // Returning drops the demo future: buyers are killed on drop, the private server too.
        sig = signals.recv() => {
            exit::print_err(&format!("\nleasehold: demo interrupted by {sig}; stopped its buyers and its redis-server"));
            Ok(signals::exit_code(sig))
        }
        result = play_all(args) => result,
    }
}

async fn play_all(args: DemoArgs) -> anyhow::Result<u8> {
    let server = match &args.store {
        Some(_) => None,
        None => Some(PrivateServer::start().map_err(|err| match err {
            StartError::NotInstalled | StartError::Failed(_) => {
                fail(exit::UNAVAILABLE, err.to_string())
            }
        })?),
    };
    let url = match (&args.store, &server) {
        (Some(url), _) => url.clone(),
        (None, Some(server)) => server.url(),
        (None, None) => unreachable!("a server was started when no URL was given"),
    };
    let mut store = connect::plain(&url).await?;
    if !args.json {
        intro(server.as_ref(), &url);
    }
    let keys = Keys::new(&format!("leasehold-demo:{}", std::process::id()));
    let exe =
        std::env::current_exe().context("cannot find the leasehold executable to start buyers")?;
    let mut outcomes = Vec::new();
    let mut failure = None;
    for round in Round::ALL {
        match play(round, &exe, &url, &keys, &mut store, !args.json).await {
            Ok(outcome) => outcomes.push(outcome),
            Err(err) => {
                failure = Some(err);
                break;
            }
        }
    }
    // The demo's keys go whatever happened; on a private server they would go with it anyway.
    let _: redis::RedisResult<i64> = store.del(keys.all()).await;
    let shown = report::Shown {
        server: server.as_ref().map(|s| (s.pid(), s.port())),
        outcomes,
    };
    drop(server);
    if let Some(err) = failure {
        return Err(err);
    }
    let text = if args.json {
        report::json(&shown)
    } else {
        report::table(&shown)
    };
    exit::print_out(&text);
    Ok(0)
}

fn intro(server: Option<&PrivateServer>, url: &str) {
    let mut text = format!(
        "{STOCK} units in stock, {BUYERS} buyer processes; each reads the stock, pauses {}, writes back what it \
         read minus one and records a sale.\n",
        crate::duration::show(buyer::PAUSE)
    );
    text.push_str(&match server {
        Some(server) => format!(
            "Redis: a private redis-server (pid {}) on 127.0.0.1:{}, removed when the demo ends.\n\n",
            server.pid(),
            server.port()
        ),
        None => format!("Redis: {} (the demo deletes its keys when done).\n\n", connect::redact(url)),
    });
    exit::print_out(&text);
}

/// One round: fresh stock, buyers started and released together, progress until they are all done.
async fn play(
    round: Round,
    exe: &std::path::Path,
    url: &str,
    keys: &Keys,
    store: &mut MultiplexedConnection,
    show_progress: bool,
) -> anyhow::Result<Outcome> {
    let _: i64 = store.del(keys.all()).await?;
    let _: () = redis::pipe()
        .set(&keys.stock, STOCK)
        .ignore()
        .set(&keys.sold, 0)
        .ignore()
        .query_async(store)
        .await?;

    let mut buyers = Vec::new();
    for i in 0..BUYERS {
        buyers.push(Buyer::start(exe, url, keys, round, i)?);
    }
    for buyer in &mut buyers {
        buyer.expect_line("ready", READY_TIMEOUT).await?;
    }
    let started = Instant::now();
    if round.has_staller() {
        // The stalling buyer goes first, so that it is the one holding the lock when it stalls.
        buyers[0].go().await?;
        buyers[0].expect_line("stalling", READY_TIMEOUT).await?;
        if round == Round::Textbook {
            buyers[0].await_stopped().await?;
        }
        for buyer in &mut buyers[1..] {
            buyer.go().await?;
        }
    } else {
        for buyer in &mut buyers {
            buyer.go().await?;
        }
    }

    let mut bar = Bar::new(
        show_progress,
        format!("round {}/4 {:<20}", round.number(), round.title()),
    );
    let all_done = async {
        // Round 2's stopped buyer is resumed when all the others have finished: the story does not depend on timing.
        for buyer in buyers.iter_mut().filter(|b| !b.stopped) {
            buyer.finish().await?;
        }
        if let Some(stopped) = buyers.iter_mut().find(|b| b.stopped) {
            stopped.resume()?;
            stopped.finish().await?;
        }
        anyhow::Ok(())
    };
    tokio::pin!(all_done);
    let deadline = tokio::time::sleep(ROUND_TIMEOUT);
    tokio::pin!(deadline);
    let mut ticks = tokio::time::interval(PROGRESS_EVERY);
    let mut watcher = store.clone();
    loop {
        tokio::select! {
            done = &mut all_done => { done?; break; }
            () = &mut deadline => anyhow::bail!(
                "round {} did not finish within {}", round.number(), crate::duration::show(ROUND_TIMEOUT)
            ),
            _ = ticks.tick(), if bar.is_shown() => {
                let (stock, sold): (Option<i64>, Option<i64>) =
                    redis::pipe().get(&keys.stock).get(&keys.sold).query_async(&mut watcher).await?;
                let (stock, sold) = (stock.unwrap_or(0), sold.unwrap_or(0));
                bar.show(STOCK - stock.clamp(0, STOCK), STOCK, &format!("stock {stock:>3}, {sold} sold"));
            }
        }
    }
    let elapsed = started.elapsed();

    let (sold, stock, stale, foreign): (Option<i64>, Option<i64>, Option<i64>, Option<i64>) =
        redis::pipe()
            .get(&keys.sold)
            .get(&keys.stock)
            .get(&keys.stale)
            .get(&keys.foreign)
            .query_async(store)
            .await?;
    let (sold, stock) = (sold.unwrap_or(0), stock.unwrap_or(0));
    bar.finish(
        STOCK - stock.clamp(0, STOCK),
        STOCK,
        &format!(
            "stock {stock:>3}, {sold} sold, {:.2}s",
            elapsed.as_secs_f64()
        ),
    );
    Ok(Outcome {
        round,
        sold,
        stock,
        stale_rejected: (round == Round::Fenced).then(|| stale.unwrap_or(0)),
        foreign_deletes: (round == Round::Textbook).then(|| foreign.unwrap_or(0)),
        elapsed,
    })
}

/// A buyer process. Killed when dropped, so that an interrupted or failed demo leaves none behind.
struct Buyer {
    number: u32,
    /// Stopped by its own SIGSTOP (round 2's staller), until [`Buyer::resume`].
    stopped: bool,
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Buyer {
    fn start(
        exe: &std::path::Path,
        url: &str,
        keys: &Keys,
        round: Round,
        number: u32,
    ) -> anyhow::Result<Buyer> {
        let mut command = tokio::process::Command::new(exe);
        command
            .arg("demo-buyer")
            .args([
                "--store",
                url,
                "--keys",
                &keys.prefix,
                "--round",
                round.arg(),
            ])
            .args(["--buyer", &number.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if number == 0 && round.has_staller() {
            command.arg("--stall");
        }
        let mut child = command.spawn().context("cannot start a buyer process")?;
        let stdout = child.stdout.take().context("buyer without stdout")?;
        Ok(Buyer {
            number,
            stopped: false,
            child,
            lines: BufReader::new(stdout).lines(),
        })
    }

    async fn expect_line(&mut self, want: &str, within: Duration) -> anyhow::Result<()> {
        let line = tokio::time::timeout(within, self.lines.next_line())
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "buyer {} did not say {want:?} within {}",
                    self.number,
                    crate::duration::show(within)
                )
            })??;
        match line {
            Some(line) if line == want => Ok(()),
            other => Err(self
                .failed(&format!("said {other:?} instead of {want:?}"))
                .await),
        }
    }

    /// Waits until the buyer has stopped itself (SIGSTOP): the kernel shows it as `T` in `/proc/PID/stat`, and
    /// nothing announces it to a parent that does not reap it, so the state is polled.
    async fn await_stopped(&mut self) -> anyhow::Result<()> {
        let pid = self.child.id().context("buyer without pid")?;
        let stat = format!("/proc/{pid}/stat");
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let text = std::fs::read_to_string(&stat).unwrap_or_default();
            // The state follows the command name, which is in parentheses.
            if text
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T'))
            {
                self.stopped = true;
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.failed("did not stop").await);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Sends SIGCONT to a stopped buyer.
    fn resume(&mut self) -> anyhow::Result<()> {
        let pid = self.child.id().context("buyer without pid")?;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid)?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT)?;
        self.stopped = false;
        Ok(())
    }

    async fn go(&mut self) -> anyhow::Result<()> {
        let mut stdin = self.child.stdin.take().context("buyer without stdin")?;
        stdin.write_all(b"go\n").await?;
        stdin.flush().await?;
        Ok(())
    }

    async fn finish(&mut self) -> anyhow::Result<()> {
        let status = self.child.wait().await?;
        if status.success() {
            Ok(())
        } else {
            Err(self.failed(&format!("exited with {status}")).await)
        }
    }

    async fn failed(&mut self, what: &str) -> anyhow::Error {
        // A failed buyer has printed its reason on stderr already; the Redis error decides our status.
        let _ = self.child.start_kill();
        fail(
            exit::UNAVAILABLE,
            format!("demo buyer {} {what}", self.number),
        )
    }
}
