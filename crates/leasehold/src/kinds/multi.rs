//! Several locks as one acquisition: [`MultiLock`] takes its members one by one in the order of their names, within
//! one deadline for the whole set, and gives back everything it took when one member cannot be had; [`MultiGuard`]
//! holds them all, with one loss signal and one release. Each member is an ordinary grant of its kind, made by the
//! kind's own handle, so every store that has the kind has the set.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use futures_util::future::{join_all, select_all};
use tokio::time::Instant;

use crate::client::Client;
use crate::engine::lease::{Lease, LossReason};
use crate::error::{require_runtime, Error, InvalidArgument};
use crate::fence::Fence;
use crate::kinds::guard::Guard;

/// What a member of the set asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Mutex,
    Fair,
    Read,
    Write,
    Permits { count: u64, take: u64 },
}

#[derive(Debug, Clone)]
struct Member {
    name: String,
    want: Want,
}

/// Several locks taken as one: all or nothing, without deadlock, within one timeout for the whole set.
///
/// Created by [`Client::multi_lock`]; add members with [`mutex`](MultiLock::mutex),
/// [`fair_mutex`](MultiLock::fair_mutex), [`read`](MultiLock::read) and [`write`](MultiLock::write) (a share of a
/// [`RwLock`](crate::RwLock)) and [`permits`](MultiLock::permits) (of a [`Semaphore`](crate::Semaphore)); kinds may be
/// mixed, one member per name.
///
/// # How a set is taken
///
/// The members are taken one at a time **in the order of their names** (byte order), whatever order they were added
/// in: two sets that share names always take the shared ones in the same order, so one never holds what the other
/// waits for while waiting for what the other holds, and neither deadlocks. Each member waits in its own lock's
/// queue, as its kind's handle would, for what is left of the one deadline of the whole set
/// ([`lock_timeout`](MultiLock::lock_timeout)). When a member cannot be had (the deadline passed, an error, a member
/// already taken lost its lease meanwhile), every member taken so far is released and the call fails: the caller
/// never holds part of a set. The members already taken are held, and renewed, while later ones are waited for.
///
/// A set is not one atomic step on the store: another client that reads the locks may see some of them taken by
/// a set that is still waiting for the rest, as it would see any other holder.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(locks: leasehold::Client) -> Result<(), leasehold::Error> {
/// use std::time::Duration;
///
/// // Move stock between two warehouses: both or neither, without deadlock against a job
/// // that names them the other way round.
/// let both = locks
///     .multi_lock()
///     .mutex("stock:berlin")
///     .mutex("stock:paris")
///     .lock_timeout(Duration::from_secs(5))
///     .await?;
/// let fence = both.fence("stock:paris");
/// // ... the move, fenced ...
/// both.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MultiLock {
    client: Client,
    /// In the order they were added.
    members: Vec<Member>,
    ttl: Option<Duration>,
    description: Option<String>,
    fail_fast: bool,
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLock")
            .field("members", &self.members)
            .field("ttl", &self.ttl)
            .field("description", &self.description)
            .field("fail_fast", &self.fail_fast)
            .finish()
    }
}

impl MultiLock {
    pub(crate) fn new(client: Client) -> MultiLock {
        MultiLock {
            client,
            members: Vec::new(),
            ttl: None,
            description: None,
            fail_fast: false,
        }
    }

    fn with(mut self, name: &str, want: Want) -> MultiLock {
        self.members.push(Member {
            name: name.to_owned(),
            want,
        });
        self
    }

    /// Adds the [`Mutex`](crate::Mutex) called `name`.
    pub fn mutex(self, name: &str) -> MultiLock {
        self.with(name, Want::Mutex)
    }

    /// Adds the [`FairMutex`](crate::FairMutex) called `name`.
    pub fn fair_mutex(self, name: &str) -> MultiLock {
        self.with(name, Want::Fair)
    }

    /// Adds a read share of the [`RwLock`](crate::RwLock) called `name`.
    pub fn read(self, name: &str) -> MultiLock {
        self.with(name, Want::Read)
    }

    /// Adds the write lock of the [`RwLock`](crate::RwLock) called `name`.
    pub fn write(self, name: &str) -> MultiLock {
        self.with(name, Want::Write)
    }

    /// Adds `take` permits of the [`Semaphore`](crate::Semaphore) called `name`, which has `count` permits.
    pub fn permits(self, name: &str, count: u64, take: u64) -> MultiLock {
        self.with(name, Want::Permits { count, take })
    }

    /// The lease of every member's grant, as each kind's `ttl` says; the client's default lease otherwise.
    pub fn ttl(mut self, ttl: Duration) -> MultiLock {
        self.ttl = Some(ttl);
        self
    }

    /// A description of the holder on every member's grant, as [`Mutex::describe`](crate::Mutex::describe) says.
    pub fn describe(mut self, description: impl Into<String>) -> MultiLock {
        self.description = Some(description.into());
        self
    }

    /// Ends the wait at the first store error instead of riding it out, as
    /// [`Mutex::fail_fast`](crate::Mutex::fail_fast) says.
    pub fn fail_fast(mut self) -> MultiLock {
        self.fail_fast = true;
        self
    }

    /// The members' names, in the order they were added.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.members.iter().map(|member| member.name.as_str())
    }

    /// Takes every member, each only if it is free now (each kind's `try_` call).
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] naming the first member (in name order) that was not free; [`Error::InvalidArgument`] for an
    /// empty set ([`InvalidArgument::EmptySet`]), a name given twice ([`InvalidArgument::DuplicateName`]) or any
    /// argument a member's kind refuses; otherwise what that member's kind returns. Members taken before the failure
    /// are released first.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: members taken before the future was dropped are released in the background.
    pub async fn try_lock(&self) -> Result<MultiGuard, Error> {
        self.take(Wait::Once).await
    }

    /// Waits as long as it takes for every member.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when a member already taken lost its lease while a later one was waited for; otherwise as
    /// [`try_lock`](MultiLock::try_lock), but never [`Error::Busy`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the wait leaves its queue, and members already taken are released in the background.
    pub async fn lock(&self) -> Result<MultiGuard, Error> {
        self.take(Wait::Forever).await
    }

    /// Waits at most `timeout` for the whole set.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] naming the member that was still being waited for when the time ran out, with `waited` the
    /// whole `timeout`; otherwise as [`lock`](MultiLock::lock).
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](MultiLock::lock).
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<MultiGuard, Error> {
        self.take(Wait::Until(Instant::now() + timeout, timeout))
            .await
    }

    /// Takes every member, runs `work` while holding them all, and releases them: `work` is dropped the moment any
    /// member's lease is lost.
    ///
    /// # Errors
    ///
    /// As [`lock`](MultiLock::lock); [`Error::LeaseLost`] when a member's lease ended during the work; what
    /// [`MultiGuard::release`] returns.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping it drops the work and releases the members in the background.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, Error> {
        let guard = self.lock().await?;
        let output = guard.run_until_lost(work).await;
        let released = guard.release().await;
        let output = output?;
        released.map(|()| output)
    }

    /// The members in the order they are taken, each with its place among the added ones, after the set's own checks.
    fn ordered(&self) -> Result<Vec<(usize, &Member)>, Error> {
        if self.members.is_empty() {
            return Err(Error::InvalidArgument(InvalidArgument::EmptySet));
        }
        let mut ordered: Vec<(usize, &Member)> = self.members.iter().enumerate().collect();
        ordered.sort_by(|(_, a), (_, b)| a.name.as_bytes().cmp(b.name.as_bytes()));
        if let Some(pair) = ordered
            .windows(2)
            .find(|pair| pair[0].1.name == pair[1].1.name)
        {
            return Err(Error::InvalidArgument(InvalidArgument::DuplicateName {
                name: pair[0].1.name.chars().take(64).collect(),
            }));
        }
        Ok(ordered)
    }

    async fn take(&self, wait: Wait) -> Result<MultiGuard, Error> {
        require_runtime()?;
        let ordered = self.ordered()?;
        // Dropped on every way out but success: a member already taken is then released in the background.
        let mut held: Vec<(usize, Guard)> = Vec::with_capacity(ordered.len());
        for (index, member) in ordered {
            let leases: Vec<Lease> = held.iter().map(|(_, guard)| guard.lease()).collect();
            let taken = tokio::select! {
                biased;
                (name, reason) = first_loss(leases) => Err(Error::LeaseLost { name, reason }),
                taken = self.take_one(member, wait) => taken.map_err(|err| wait.whole(err)),
            };
            match taken {
                Ok(guard) => held.push((index, guard)),
                Err(err) => {
                    release_all(held.into_iter().map(|(_, guard)| guard).collect()).await;
                    return Err(err);
                }
            }
        }
        held.sort_by_key(|(index, _)| *index);
        Ok(MultiGuard {
            guards: held.into_iter().map(|(_, guard)| guard).collect(),
        })
    }

    /// One member, by its kind's own handle, for what is left of the wait.
    async fn take_one(&self, member: &Member, wait: Wait) -> Result<Guard, Error> {
        let left = wait.remaining();
        let client = &self.client;
        let name = member.name.as_str();
        macro_rules! configured {
            ($handle:expr) => {{
                let mut handle = $handle;
                if let Some(ttl) = self.ttl {
                    handle = handle.ttl(ttl);
                }
                if let Some(description) = &self.description {
                    handle = handle.describe(description.clone());
                }
                if self.fail_fast {
                    handle = handle.fail_fast();
                }
                handle
            }};
        }
        match member.want {
            Want::Mutex => {
                let mutex = configured!(client.mutex(name));
                match left {
                    None => mutex.try_lock().await,
                    Some(None) => mutex.lock().await,
                    Some(Some(left)) => mutex.lock_timeout(left).await,
                }
            }
            Want::Fair => {
                let fair = configured!(client.fair_mutex(name));
                match left {
                    None => fair.try_lock().await,
                    Some(None) => fair.lock().await,
                    Some(Some(left)) => fair.lock_timeout(left).await,
                }
            }
            Want::Read => {
                let rw = configured!(client.rw_lock(name));
                match left {
                    None => rw.try_read().await,
                    Some(None) => rw.read().await,
                    Some(Some(left)) => rw.read_timeout(left).await,
                }
            }
            Want::Write => {
                let rw = configured!(client.rw_lock(name));
                let guard = match left {
                    None => rw.try_write().await,
                    Some(None) => rw.write().await,
                    Some(Some(left)) => rw.write_timeout(left).await,
                };
                guard.map(crate::WriteGuard::into_guard)
            }
            Want::Permits { count, take } => {
                let semaphore = configured!(client.semaphore(name, count));
                match left {
                    None => semaphore.try_acquire_many(take).await,
                    Some(None) => semaphore.acquire_many(take).await,
                    Some(Some(left)) => semaphore.acquire_many_timeout(take, left).await,
                }
            }
        }
    }
}

/// How long a set may wait: try each member once, until a deadline, or without limit.
#[derive(Debug, Clone, Copy)]
enum Wait {
    Once,
    Until(Instant, Duration),
    Forever,
}

impl Wait {
    /// What is left: `Some(None)` without limit, `None` when it is over (try the member once).
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

    /// A member's `Timeout` said as the whole set's wait, and so is a `Busy` from a member tried once after the
    /// deadline had passed.
    fn whole(self, err: Error) -> Error {
        match (self, err) {
            (Wait::Until(_, waited), Error::Timeout { name, .. } | Error::Busy { name, .. }) => {
                Error::Timeout { name, waited }
            }
            (_, err) => err,
        }
    }
}

/// Resolves when the first of `leases` ends, with its name and why; never, for none.
async fn first_loss(leases: Vec<Lease>) -> (String, LossReason) {
    if leases.is_empty() {
        return std::future::pending().await;
    }
    let names: Vec<String> = leases.iter().map(|lease| lease.name().to_owned()).collect();
    let (reason, index, _) = select_all(leases.iter().map(|lease| Box::pin(lease.lost()))).await;
    (names[index].clone(), reason)
}

/// Releases `guards` together; what each release found is not the caller's concern here (a failed one leaves its
/// lease to expire, and the guard's drop retries it).
async fn release_all(guards: Vec<Guard>) {
    let _ = join_all(guards.into_iter().map(Guard::release)).await;
}

/// Proof of holding every member of a [`MultiLock`]: one grant per member, each with its own fence and lease.
///
/// The set is held while every member's lease is; [`lost`](MultiGuard::lost) resolves when the first of them ends,
/// which for each member is before its store could grant that lock to anyone else, so work raced against it (as
/// [`run_until_lost`](MultiGuard::run_until_lost) does) stops before any member could have another holder.
/// [`release`](MultiGuard::release) gives every member back; dropping the guard releases them in the background, as
/// a [`Guard`]'s drop does.
#[must_use = "the locks are released as soon as the guard is dropped"]
#[clippy::has_significant_drop]
pub struct MultiGuard {
    /// In the order the members were added to the [`MultiLock`].
    guards: Vec<Guard>,
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.guards.iter().map(|guard| guard.lease()))
            .finish()
    }
}

impl MultiGuard {
    /// Every member's grant, in the order the members were added.
    pub fn guards(&self) -> &[Guard] {
        &self.guards
    }

    /// The grant of the member called `name`.
    pub fn get(&self, name: &str) -> Option<&Guard> {
        self.guards.iter().find(|guard| guard.name() == name)
    }

    /// The fence of the member called `name`'s grant.
    pub fn fence(&self, name: &str) -> Option<Fence> {
        self.get(name).map(|guard| guard.fence())
    }

    /// Cloneable views of every member's lease, in the order the members were added.
    pub fn leases(&self) -> Vec<Lease> {
        self.guards.iter().map(Guard::lease).collect()
    }

    /// True while every member's lease is held.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(|guard| guard.is_held())
    }

    /// The least time left on any member's lease (see [`Lease::remaining`]).
    pub fn remaining(&self) -> Duration {
        self.guards
            .iter()
            .map(|guard| guard.remaining())
            .min()
            .unwrap_or(Duration::ZERO)
    }

    /// The first member (in the order they were added) whose lease ended, and how; `None` while all are held.
    pub fn loss(&self) -> Option<(String, LossReason)> {
        self.guards
            .iter()
            .find_map(|guard| guard.loss().map(|reason| (guard.name().to_owned(), reason)))
    }

    /// Resolves when the first member's lease ends, with that member's name and why. Owns what it needs
    /// (`'static`), like [`Lease::lost`].
    ///
    /// # Panics
    ///
    /// When polled outside a tokio runtime, as [`Lease::lost`].
    pub fn lost(&self) -> impl Future<Output = (String, LossReason)> + Send + 'static {
        first_loss(self.leases())
    }

    /// Runs `work` until it finishes or the first member's lease is lost, whichever comes first.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] naming the member whose lease ended (the work was dropped).
    pub async fn run_until_lost<F: Future>(&self, work: F) -> Result<F::Output, Error> {
        require_runtime()?;
        tokio::select! {
            biased;
            (name, reason) = self.lost() => Err(Error::LeaseLost { name, reason }),
            output = work => Ok(output),
        }
    }

    /// Releases every member, all at once: each member's lease ends before its request leaves (so the set reads
    /// as not held before any member is given back), and every member is released whatever the others' releases
    /// find.
    ///
    /// # Errors
    ///
    /// The first error (in the order the members were added) of the members' releases, as
    /// [`Guard::release`] says: [`Error::LeaseLost`] when that member's lease had ended before this call,
    /// [`Error::NotOwner`] when its store said it was no longer ours.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: releases not yet answered go on in the background.
    pub async fn release(self) -> Result<(), Error> {
        require_runtime()?;
        join_all(self.guards.into_iter().map(Guard::release))
            .await
            .into_iter()
            .collect()
    }

    /// The members' guards, in the order the members were added, to release or keep one by one.
    pub fn into_guards(self) -> Vec<Guard> {
        self.guards
    }
}
