//! Leader election on every store: a campaign is a wait in the election's lock queue (its mutex, so FIFO), a term is
//! a grant of it (its fence, its lease, its loss signal), and the value the leader publishes rides in the grant's hold
//! after its description ([`crate::fence::hold_text`]), where `inspect` reads it; a proclamation rewrites it (on
//! Redis it goes to the lock's value key instead, since every script compares a mutex's token whole). Observers read
//! the lock: they hold nothing.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::client::Client;
use crate::engine::lease::{Lease, LossReason};
use crate::error::{require_runtime, Error};
use crate::fence::Fence;
use crate::kinds::guard::Guard;

/// An election: processes campaign to lead it, one leads at a time, and anyone can ask who leads and be told when
/// that changes.
///
/// Created by [`Client::election`]. A campaign ([`campaign`](Election::campaign)) waits in the election's queue,
/// in order of arrival, and ends as the leader: a [`Leadership`] for one term, with the term's fence (higher than
/// every earlier term's), the value the leader publishes (its address, say), and the loss signal, which fires before
/// the store could let anyone else lead. [`leader`](Election::leader) and [`observe`](Election::observe) take no
/// part: they read.
///
/// The election is the [`Mutex`](crate::Mutex) of the same name: a plain `leasehold run NAME` or a mutex holder
/// leads it too (without a value), and `leasehold run --value TEXT NAME` campaigns.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(locks: leasehold::Client) -> Result<(), leasehold::Error> {
/// let election = locks.election("scheduler");
/// let term = election.campaign("10.0.0.7:8080").await?;
/// // ... lead, with term.fence() on every write ...
/// term.resign().await?;
/// if let Some(leader) = election.leader().await? {
///     println!("{:?} leads, term {:?}", leader.value, leader.fence.map(|f| f.get()));
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Election {
    client: Client,
    name: String,
    ttl: Option<Duration>,
    description: Option<String>,
    every: Duration,
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.name)
            .field("ttl", &self.ttl)
            .field("description", &self.description)
            .field("every", &self.every)
            .finish()
    }
}

/// How often an [`Observer`] reads the election by default.
pub const DEFAULT_OBSERVE_EVERY: Duration = Duration::from_millis(100);

impl Election {
    pub(crate) fn new(client: Client, name: &str) -> Election {
        Election {
            client,
            name: name.to_owned(),
            ttl: None,
            description: None,
            every: DEFAULT_OBSERVE_EVERY,
        }
    }

    /// The election's name (its lock's).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lease of each term, as [`Mutex::ttl`](crate::Mutex::ttl) says.
    pub fn ttl(mut self, ttl: Duration) -> Election {
        self.ttl = Some(ttl);
        self
    }

    /// A description of the campaigner (who it is, for `leasehold status`), beside the value it publishes.
    pub fn describe(mut self, description: impl Into<String>) -> Election {
        self.description = Some(description.into());
        self
    }

    /// How often an [`Observer`] reads the election ([`DEFAULT_OBSERVE_EVERY`], 100 ms, by default).
    pub fn observe_every(mut self, every: Duration) -> Election {
        self.every = every;
        self
    }

    fn mutex(&self, value: &str) -> crate::Mutex {
        let mut mutex = self.client.mutex(&self.name);
        if let Some(ttl) = self.ttl {
            mutex = mutex.ttl(ttl);
        }
        if let Some(description) = &self.description {
            mutex = mutex.describe(description.clone());
        }
        mutex.publishing(value)
    }

    /// Waits, in order of arrival, until this campaign leads, publishing `value`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a value that is empty, longer than [`MAX_VALUE_LEN`](crate::MAX_VALUE_LEN) or
    /// holds a control character ([`InvalidArgument::BadValue`](crate::InvalidArgument::BadValue)); otherwise as
    /// [`Mutex::lock`](crate::Mutex::lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves the queue, and a term that began meanwhile ends at once.
    pub async fn campaign(&self, value: impl Into<String>) -> Result<Leadership, Error> {
        let value = value.into();
        let guard = self.mutex(&value).lock().await?;
        Ok(Leadership { guard, value })
    }

    /// Campaigns for at most `timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when another still leads after `timeout`; otherwise as [`campaign`](Election::campaign).
    ///
    /// # Cancel safety
    ///
    /// As [`campaign`](Election::campaign).
    pub async fn campaign_timeout(
        &self,
        value: impl Into<String>,
        timeout: Duration,
    ) -> Result<Leadership, Error> {
        let value = value.into();
        let guard = self.mutex(&value).lock_timeout(timeout).await?;
        Ok(Leadership { guard, value })
    }

    /// Leads only if nobody leads or waits now.
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when another leads; otherwise as [`campaign`](Election::campaign).
    ///
    /// # Cancel safety
    ///
    /// As [`campaign`](Election::campaign).
    pub async fn try_campaign(&self, value: impl Into<String>) -> Result<Leadership, Error> {
        let value = value.into();
        let guard = self.mutex(&value).try_lock().await?;
        Ok(Leadership { guard, value })
    }

    /// The current leader, or `None` when nobody leads: one read of the election's lock.
    ///
    /// # Errors
    ///
    /// As [`Client::inspect`].
    pub async fn leader(&self) -> Result<Option<Leader>, Error> {
        let info = self.client.inspect(&self.name).await?;
        Ok(info.holder.map(|holder| Leader {
            // The exclusive holder's grant is the lock's last on every store: see `Client::inspect`.
            fence: info.last_fence,
            value: holder.value,
            description: holder.description,
            token: holder.token,
            remaining: holder.remaining,
        }))
    }

    /// An observer of the election: the current leader at once, then every change it sees (see [`Observer`]).
    pub fn observe(&self) -> Observer {
        Observer {
            election: self.clone(),
            last: None,
            started: false,
        }
    }
}

/// The leader of an election, as [`Election::leader`] read it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The term's fence: higher than every earlier term's. `None` only when the store kept no fence counter (a
    /// Redis fence counter past its retention).
    pub fence: Option<Fence>,
    /// What the leader publishes ([`Election::campaign`], [`Leadership::proclaim`]); `None` for a holder of the
    /// election's lock that published nothing (a plain mutex holder, `leasehold run` without `--value`).
    pub value: Option<String>,
    /// What the leader said about itself (`describe`; the command gives host, pid, user, start time and program).
    pub description: Option<String>,
    /// The leader's owner token, with its description.
    pub token: String,
    /// The time left on the leader's lease, when the store says.
    pub remaining: Option<Duration>,
}

/// One change an [`Observer`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Observed {
    /// This leads now: a new term, or a new value of the same term.
    Leader(Leader),
    /// Nobody leads.
    Vacant,
}

/// Reads an election over and over and says what changed: created by [`Election::observe`].
///
/// Its first [`next`](Observer::next) says who leads at once (or [`Observed::Vacant`]); each later one waits for a
/// change: a new term (a fence it has not seen), a new value of the term, or the end of every term. It reads the
/// election's lock every [`observe_every`](Election::observe_every) (100 ms by default), and rides out a store
/// that does not answer (it reads again), so it survives reconnects and failovers. Changes come in order of fence;
/// a term shorter than the interval can pass between two reads unseen.
#[derive(Debug)]
pub struct Observer {
    election: Election,
    /// What the last read said (None: vacant), once one was said.
    last: Option<Option<(Option<Fence>, Option<String>)>>,
    started: bool,
}

impl Observer {
    /// The next change: at once on the first call, then when the election changes.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a name or interval the client refuses; [`Error::NotALock`] when the name
    /// holds something leasehold did not write; [`Error::NotPermitted`]. A store that does not answer (a connection
    /// or store error) is read again, not returned.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is lost; the next call reads again.
    pub async fn next(&mut self) -> Result<Observed, Error> {
        require_runtime()?;
        if self.election.every.is_zero() {
            return Err(crate::error::InvalidArgument::BadDuration {
                what: "observe interval",
                value: self.election.every,
                why: "it must be longer than zero",
            }
            .into());
        }
        loop {
            if self.started {
                tokio::time::sleep(self.election.every).await;
            }
            self.started = true;
            let leader = match self.election.leader().await {
                Ok(leader) => leader,
                // A store that did not answer: read again after the interval.
                Err(err @ (Error::Connect { .. } | Error::Redis(_) | Error::Store { .. })) => {
                    tracing::debug!(target: "leasehold::election", election = %self.election.name, error = %err, "an observer's read failed; reading again");
                    continue;
                }
                Err(err) => return Err(err),
            };
            let seen = leader
                .as_ref()
                .map(|leader| (leader.fence, leader.value.clone()));
            if self.last.as_ref() == Some(&seen) {
                continue;
            }
            // A term never goes back: a read that lags a newer one (another member of the store answered) is skipped.
            if let (Some(Some((Some(last), _))), Some((Some(fence), _))) = (&self.last, &seen) {
                if fence < last {
                    continue;
                }
            }
            self.last = Some(seen);
            return Ok(match leader {
                Some(leader) => Observed::Leader(leader),
                None => Observed::Vacant,
            });
        }
    }
}

/// One term of leadership: the grant of the election's lock that a campaign won. Dereferences to its [`Lease`]
/// ([`fence`](Lease::fence), [`lost`](Lease::lost), [`is_held`](Lease::is_held)). Dropping it resigns in the
/// background, as dropping a [`Guard`] releases.
#[must_use = "the term ends as soon as it is dropped"]
pub struct Leadership {
    guard: Guard,
    value: String,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("lease", &self.guard.lease())
            .field("value", &self.value)
            .finish()
    }
}

impl std::ops::Deref for Leadership {
    type Target = Lease;

    fn deref(&self) -> &Lease {
        &self.guard
    }
}

impl Leadership {
    /// What this leader publishes now.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// A cloneable view of the term's lease.
    pub fn lease(&self) -> Lease {
        self.guard.lease()
    }

    /// Publishes `value` in place of the current one, for the rest of the term: observers and
    /// [`Election::leader`] read it from then on. The term (its fence, its place) is unchanged.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when the term already ended, or the store says this grant no longer holds the lock
    /// (nothing was written); [`Error::InvalidArgument`] for a value the campaign would refuse; a store error when
    /// the store could not be asked (the value may or may not have been written).
    pub async fn proclaim(&mut self, value: impl Into<String>) -> Result<(), Error> {
        let value = value.into();
        crate::fence::check_value(&value)?;
        let lost = |reason| Error::LeaseLost {
            name: self.guard.name().to_owned(),
            reason,
        };
        if let Some(reason) = self.guard.loss() {
            return Err(lost(reason));
        }
        if !self.guard.proclaim(&value).await? {
            return Err(lost(LossReason::Gone));
        }
        self.value = value;
        Ok(())
    }

    /// Runs `work` until it finishes or the term ends, whichever comes first.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when the term ended first (the work was dropped).
    pub async fn run_until_lost<F: Future>(&self, work: F) -> Result<F::Output, Error> {
        self.guard.run_until_lost(work).await
    }

    /// Ends the term and lets the next campaign lead at once, as [`Guard::release`] does.
    ///
    /// # Errors
    ///
    /// As [`Guard::release`].
    pub async fn resign(self) -> Result<(), Error> {
        self.guard.release().await
    }

    /// The term's grant, as a plain guard.
    pub fn into_guard(self) -> Guard {
        self.guard
    }
}
