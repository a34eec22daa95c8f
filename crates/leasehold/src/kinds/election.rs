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
        self.lead(guard, value).await
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
        self.lead(guard, value).await
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
        self.lead(guard, value).await
    }

    /// Counts the term `guard` won ([`Leadership::term`]): the grant becomes a term only once counted, so an
    /// observer that missed it counts it. A grant lost before its count is no term (its guard releases).
    async fn lead(&self, guard: Guard, value: String) -> Result<Leadership, Error> {
        match guard.begin_term(&value).await? {
            Some(term) => {
                let published = std::sync::Arc::new(tokio::sync::Mutex::new(
                    crate::fence::with_term(&value, term),
                ));
                guard.keep_published(std::sync::Arc::clone(&published));
                Ok(Leadership {
                    guard,
                    value,
                    term,
                    published,
                })
            }
            None => Err(Error::LeaseLost {
                name: self.name.clone(),
                reason: guard.loss().unwrap_or(LossReason::Gone),
            }),
        }
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
            term: holder.term,
            value: holder.value,
            description: holder.description,
            token: holder.token,
            remaining: holder.remaining,
        }))
    }

    /// How many terms of this election were counted: the number of the last term that began, 0 before the first.
    /// Read apart from [`leader`](Election::leader) (an observer reads it first).
    ///
    /// # Errors
    ///
    /// As [`Client::inspect`].
    pub async fn terms(&self) -> Result<u64, Error> {
        self.client.term_count(&self.name).await
    }

    /// An observer of the election: the current leader at once, then every change it sees (see [`Observer`]).
    pub fn observe(&self) -> Observer {
        Observer {
            election: self.clone(),
            last: None,
            counted: None,
            pending: None,
            feed: None,
            uncounted: None,
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
    /// The term's number: 1 for the election's first term, one more for each later one
    /// ([`Leadership::term`]). `None` for a holder that is not a counted campaign (a plain mutex holder, another
    /// client's candidate), or a campaign between its grant and its count.
    pub term: Option<u64>,
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
    /// Terms began and ended between two reads, unseen: said before what the later read saw.
    Missed {
        /// How many: the terms counted since the last one this observer said or counted. `None` when the election's
        /// count went back (the store lost it: a Redis restart without persistence, or a day without a term on Redis,
        /// whose count lives as long as the fence counter), so an unknown number may have passed.
        terms: Option<u64>,
    },
}

/// What one read of an observer said: the leader's fence, value and term (`None`: nobody leads).
type Seen = Option<(Option<Fence>, Option<String>, Option<u64>)>;

/// Reads an election over and over and says what changed: created by [`Election::observe`].
///
/// Its first [`next`](Observer::next) says who leads at once (or [`Observed::Vacant`]); each later one waits for a
/// change: a new term (a fence it has not seen), a new value of the term, or the end of every term. It reads the
/// election every [`observe_every`](Election::observe_every) (100 ms by default); on etcd and ZooKeeper it waits on
/// the store's watches of the election's lock instead, and reads when they fire (and at least every ten intervals). It rides out a store that
/// does not answer (it reads again), so it survives reconnects and failovers. Changes come in order of fence, never
/// back.
///
/// **No term passes silently.** Every campaign's term is counted when it begins ([`Leadership::term`]); each read
/// takes the election's count ([`Election::terms`]) before its leader, and a term that began and ended between two
/// reads is said as [`Observed::Missed`] with how many, before what the later read saw. A holder of the election's
/// lock that is not a campaign (a plain mutex, another client's candidate) is said when seen, and not counted.
#[derive(Debug)]
pub struct Observer {
    election: Election,
    /// What the last read said, once one was said.
    last: Option<Seen>,
    /// The highest term number said or counted (`None` before the first read).
    counted: Option<u64>,
    /// What a read saw, to say after the [`Observed::Missed`] said first.
    pending: Option<Observed>,
    /// The store's feed of changes to the election's lock, where it has one (etcd's and ZooKeeper's watches).
    feed: Option<crate::client::Feed>,
    /// A campaign seen granted but not yet counted: its fence, and since when.
    uncounted: Option<(Option<Fence>, tokio::time::Instant)>,
    started: bool,
}

/// How long an observer waits for a campaign it sees granted to be counted before it says it without a number.
const UNCOUNTED_GRACE: Duration = Duration::from_secs(2);

/// With a feed of changes, an observer reads on each change, and at least once in this many intervals.
const FEED_FALLBACK: u32 = 10;

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
        if let Some(pending) = self.pending.take() {
            return Ok(pending);
        }
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
                self.wait().await;
            }
            if self.feed.is_none() {
                // Opened before the read, so that no change after it goes unheard.
                self.feed = self.election.client.feed(&self.election.name).await;
            }
            self.started = true;
            // The count first: every term it counts began before the leader is read.
            let read = match self.election.terms().await {
                Ok(count) => self.election.leader().await.map(|leader| (count, leader)),
                Err(err) => Err(err),
            };
            let (count, leader) = match read {
                Ok(read) => read,
                // A store that did not answer: read again after the interval.
                Err(err @ (Error::Connect { .. } | Error::Redis(_) | Error::Store { .. })) => {
                    tracing::debug!(target: "leasehold::election", election = %self.election.name, error = %err, "an observer's read failed; reading again");
                    continue;
                }
                Err(err) => return Err(err),
            };
            if let Some(change) = self.said(count, leader) {
                return Ok(change);
            }
        }
    }

    /// Waits until the next read: a change the store's feed announced (or [`FEED_FALLBACK`] intervals without one),
    /// or one interval where there is no feed. A feed that ended is dropped (the next read opens another).
    async fn wait(&mut self) {
        let every = self.election.every;
        match &mut self.feed {
            Some(feed) => {
                tokio::select! {
                    alive = feed.changed() => {
                        if !alive {
                            self.feed = None;
                        }
                    }
                    () = tokio::time::sleep(every.saturating_mul(FEED_FALLBACK)) => {}
                }
            }
            None => tokio::time::sleep(every).await,
        }
    }

    /// What one read (the election's `count`, then its `leader`) says, if anything: a [`Observed::Missed`] first
    /// when terms passed unseen (what the read saw then waits in `pending`).
    fn said(&mut self, count: u64, leader: Option<Leader>) -> Option<Observed> {
        // A campaign between its grant and its count is no term yet: said once counted, a moment later; or, when it
        // stays uncounted for UNCOUNTED_GRACE (a count the store lost under a live term), said without its number.
        let uncounted = leader.as_ref().filter(|leader| {
            leader.value.is_some()
                && leader.term.is_none()
                && leader.token.starts_with(crate::fence::TOKEN_PREFIX)
        });
        match (uncounted, self.uncounted) {
            (Some(leader), Some((fence, since))) if fence == leader.fence => {
                if since.elapsed() < UNCOUNTED_GRACE {
                    return None;
                }
            }
            (Some(leader), _) => {
                self.uncounted = Some((leader.fence, tokio::time::Instant::now()));
                return None;
            }
            (None, _) => self.uncounted = None,
        }
        let seen: Seen = leader
            .as_ref()
            .map(|leader| (leader.fence, leader.value.clone(), leader.term));
        // A term never goes back: a read that lags a newer one (another member of the store answered) is skipped.
        if let (Some(Some((Some(last), _, _))), Some((Some(fence), _, _))) = (&self.last, &seen) {
            if fence < last {
                return None;
            }
        }
        let term = leader.as_ref().and_then(|leader| leader.term);
        // The terms this read accounts for: those counted before it, and the leader's own.
        let top = count.max(term.unwrap_or(0));
        let missed = match self.counted {
            None => None,
            // The count went back: the store lost it.
            Some(counted) if top < counted => Some(None),
            // The terms after the last one accounted for, but the leader's own, which is said.
            Some(counted) => {
                let unseen = top - counted - u64::from(term == Some(top) && top > counted);
                (unseen > 0).then_some(Some(unseen))
            }
        };
        self.counted = Some(top);
        let change = (self.last.as_ref() != Some(&seen)).then_some(match leader {
            Some(leader) => Observed::Leader(leader),
            None => Observed::Vacant,
        });
        self.last = Some(seen);
        match (missed, change) {
            (Some(terms), change) => {
                self.pending = change;
                Some(Observed::Missed { terms })
            }
            (None, change) => change,
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
    term: u64,
    /// What the last proclamation wrote (the value and the term's number), which Redis is told again while the term
    /// lasts ([`Guard::keep_published`]).
    published: std::sync::Arc<tokio::sync::Mutex<String>>,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("lease", &self.guard.lease())
            .field("value", &self.value)
            .field("term", &self.term)
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

    /// The term's number: 1 for the election's first term, one more for each later one, counted by the store when
    /// the campaign won ([`Election::terms`]). Observers that missed a term count it by this number. The fence,
    /// not the number, is what guards writes: a count a store lost (a Redis restart without persistence) starts
    /// again at 1, and a fence never goes back.
    pub fn term(&self) -> u64 {
        self.term
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
        let text = crate::fence::with_term(&value, self.term);
        let mut published = self.published.lock().await;
        if !self.guard.proclaim(&text).await? {
            return Err(lost(LossReason::Gone));
        }
        *published = text;
        drop(published);
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
