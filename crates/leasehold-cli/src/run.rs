//! `leasehold run`: take the lock, run the program while the lease is kept alive, stop the program the moment the
//! lease is lost, release the lock when the program exits.

use std::ffi::OsString;

use std::time::Duration;

use leasehold::{Error, Guard, LockKind};
use nix::sys::signal::Signal;
use tokio::time::Instant;

use crate::args::RunArgs;
use crate::child::{self, Event, Program, Termination};
use crate::connect;
use crate::duration::show;
use crate::enforce::Enforcer;
use crate::exit::{self, fail, print_err};
use crate::schedule::Schedule;
use crate::signals::{self, Signals};

/// Runs `leasehold run` and returns the exit status.
///
/// # Errors
///
/// Every failure before the program starts, each carrying its exit status (see [`crate::exit`]).
pub async fn run(args: RunArgs) -> anyhow::Result<u8> {
    // What a store with sessions (etcd, ZooKeeper, PostgreSQL, MySQL/MariaDB) cannot honour is refused before anything connects, and so is a lease too short for
    // --kill-after.
    crate::stores::check_run(&args)?;
    Schedule::of(&args)?;
    check_also(&args)?;
    // Caught from the start: a signal while we wait must not leave a grant behind, and one that arrives while the
    // program starts must reach the program.
    let mut signals = Signals::catch()?;
    let name = args.name.as_str();
    if args.store.urls.len() > 1 {
        return run_on_quorum(&args, &mut signals).await;
    }
    let client = tokio::select! {
        client = connect::locks(&args.store, Some(args.ttl)) => client?,
        sig = signals.recv() => return Err(interrupted(sig, name)),
    };
    let result = run_with(&args, &client, &mut signals).await;
    // Every way out, also an interrupted acquire whose grant may have landed after we gave up on it, closes the
    // client (bounded): the session ends on the server with every entry it still has (a wait given up included), and
    // the releases left running in the background are answered; the runtime ends right after.
    // Said only on a way out that has not already reported the trouble: a failed release of the program's own grant
    // was, and so was Redis being out of reach (the releases of attempts lost in that outage may stay unconfirmed).
    let reported = match &result {
        Ok(_) => true,
        Err(err) => exit::code_of(err) == exit::UNAVAILABLE,
    };
    if !client.close(RELEASE_FLUSH).await && !reported {
        print_err(&format!(
            "leasehold: warning: a release of lock {name:?} was not confirmed within {}; {}",
            show(RELEASE_FLUSH),
            crate::stores::expiry(crate::stores::Store::of_all(&args.store.urls), args.ttl)
        ));
    }
    result
}

/// How long `acquire` may wait: try once (`--nonblock`, `--wait 0`), until a deadline (`--wait`), or without limit.
#[derive(Debug, Clone, Copy)]
enum Wait {
    Once,
    Until(Instant, Duration),
    Forever,
}

impl Wait {
    fn of(args: &RunArgs) -> Wait {
        match args.wait {
            _ if args.nonblock => Wait::Once,
            Some(Duration::ZERO) => Wait::Once,
            Some(wait) => Wait::Until(Instant::now() + wait, wait),
            None => Wait::Forever,
        }
    }

    /// What is left of the wait: `Some(None)` without limit, `None` when it is over (try once more, then stop).
    fn remaining(self) -> Option<Option<Duration>> {
        match self {
            Wait::Once => None,
            Wait::Until(deadline, _) => {
                let left = deadline.saturating_duration_since(Instant::now());
                (!left.is_zero()).then_some(Some(left))
            }
            Wait::Forever => Some(None),
        }
    }

    /// A `Timeout` from a part of the wait, said as the whole wait (`--wait 5` waited 5s, not its last 2s); so is a
    /// `Busy` from the last try after the deadline.
    fn whole(self, err: Error) -> Error {
        match (self, err) {
            (Wait::Until(_, wait), Error::Timeout { name, .. } | Error::Busy { name, .. }) => {
                Error::Timeout { name, waited: wait }
            }
            (_, err) => err,
        }
    }
}

/// Takes NAME as the lock kind the options ask for: tries once (`--nonblock`, `--wait 0`), waits at most `--wait`, or
/// waits as long as it takes.
///
/// A plain run and `--shared`/`--exclusive` runs may share a name, as `flock` users expect (see [`plain`] and
/// [`read_write`]). `--fair` and `--permits` have no `flock` counterpart and keep a name to their own kind.
async fn acquire(
    args: &RunArgs,
    client: &leasehold::Client,
    description: String,
) -> Result<leasehold::Guard, Error> {
    let name = args.name.as_str();
    let wait = Wait::of(args);
    if let Some(permits) = args.permits {
        let semaphore = client
            .semaphore(name, permits)
            .ttl(args.ttl)
            .describe(description);
        return match wait.remaining() {
            None => semaphore.try_acquire().await,
            Some(Some(left)) => semaphore.acquire_timeout(left).await,
            Some(None) => semaphore.acquire().await,
        };
    }
    if args.fair {
        let fair = client.fair_mutex(name).ttl(args.ttl).describe(description);
        return match wait.remaining() {
            None => fair.try_lock().await,
            Some(Some(left)) => fair.lock_timeout(left).await,
            Some(None) => fair.lock().await,
        };
    }
    let mutex = client
        .mutex(name)
        .ttl(args.ttl)
        .describe(description.clone());
    let rw = client.rw_lock(name).ttl(args.ttl).describe(description);
    let result = if args.shared || args.exclusive {
        read_write(&rw, &mutex, args.shared, wait).await
    } else {
        plain(&rw, &mutex, wait).await
    };
    result.map_err(|err| wait.whole(err))
}

/// Takes NAME as [`acquire`] does, or, with `--value`, campaigns in the election NAME: the grant, and the term's
/// number when it is one.
async fn acquire_or_campaign(
    args: &RunArgs,
    client: &leasehold::Client,
    description: String,
) -> Result<(leasehold::Guard, Option<u64>), Error> {
    let Some(value) = &args.value else {
        return acquire(args, client, description)
            .await
            .map(|guard| (guard, None));
    };
    let wait = Wait::of(args);
    let election = client
        .election(&args.name)
        .ttl(args.ttl)
        .describe(description);
    let term = match wait.remaining() {
        None => election.try_campaign(value.as_str()).await,
        Some(Some(left)) => election.campaign_timeout(value.as_str(), left).await,
        Some(None) => election.campaign(value.as_str()).await,
    };
    term.map(|term| {
        let number = term.term();
        (term.into_guard(), Some(number))
    })
    .map_err(|err| wait.whole(err))
}

/// A plain run: NAME's mutex, so that it keeps excluding the library's `Mutex` users and older versions of this
/// command. When NAME is a read-write lock (`--shared`/`--exclusive` runs hold it or wait for it), the plain run
/// takes its write lock instead, with what is left of the wait, as `flock`'s default `-x` would.
async fn plain(
    rw: &leasehold::RwLock,
    mutex: &leasehold::Mutex,
    wait: Wait,
) -> Result<Guard, Error> {
    match take_mutex(mutex, wait).await {
        Err(Error::WrongKind {
            found: LockKind::ReadWrite,
            ..
        }) => write(rw, wait).await,
        other => other,
    }
}

/// An `--shared`/`--exclusive` run. When a plain run holds NAME as a mutex, it waits for that mutex by taking it (the
/// mutex's own queue, with what is left of the wait), gives it back at once and asks for the read-write lock again,
/// until granted or the wait runs out.
///
/// Exclusion is never at risk: Redis keeps one lock kind under a name at a time, and a kind is only granted on a free
/// name or beside its own kind, so a mutex holder and a read-write holder never hold NAME together. The short mutex
/// grant taken here only ever stands where no other holder is. Once a read-write run holds NAME, later plain runs
/// queue on its write lock (see [`plain`]), so the name settles on the read-write lock and this loop ends.
async fn read_write(
    rw: &leasehold::RwLock,
    mutex: &leasehold::Mutex,
    shared: bool,
    wait: Wait,
) -> Result<Guard, Error> {
    share_after_mutexes(
        || async move {
            if shared {
                read(rw, wait).await
            } else {
                write(rw, wait).await
            }
        },
        || take_mutex(mutex, wait),
        Guard::release,
    )
    .await
}

/// The loop of [`read_write`], for one server and for a quorum: asks for the share; while a mutex holds NAME, takes
/// that mutex (waiting in its queue) and gives it back at once, then asks again.
async fn share_after_mutexes<G, M, S, T, R>(
    share: impl Fn() -> S,
    take_mutex: impl Fn() -> T,
    release: impl Fn(M) -> R,
) -> Result<G, Error>
where
    S: std::future::Future<Output = Result<G, Error>>,
    T: std::future::Future<Output = Result<M, Error>>,
    R: std::future::Future<Output = Result<(), Error>>,
{
    loop {
        match share().await {
            Err(Error::WrongKind {
                found: LockKind::Mutex,
                ..
            }) => {}
            other => return other,
        }
        match take_mutex().await {
            // Released before the read-write lock is asked for; a failed release only leaves a lease to expire.
            Ok(guard) => {
                let _ = release(guard).await;
            }
            // The name became a read-write lock meanwhile: ask again at once.
            Err(Error::WrongKind {
                found: LockKind::ReadWrite,
                ..
            }) => {}
            Err(err) => return Err(err),
        }
    }
}

async fn take_mutex(mutex: &leasehold::Mutex, wait: Wait) -> Result<Guard, Error> {
    match wait.remaining() {
        None => mutex.try_lock().await,
        Some(Some(left)) => mutex.lock_timeout(left).await,
        Some(None) => mutex.lock().await,
    }
}

async fn write(rw: &leasehold::RwLock, wait: Wait) -> Result<Guard, Error> {
    let guard = match wait.remaining() {
        None => rw.try_write().await,
        Some(Some(left)) => rw.write_timeout(left).await,
        Some(None) => rw.write().await,
    };
    guard.map(leasehold::WriteGuard::into_guard)
}

async fn read(rw: &leasehold::RwLock, wait: Wait) -> Result<Guard, Error> {
    match wait.remaining() {
        None => rw.try_read().await,
        Some(Some(left)) => rw.read_timeout(left).await,
        Some(None) => rw.read().await,
    }
}

/// How long the command waits, on its way out, for releases still running in the background.
const RELEASE_FLUSH: std::time::Duration = std::time::Duration::from_secs(2);

/// Takes the lock, runs the program, releases the lock: everything after connecting.
async fn run_with(
    args: &RunArgs,
    client: &leasehold::Client,
    signals: &mut Signals,
) -> anyhow::Result<u8> {
    let name = args.name.as_str();
    if !args.also.is_empty() {
        return run_set(args, client, signals).await;
    }
    if let Some(code) = nested(args, client, signals).await? {
        return Ok(code);
    }
    let description = crate::holder::description(&args.command);
    let acquired = tokio::select! {
        acquired = acquire_or_campaign(args, client, description) => acquired,
        // Dropping the acquire future releases a grant that may have landed (the library's cancel safety).
        sig = signals.recv() => return Err(interrupted(sig, name)),
    };
    match acquired {
        Ok((guard, term)) => supervise(args, Held::One(guard), term, signals).await,
        Err(err) => Err(refused(args, client, err).await),
    }
}

/// A run with `--also`: NAME and every `--also` name as one set, then the same supervision.
async fn run_set(
    args: &RunArgs,
    client: &leasehold::Client,
    signals: &mut Signals,
) -> anyhow::Result<u8> {
    for name in names(args) {
        if outer_hold(client, name).await.is_some() {
            return Err(fail(
                exit::NOT_A_LOCK,
                format!(
                    "cannot nest a run with --also in the run that holds lock {name:?} around it: the set would \
                     wait for the outer grant itself"
                ),
            ));
        }
    }
    let description = crate::holder::description(&args.command);
    let acquired = tokio::select! {
        acquired = acquire_set(args, client, description) => acquired,
        // Dropping the acquire future releases the members already taken (the library's cancel safety).
        sig = signals.recv() => return Err(interrupted(sig, &args.name)),
    };
    match acquired {
        Ok(guard) => supervise(args, Held::Set(guard), None, signals).await,
        Err(err) => Err(refused(args, client, err).await),
    }
}

/// The error of an acquisition that failed, for the lock the failure names (NAME, or the `--also` name that was
/// busy), with its holder when the lock is held (one more read, on the conflict path only).
async fn refused(args: &RunArgs, client: &leasehold::Client, err: Error) -> anyhow::Error {
    let name = match &err {
        Error::Busy { name, .. } | Error::Timeout { name, .. } => name.clone(),
        _ => args.name.clone(),
    };
    let holder = match &err {
        Error::Busy { .. } | Error::Timeout { .. } if !args.quiet => client
            .inspect(&name)
            .await
            .ok()
            .and_then(|info| info.holder),
        _ => None,
    };
    not_acquired(err, &name, args.conflict_exit_code, args.quiet, holder)
}

/// NAME, then the `--also` names in the order given.
fn names(args: &RunArgs) -> impl Iterator<Item = &str> {
    std::iter::once(args.name.as_str()).chain(args.also.iter().map(String::as_str))
}

/// A usage error for an `--also` that names a lock twice, or on a quorum (which takes one name).
fn check_also(args: &RunArgs) -> anyhow::Result<()> {
    if args.also.is_empty() {
        return Ok(());
    }
    if args.store.urls.len() > 1 {
        return Err(fail(
            exit::USAGE,
            "--also is not available on a quorum (--store given 3 or more times): a quorum run takes one name",
        ));
    }
    let mut seen = std::collections::HashSet::new();
    match names(args).find(|name| !seen.insert(*name)) {
        Some(twice) => Err(fail(
            exit::USAGE,
            format!("lock {twice:?} is named twice (NAME and --also name the locks of one run)"),
        )),
        None => Ok(()),
    }
}

/// Takes NAME and the `--also` names as one set, each as the kind the options ask for, within one wait. A plain run
/// takes each name's mutex, or, for a name that is a read-write lock, its write lock (as [`plain`] does for one
/// name).
async fn acquire_set(
    args: &RunArgs,
    client: &leasehold::Client,
    description: String,
) -> Result<leasehold::MultiGuard, Error> {
    let wait = Wait::of(args);
    let mut as_write: Vec<String> = Vec::new();
    loop {
        let mut set = client
            .multi_lock()
            .ttl(args.ttl)
            .describe(description.clone());
        for name in names(args) {
            set = match args.permits {
                Some(permits) => set.permits(name, permits, 1),
                None if args.fair => set.fair_mutex(name),
                None if args.shared => set.read(name),
                None if args.exclusive => set.write(name),
                None if as_write.iter().any(|n| n == name) => set.write(name),
                None => set.mutex(name),
            };
        }
        let taken = match wait.remaining() {
            None => set.try_lock().await,
            Some(Some(left)) => set.lock_timeout(left).await,
            Some(None) => set.lock().await,
        };
        let plain = args.permits.is_none() && !(args.fair || args.shared || args.exclusive);
        match taken {
            // Ends: each round moves one more name to its write lock.
            Err(Error::WrongKind {
                name,
                found: LockKind::ReadWrite,
            }) if plain && !as_write.contains(&name) => as_write.push(name),
            taken => return taken.map_err(|err| wait.whole(err)),
        }
    }
}

/// `leasehold run` on a quorum of independent servers (`--store` 3 or more times): the quorum mutex, or with
/// `--shared`/`--exclusive` a share of the quorum read-write lock, then the same supervision as on one server.
async fn run_on_quorum(args: &RunArgs, signals: &mut Signals) -> anyhow::Result<u8> {
    let name = args.name.as_str();
    if args.fair || args.permits.is_some() {
        return Err(fail(
            exit::USAGE,
            "a quorum (--store given 3 or more times) has the mutex and the read-write lock only: drop --fair and \
             --permits",
        ));
    }
    if args.value.is_some() {
        return Err(fail(
            exit::USAGE,
            "a quorum (--store given 3 or more times) has no elections: drop --value, or campaign on one store",
        ));
    }
    let quorum = tokio::select! {
        quorum = connect::quorum(&args.store) => quorum?,
        sig = signals.recv() => return Err(interrupted(sig, name)),
    };
    let wait = Wait::of(args);
    let description = crate::holder::description(&args.command);
    let mutex = quorum
        .mutex(name)
        .ttl(args.ttl)
        .describe(description.clone());
    let rw = quorum.rw_lock(name).ttl(args.ttl).describe(description);
    let acquire = async {
        let result = if args.shared || args.exclusive {
            quorum_read_write(&rw, &mutex, args.shared, wait).await
        } else {
            match quorum_mutex(&mutex, wait).await {
                Err(Error::WrongKind {
                    found: LockKind::ReadWrite,
                    ..
                }) => quorum_share(&rw, false, wait).await,
                other => other,
            }
        };
        result.map_err(|err| wait.whole(err))
    };
    let acquired = tokio::select! {
        acquired = acquire => acquired,
        sig = signals.recv() => return Err(interrupted(sig, name)),
    };
    match acquired {
        Ok(guard) => supervise(args, Held::Quorum(guard), None, signals).await,
        Err(err) => {
            // Who holds it, for the message: the holder a majority of nodes names (on the conflict path only).
            let holder = match &err {
                Error::Busy { .. } | Error::Timeout { .. } if !args.quiet => {
                    crate::status::quorum::majority_holder(&args.store, name, quorum.majority())
                        .await
                }
                _ => None,
            };
            Err(not_acquired(
                err,
                name,
                args.conflict_exit_code,
                args.quiet,
                holder,
            ))
        }
    }
}

/// [`read_write`] on a quorum: an `--shared`/`--exclusive` run waits out a plain run's quorum mutex by taking it and
/// giving it back at once, then asks for the read-write lock again. Exclusion rests on each node as on one server: a
/// node never holds both kinds under one name, and a majority of nodes must grant either kind.
async fn quorum_read_write(
    rw: &leasehold::QuorumRwLock,
    mutex: &leasehold::QuorumMutex,
    shared: bool,
    wait: Wait,
) -> Result<leasehold::QuorumGuard, Error> {
    share_after_mutexes(
        || quorum_share(rw, shared, wait),
        || quorum_mutex(mutex, wait),
        leasehold::QuorumGuard::release,
    )
    .await
}

async fn quorum_mutex(
    mutex: &leasehold::QuorumMutex,
    wait: Wait,
) -> Result<leasehold::QuorumGuard, Error> {
    match wait.remaining() {
        None => mutex.try_lock().await,
        Some(Some(left)) => mutex.lock_timeout(left).await,
        Some(None) => mutex.lock().await,
    }
}

async fn quorum_share(
    rw: &leasehold::QuorumRwLock,
    shared: bool,
    wait: Wait,
) -> Result<leasehold::QuorumGuard, Error> {
    match (shared, wait.remaining()) {
        (true, None) => rw.try_read().await,
        (true, Some(Some(left))) => rw.read_timeout(left).await,
        (true, Some(None)) => rw.read().await,
        (false, None) => rw.try_write().await,
        (false, Some(Some(left))) => rw.write_timeout(left).await,
        (false, Some(None)) => rw.write().await,
    }
}

/// A grant on one server (any kind), on a quorum, or of a set (`--also`).
enum Held {
    One(leasehold::Guard),
    Quorum(leasehold::QuorumGuard),
    Set(leasehold::MultiGuard),
}

impl Held {
    /// NAME's lease, then each `--also` name's, in the order given.
    fn leases(&self) -> Vec<leasehold::Lease> {
        match self {
            Held::One(guard) => vec![guard.lease()],
            Held::Quorum(guard) => vec![leasehold::Lease::clone(guard)],
            Held::Set(guard) => guard.leases(),
        }
    }

    async fn release(self) -> Result<(), leasehold::Error> {
        match self {
            Held::One(guard) => guard.release().await,
            Held::Quorum(guard) => guard.release().await,
            Held::Set(guard) => guard.release().await,
        }
    }
}

/// What the supervision reads of the leases it runs the program under: the least time left, the first loss.
struct Leases(Vec<leasehold::Lease>);

impl Leases {
    fn remaining(&self) -> Duration {
        self.0
            .iter()
            .map(leasehold::Lease::remaining)
            .min()
            .unwrap_or(Duration::ZERO)
    }

    fn is_held(&self) -> bool {
        self.0.iter().all(leasehold::Lease::is_held)
    }

    /// The first lease that ended: its lock's name and how.
    fn loss(&self) -> Option<(String, leasehold::LossReason)> {
        self.0
            .iter()
            .find_map(|lease| lease.loss().map(|reason| (lease.name().to_owned(), reason)))
    }

    /// Resolves when the first lease ends, with its lock's name and how.
    async fn lost(&self) -> (String, leasehold::LossReason) {
        let lost = self.0.iter().map(|lease| {
            let name = lease.name().to_owned();
            Box::pin(async move { (name, lease.lost().await) })
        });
        futures_util::future::select_all(lost).await.0
    }
}

/// How often, at least, the supervision loop reads the lease's deadline again and passes it on to the enforcer.
const MAX_REFRESH: Duration = Duration::from_secs(1);

/// How the program's run ended, for [`supervise`].
enum Outcome {
    /// It exited (reaped).
    Exited(std::process::ExitStatus),
    /// It must stop: the lease of this lock was lost, or is running out unrenewed, for this reason.
    Stop(String, String),
    /// Waiting for it failed.
    Failed(std::io::Error),
}

/// Runs the program under `guard`: stops it so that it is gone by the lease's deadline (see [`crate::schedule`]),
/// with the enforcer process as a second pair of hands (see [`crate::enforce`]); releases the lock when it exits.
async fn supervise(
    args: &RunArgs,
    guard: Held,
    term: Option<u64>,
    signals: &mut Signals,
) -> anyhow::Result<u8> {
    let name = args.name.as_str();
    let configured = Schedule::of(args)?;
    let leases = Leases(guard.leases());
    let lease = &leases.0[0];

    let numbered: Vec<(String, String)> = leases.0[1..]
        .iter()
        .enumerate()
        .flat_map(|(i, also)| {
            [
                (format!("LEASEHOLD_NAME_{}", i + 1), also.name().to_owned()),
                (
                    format!("LEASEHOLD_FENCE_{}", i + 1),
                    also.fence().get().to_string(),
                ),
            ]
        })
        .collect();
    let mut env = vec![
        ("LEASEHOLD_NAME", name.to_owned()),
        ("LEASEHOLD_TOKEN", lease.token().to_owned()),
        ("LEASEHOLD_FENCE", lease.fence().get().to_string()),
    ];
    env.extend(
        numbered
            .iter()
            .map(|(var, value)| (var.as_str(), value.clone())),
    );
    if let Some(term) = term {
        env.push(("LEASEHOLD_TERM", term.to_string()));
    }
    let shown = program_name(&args.command);
    // Started first, so that the program never runs without it; when it cannot start, nothing runs.
    let remaining = lease.remaining();
    let mut enforcer = match Enforcer::start(configured.within(remaining).kill_in(remaining)) {
        Ok(enforcer) => enforcer,
        Err(err) => {
            let _ = guard.release().await;
            return Err(fail(
                exit::INTERNAL,
                format!("cannot start the enforcer process ({err}); nothing was run"),
            ));
        }
    };
    let mut program = match spawn(&args.command, &env, Some(&enforcer)) {
        Ok(program) => program,
        Err(err) => {
            // Nothing ran: give the lock back at once rather than after a lease.
            enforcer.stand_down();
            let _ = guard.release().await;
            return Err(err);
        }
    };
    enforcer.watch(program.group());

    let lost = leases.lost();
    tokio::pin!(lost);
    // When the program must have had SIGKILL, on tokio's clock; each renewal moves it forward.
    let mut kill_at;
    // The longest the lease was seen to last: the lease as granted, when that is less than --ttl said.
    let mut longest = Duration::ZERO;
    let mut schedule = configured;
    let outcome = loop {
        let remaining = leases.remaining();
        if remaining > longest {
            longest = remaining;
            schedule = configured.within(longest);
        }
        let kill_in = schedule.kill_in(remaining);
        kill_at = Instant::now() + kill_in;
        enforcer.kill_in(kill_in);
        let term_in = schedule.term_in(remaining);
        if term_in.is_zero() {
            break match leases.loss() {
                Some((lost, reason)) => Outcome::Stop(lost, reason.to_string()),
                None => Outcome::Stop(
                    first_to_end(&leases),
                    format!(
                        "not renewed in time (its lease ends in {})",
                        show(remaining)
                    ),
                ),
            };
        }
        tokio::select! {
            // Loss first: when the program exits just as the lease is lost, we cannot tell whether it finished
            // under the lock, so we say it did not.
            biased;
            (lost, reason) = &mut lost => break Outcome::Stop(lost, reason.to_string()),
            // Read the deadline again: at SIGTERM time, and often enough for the enforcer's copy to stay fresh.
            () = tokio::time::sleep(term_in.min(kill_in / 4).min(MAX_REFRESH)) => {}
            event = program.next_event() => match event {
                Ok(Event::Exited(status)) => break Outcome::Exited(status),
                Ok(Event::Stopped) => program.suspend_with_it(),
                Err(err) => break Outcome::Failed(err),
            },
            sig = signals.recv() => program.forward(sig),
        }
    };
    let status = match outcome {
        Outcome::Exited(status) => {
            enforcer.stand_down();
            status
        }
        Outcome::Stop(lost, why) => {
            // The signal goes out before anything else, and SIGKILL follows by the deadline at the latest: no other
            // holder may start while the program runs.
            program.stop();
            let grace = schedule
                .kill_after
                .min(kill_at.saturating_duration_since(Instant::now()));
            enforcer.kill_in(grace);
            print_err(&format!(
                "leasehold: lost lock {lost:?}: {why}; stopping {shown} (SIGTERM, then SIGKILL after {})",
                show(grace)
            ));
            match program.finish_stop(grace, signals).await {
                Termination::Graceful => {}
                Termination::Killed => print_err(&format!(
                    "leasehold: {shown} was still running {} after SIGTERM; sent SIGKILL",
                    show(grace)
                )),
                Termination::DiedOfSigkill => {
                    print_err(&format!("leasehold: {shown} died of SIGKILL after SIGTERM"))
                }
            }
            enforcer.stand_down();
            // A lease still held (its renewal came back after SIGTERM) is given back; a lost one would only be
            // refused.
            if leases.is_held() {
                let _ = guard.release().await;
            }
            return Ok(exit::LOST);
        }
        Outcome::Failed(err) => {
            drop(program);
            return Err(anyhow::Error::from(err).context(format!("waiting for {shown}")));
        }
    };
    let code = child::exit_code(status);
    // Read before the release: the loss signal fires before the server-side expiry, so a lease still held now was
    // held without a gap while the program ran, whatever the release then meets.
    let held_at_exit = leases.is_held();
    let ended = first_to_end(&leases);
    match guard.release().await {
        Ok(()) => Ok(code),
        Err(
            leasehold::Error::NotOwner { name: lost }
            | leasehold::Error::LeaseLost { name: lost, .. },
        ) => {
            print_err(&format!(
                "leasehold: lost lock {lost:?}: it was no longer ours when {shown} exited"
            ));
            Ok(exit::LOST)
        }
        Err(err) if !held_at_exit => {
            print_err(&format!(
                "leasehold: lost lock {ended:?}: its lease had run out when {shown} exited ({})",
                crate::exit::one_line(&err.into())
            ));
            Ok(exit::LOST)
        }
        Err(err) => {
            print_err(&format!(
                "leasehold: warning: could not release lock {name:?} ({}); {}",
                crate::exit::one_line(&err.into()),
                crate::stores::expiry(crate::stores::Store::of_all(&args.store.urls), args.ttl)
            ));
            Ok(code)
        }
    }
}

/// The lock whose lease ends first: the one a run stops for when no renewal comes.
fn first_to_end(leases: &Leases) -> String {
    leases
        .0
        .iter()
        .min_by_key(|lease| lease.remaining())
        .map_or_else(String::new, |lease| lease.name().to_owned())
}

/// Starts the program with `env` added; a program that cannot start is 127 (not found) or 126 (not executable), as
/// the shells and flock say.
fn spawn(
    command: &[OsString],
    env: &[(&str, String)],
    enforcer: Option<&Enforcer>,
) -> anyhow::Result<Program> {
    Program::spawn(command, env, enforcer.map(Enforcer::fd)).map_err(|err| {
        let code = if err.kind() == std::io::ErrorKind::NotFound {
            exit::CANNOT_RUN
        } else {
            exit::CANNOT_EXECUTE
        };
        fail(code, format!("cannot run {}: {err}", program_name(command)))
    })
}

/// A `run` of the lock that this very process runs under: a program started by `leasehold run NAME` that runs
/// `leasehold run NAME …` again (its environment names NAME, and Redis says its token holds the lock). The program
/// runs at once under the outer run's grant, taking nothing, so the nested run neither deadlocks nor frees the outer
/// lock when it ends. The outer run keeps the lease and, if it is lost, stops its whole process group, this run and
/// its program with it. `None`: not nested, take the lock as usual.
///
/// Only a grant that covers what this run asks for is shared (see [`covers`]); under any other it fails at once with
/// 65: taking the lock would wait for the outer grant itself, and running would break the promise of the kind asked
/// for (a plain run inside each of two `--shared` runs would run two "exclusive" programs at once).
async fn nested(
    args: &RunArgs,
    client: &leasehold::Client,
    signals: &mut Signals,
) -> anyhow::Result<Option<u8>> {
    let Some(outer) = outer_hold(client, &args.name).await else {
        return Ok(None);
    };
    if !covers(outer.mode, outer.permits, args) {
        return Err(fail(
            exit::NOT_A_LOCK,
            format!(
                "cannot nest {} in the {} that holds lock {:?} around it: that grant does not cover it, and taking \
                 the lock would wait for the outer grant itself",
                asked(args),
                outer_grant(outer.mode, outer.permits),
                args.name
            ),
        ));
    }
    let fence = std::env::var("LEASEHOLD_FENCE").unwrap_or_default();
    let env = [
        ("LEASEHOLD_NAME", args.name.clone()),
        ("LEASEHOLD_TOKEN", outer.token),
        ("LEASEHOLD_FENCE", fence),
    ];
    let shown = program_name(&args.command);
    let mut program = spawn(&args.command, &env, None)?;
    let status = loop {
        tokio::select! {
            event = program.next_event() => match event {
                Ok(Event::Exited(status)) => break status,
                Ok(Event::Stopped) => program.suspend_with_it(),
                Err(err) => return Err(anyhow::Error::from(err).context(format!("waiting for {shown}"))),
            },
            sig = signals.recv() => program.forward(sig),
        }
    };
    Ok(Some(child::exit_code(status)))
}

/// The grant of an outer `leasehold run` that this process runs under, when it holds `name`: its environment names
/// `name`, and the store says its token holds the lock.
struct OuterHold {
    token: String,
    mode: leasehold::HoldMode,
    /// The count the semaphore stores, if any.
    permits: Option<u64>,
}

async fn outer_hold(client: &leasehold::Client, name: &str) -> Option<OuterHold> {
    let (Ok(outer_name), Ok(token)) = (
        std::env::var("LEASEHOLD_NAME"),
        std::env::var("LEASEHOLD_TOKEN"),
    ) else {
        return None;
    };
    let id = token.split(' ').next().unwrap_or_default();
    if outer_name != name || id.is_empty() {
        return None;
    }
    // An unreadable lock is left to the usual path, which reports it.
    let info = crate::etcd::holders_as_on_redis(client.inspect(name).await.ok()?);
    let mode = info
        .holders
        .iter()
        .find(|h| h.token.split(' ').next() == Some(id))?
        .mode;
    Some(OuterHold {
        token,
        mode,
        permits: info.permits,
    })
}

/// Whether an outer grant of `outer` (on a semaphore that stores `permits`, if any) covers what `inner` asks for: an
/// exclusive grant (a mutex, a fair mutex, a write lock) covers every kind, a read share covers `--shared`, a permit
/// covers `--permits` of the count the semaphore stores (where the store records none, nothing).
fn covers(outer: leasehold::HoldMode, permits: Option<u64>, inner: &RunArgs) -> bool {
    use leasehold::HoldMode;
    match outer {
        HoldMode::Exclusive | HoldMode::Write | HoldMode::Reentrant | HoldMode::Nested => true,
        HoldMode::Read => inner.shared,
        HoldMode::Permits(_) => inner.permits.is_some() && inner.permits == permits,
        _ => false,
    }
}

/// The kind a run asks for, in the words of its options.
fn asked(args: &RunArgs) -> String {
    match args.permits {
        Some(n) => format!("a --permits {n} run"),
        None if args.shared => "a --shared run".to_owned(),
        None if args.exclusive => "an --exclusive run".to_owned(),
        None if args.fair => "a --fair run".to_owned(),
        None => "a plain run".to_owned(),
    }
}

/// An outer grant of `mode`, in the words of the options that take it.
fn outer_grant(mode: leasehold::HoldMode, permits: Option<u64>) -> String {
    match (mode, permits) {
        (leasehold::HoldMode::Read, _) => "read share (--shared)".to_owned(),
        (leasehold::HoldMode::Permits(_), Some(n)) => format!("permit (--permits {n})"),
        (leasehold::HoldMode::Permits(_), None) => {
            "permit (--permits; the store records no count)".to_owned()
        }
        (mode, _) => format!("{mode} grant"),
    }
}

fn interrupted(sig: Signal, name: &str) -> anyhow::Error {
    fail(
        signals::exit_code(sig),
        format!("{sig} while waiting for lock {name:?}; nothing was run"),
    )
}

/// The error for a failed acquire. Conflicts carry the configured status, and no message with `--quiet`; `holder`
/// (when known) names who holds the lock.
fn not_acquired(
    err: leasehold::Error,
    name: &str,
    conflict: u8,
    quiet: bool,
    holder: Option<leasehold::Holder>,
) -> anyhow::Error {
    let by = holder
        .and_then(|h| h.description)
        .map_or(String::new(), |d| format!(" ({d})"));
    match err {
        leasehold::Error::Busy { .. } | leasehold::Error::Timeout { .. } if quiet => {
            fail(conflict, "")
        }
        leasehold::Error::Busy { remaining, .. } => {
            let left = remaining.map_or(String::new(), |r| {
                format!(" (its lease has {} left)", show(r))
            });
            fail(
                conflict,
                format!("lock {name:?} is held by another owner{by}{left}"),
            )
        }
        leasehold::Error::Timeout { waited, .. } => fail(
            conflict,
            format!(
                "lock {name:?} is still held after waiting {}{by}",
                show(waited)
            ),
        ),
        leasehold::Error::Redis(err) => fail(
            exit::UNAVAILABLE,
            format!(
                "Redis failed while taking lock {name:?}: {}",
                crate::exit::one_line(&err.into())
            ),
        ),
        leasehold::Error::Store { store, url, source } => fail(
            exit::UNAVAILABLE,
            format!(
                "{} at {} failed while taking lock {name:?}: {}",
                crate::stores::shown(store),
                connect::redact(&url),
                crate::exit::error_line(source.as_ref())
            ),
        ),
        other => anyhow::Error::from(other).context(format!("taking lock {name:?}")),
    }
}

/// The program as shown in messages: its first word, quoted.
fn program_name(command: &[OsString]) -> String {
    let program = command
        .first()
        .map_or_else(String::new, |p| p.to_string_lossy().into_owned());
    format!("{program:?}")
}
