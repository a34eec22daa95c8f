//! A lease: one grant of a lock, its validity deadline and how it ended.
//!
//! The state sits behind a small mutex with a [`Notify`] for the tasks that await its end: far lighter than a
//! channel, which matters when one client keeps 10,000 leases. Ending is final: once a lease is lost, no late
//! renewal reply can bring it back.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::clock;
use crate::fence::Fence;
use crate::keys::{drift, LockKeys};

/// Why a lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// No renewal was confirmed before the validity deadline (Redis down or slow, network cut, process paused).
    /// The key may still exist on the server for a moment; nobody else can hold it before it expires there.
    Expired,
    /// A renewal found the key gone: it expired on the server, was force-released, or Redis lost it (restart
    /// without persistence, failover).
    Gone,
    /// A renewal found the key held by another owner.
    Taken,
    /// Not a failure: the guard was released or dropped.
    Released,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LossReason::Expired => "not renewed before its validity deadline",
            LossReason::Gone => "the key was gone from Redis",
            LossReason::Taken => "another owner holds the lock",
            LossReason::Released => "released by its holder",
        })
    }
}

/// Timers fire on millisecond ticks, rounded up; aiming this much before the deadline makes the loss signal land
/// at or before it.
const TIMER_GUARD: Duration = Duration::from_millis(2);

/// Unconfirmed requests kept one by one; beyond this many, those with equal leases are merged (conservatively).
const MAX_UNCONFIRMED: usize = 16;

/// A request that can move the key's expiry, registered with [`LeaseShared::begin`] before it is sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request {
    id: u64,
    /// Read under the lease's lock before the request leaves: no earlier than the instant it could run.
    pub(crate) sent: Instant,
    ttl: Duration,
}

/// A request whose outcome is unknown: in flight, timed out, or lost with its connection.
#[derive(Debug, Clone, Copy)]
struct Unconfirmed {
    /// 0 once merged with others: then it is never confirmed and stays as a bound.
    id: u64,
    sent: Instant,
    ttl: Duration,
}

/// What the validity deadline is computed from. See DESIGN.md, "The validity deadline", for why it is complete.
///
/// The server's expiry is set by whichever expiry-setting request of this grant it ran last: `E = run + ttl`.
/// That request is either the confirmed one that ran last (`base`), or an unconfirmed one that ran after it.
/// For each we know a lower bound of when it ran: the base ran no earlier than `base_start`; an unconfirmed request
/// that ran after the base ran no earlier than its own send instant nor than `base_start`. The deadline is the
/// smallest of these lower bounds plus the respective lease, less the drift allowance.
#[derive(Debug, Clone)]
pub(crate) struct Validity {
    /// No earlier than the instant the last-run confirmed request ran, on our clock.
    base_start: Instant,
    base_ttl: Duration,
    /// When that request ran, in the server's microseconds: replies are ordered by this, not by their send order.
    base_run: i64,
    unconfirmed: Vec<Unconfirmed>,
    next_id: u64,
    /// The deadline computed from the above (cached).
    valid_until: Instant,
}

impl Validity {
    fn new(sent: Instant, ttl: Duration, run: i64) -> Validity {
        let mut validity = Validity {
            base_start: sent,
            base_ttl: ttl,
            base_run: run,
            unconfirmed: Vec::new(),
            next_id: 1,
            valid_until: sent,
        };
        validity.recompute();
        validity
    }

    fn recompute(&mut self) {
        let mut until = self.base_start + self.base_ttl - drift(self.base_ttl);
        for u in &self.unconfirmed {
            until = until.min(u.sent.max(self.base_start) + u.ttl - drift(u.ttl));
        }
        self.valid_until = until;
    }

    fn register(&mut self, ttl: Duration) -> Request {
        let request = Request {
            id: self.next_id,
            sent: clock::now(),
            ttl,
        };
        self.next_id += 1;
        self.unconfirmed.push(Unconfirmed {
            id: request.id,
            sent: request.sent,
            ttl,
        });
        if self.unconfirmed.len() > MAX_UNCONFIRMED {
            self.merge();
        }
        self.recompute();
        request
    }

    /// Replaces the unconfirmed requests of equal lease by one with the earliest send instant. Its bound is no later
    /// than any of theirs, whatever the base becomes, so the deadline stays conservative; it is never confirmed.
    fn merge(&mut self) {
        let mut merged: Vec<Unconfirmed> = Vec::new();
        for u in self.unconfirmed.drain(..) {
            match merged.iter_mut().find(|m| m.ttl == u.ttl) {
                Some(m) => {
                    m.sent = m.sent.min(u.sent);
                    m.id = 0;
                }
                None => merged.push(u),
            }
        }
        self.unconfirmed = merged;
    }

    fn confirm(&mut self, request: Request, run: i64) {
        if let Some(i) = self.unconfirmed.iter().position(|u| u.id == request.id) {
            self.unconfirmed.swap_remove(i);
        }
        if run > self.base_run {
            // It ran after the base, so no earlier than the base did, nor than it was sent.
            self.base_start = self.base_start.max(request.sent);
            self.base_ttl = request.ttl;
            self.base_run = run;
        } else if run == self.base_run {
            // Same microsecond: the order is unknown, so keep the shorter lease.
            self.base_start = self.base_start.max(request.sent);
            self.base_ttl = self.base_ttl.min(request.ttl);
        }
        // A request that ran before the base was overwritten by it: it changes nothing.
        self.recompute();
    }
}

#[derive(Debug, Clone)]
pub(crate) enum Status {
    Held(Validity),
    /// The lease ended; `valid_until` is the last deadline it had.
    Ended {
        reason: LossReason,
        valid_until: Instant,
    },
}

impl Status {
    fn valid_until(&self) -> Instant {
        match self {
            Status::Held(validity) => validity.valid_until,
            Status::Ended { valid_until, .. } => *valid_until,
        }
    }

    fn ended(&self, reason: LossReason) -> Status {
        Status::Ended {
            reason,
            valid_until: self.valid_until(),
        }
    }
}

pub(crate) struct LeaseShared {
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) token: String,
    pub(crate) fence: Fence,
    pub(crate) ttl: Duration,
    /// When the grant's reply was read (for the hold-time metric only; deadlines use `sent`).
    granted: Instant,
    status: Mutex<Status>,
    /// Notified on every change of `status` (a deadline that moves either way, or the end).
    changed: Notify,
}

impl LeaseShared {
    /// A lease of `ttl` (what renewals keep it at), granted by a grant that left the key `left` to live when it ran
    /// at `run` (server µs), and that ran no earlier than `sent` on the lease clock.
    pub(crate) fn new(
        keys: Arc<LockKeys>,
        token: String,
        fence: Fence,
        ttl: Duration,
        sent: Instant,
        left: Duration,
        run: i64,
    ) -> Arc<LeaseShared> {
        Arc::new(LeaseShared {
            keys,
            token,
            fence,
            ttl,
            granted: clock::now(),
            status: Mutex::new(Status::Held(Validity::new(sent, left, run))),
            changed: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn valid_until_now(&self) -> Instant {
        self.lock().valid_until()
    }

    /// Whether the lease ended, and why.
    pub(crate) fn ended(&self) -> Option<LossReason> {
        match &*self.lock() {
            Status::Held(_) => None,
            Status::Ended { reason, .. } => Some(*reason),
        }
    }

    /// Applies `change` to the status; notifies the waiters when it returns true.
    /// Applies `change` (which says whether it changed anything) under the lock; wakes the watchers of a change, and
    /// logs and counts the end of the lease when this change ended it, whichever path ended it.
    fn update<T>(&self, change: impl FnOnce(&mut Status) -> (T, bool)) -> T {
        let (out, changed, ended) = {
            let mut status = self.lock();
            let was_held = matches!(*status, Status::Held(_));
            let (out, changed) = change(&mut status);
            let ended = match &*status {
                Status::Ended { reason, .. } if was_held => Some(*reason),
                _ => None,
            };
            (out, changed, ended)
        };
        if changed {
            self.changed.notify_waiters();
        }
        if let Some(reason) = ended {
            self.log_end(reason);
        }
        out
    }

    pub(crate) fn is_ended(&self) -> bool {
        matches!(&*self.lock(), Status::Ended { .. })
    }

    /// The validity deadline, while the lease is held.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match &*self.lock() {
            Status::Held(validity) => Some(validity.valid_until),
            Status::Ended { .. } => None,
        }
    }

    /// When the loss timer should fire for the current deadline, if the lease is still held.
    pub(crate) fn signal_at(&self) -> Option<Instant> {
        self.deadline().map(|d| d - TIMER_GUARD)
    }

    /// Registers a request that will set the key's expiry to `ttl` from when it runs, *before* it is sent: from
    /// now until it is confirmed, the deadline accounts for it running at any time, including after later
    /// requests (a retried script) and after its reply was lost. `None` when the lease already ended or its
    /// deadline passed (then send nothing).
    pub(crate) fn begin(&self, ttl: Duration) -> Option<Request> {
        let now = clock::now();
        self.update(|status| match status {
            Status::Held(validity) if now < validity.valid_until - TIMER_GUARD => {
                let before = validity.valid_until;
                let request = validity.register(ttl);
                (Some(request), validity.valid_until != before)
            }
            Status::Held(_) => {
                *status = status.ended(LossReason::Expired);
                (None, true)
            }
            Status::Ended { .. } => (None, false),
        })
    }

    /// Records that `request` ran on the server at `run` (server µs) and set the expiry.
    ///
    /// A confirmation that arrives after the deadline passed does not revive the lease: whoever looked in between
    /// was told it was lost, and that must stay true.
    pub(crate) fn confirm(&self, request: Request, run: i64) {
        let now = clock::now();
        self.update(|status| match status {
            Status::Held(validity) if now >= validity.valid_until - TIMER_GUARD => {
                *status = status.ended(LossReason::Expired);
                ((), true)
            }
            Status::Held(validity) => {
                let before = validity.valid_until;
                validity.confirm(request, run);
                ((), validity.valid_until != before)
            }
            Status::Ended { .. } => ((), false),
        });
    }

    /// Ends the lease unless it already ended. Returns true when this call ended it.
    pub(crate) fn end(&self, reason: LossReason) -> bool {
        self.update(|status| match status {
            Status::Held(_) => {
                *status = status.ended(reason);
                (true, true)
            }
            Status::Ended { .. } => (false, false),
        })
    }

    fn log_end(&self, reason: LossReason) {
        crate::metrics::ended(reason, clock::now().saturating_duration_since(self.granted));
        let (lock, fence) = (self.keys.name(), self.fence.get());
        match reason {
            LossReason::Released => tracing::debug!(lock = %lock, fence, "lease ended: released"),
            reason => tracing::warn!(lock = %lock, fence, %reason, "lease lost"),
        }
    }

    /// Ends the lease as [`LossReason::Expired`] if its deadline (less the timer guard) has passed at `now`.
    pub(crate) fn expire_if_due(&self, now: Instant) -> bool {
        self.update(|status| match status {
            Status::Held(validity) if now >= validity.valid_until - TIMER_GUARD => {
                *status = status.ended(LossReason::Expired);
                (true, true)
            }
            _ => (false, false),
        })
    }
}

/// A read-only view of one grant of a lock: its fence, its deadline, and whether it is still held.
///
/// Cheap to clone and `'static`, so it can be moved into the tasks doing the guarded work. A
/// [`MutexGuard`](crate::MutexGuard) dereferences to its `Lease`.
#[derive(Clone)]
pub struct Lease {
    pub(crate) shared: Arc<LeaseShared>,
}

impl Lease {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.shared.keys.name()
    }

    /// The fencing token of this grant: higher than that of every earlier grant of the same lock.
    pub fn fence(&self) -> Fence {
        self.shared.fence
    }

    /// The owner token stored in Redis for this grant (`dl1:` and 32 hex digits; unique per grant).
    pub fn token(&self) -> &str {
        crate::fence::token_of(&self.shared.token)
    }

    /// The lease length that the watchdog keeps renewing (or the fixed lease).
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// The conservative validity deadline: the earliest instant the server could expire the key, given every
    /// request of this grant that may have run last (see the [crate docs](crate#safety-contract)), less the drift
    /// allowance (1 % of the lease plus 2 ms). The server cannot expire the key before this instant unless its clock
    /// jumps.
    ///
    /// It is an instant of the lease clock: tokio's monotonic clock plus the time the machine spent suspended since
    /// the process started (on Linux). Without a suspension the two agree; use [`is_held`](Lease::is_held) rather
    /// than comparing with [`Instant::now`] yourself.
    ///
    /// After the lease ended this is the last deadline it had.
    pub fn valid_until(&self) -> Instant {
        self.shared.valid_until_now()
    }

    /// True while the lease has not ended and its validity deadline lies ahead.
    pub fn is_held(&self) -> bool {
        self.shared
            .deadline()
            .is_some_and(|valid_until| clock::now() < valid_until - TIMER_GUARD)
    }

    /// How the lease ended, or `None` while it is held.
    pub fn loss(&self) -> Option<LossReason> {
        match self.shared.ended() {
            None => (!self.is_held()).then_some(LossReason::Expired),
            reason => reason,
        }
    }

    /// Resolves when the lease ends, with the reason: at the latest at the validity deadline if no renewal was
    /// confirmed by then, at once when a renewal finds the key gone or taken, or with [`LossReason::Released`]
    /// when the guard is released or dropped.
    ///
    /// The returned future owns what it needs (`'static`), so it can be raced against work in another task.
    ///
    /// # Panics
    ///
    /// When polled outside a tokio runtime (its deadline timer needs one); every call that can fail returns
    /// [`Error::NoRuntime`](crate::Error::NoRuntime) instead.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping it changes nothing.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locks: leasehold::Client) -> Result<(), leasehold::Error> {
    /// let guard = locks.mutex("leader").lock().await?;
    /// let lease = guard.lease();
    /// // Step down the moment the lease is lost, whatever else this process is doing.
    /// tokio::spawn(async move {
    ///     let reason = lease.lost().await;
    ///     eprintln!("no longer the leader: {reason}");
    /// });
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        let shared = Arc::clone(&self.shared);
        async move {
            loop {
                // Registered before the status is read, so a change in between still wakes us.
                let changed = shared.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                match shared.deadline() {
                    None => return shared.ended().unwrap_or(LossReason::Expired),
                    Some(valid_until) => {
                        tokio::select! {
                            () = tokio::time::sleep_until(clock::timer_for(valid_until - TIMER_GUARD)) => {
                                shared.expire_if_due(clock::now());
                            }
                            () = changed => {}
                        }
                    }
                }
            }
        }
    }
}

impl Lease {
    /// The start of an explicit extension to `ttl` (a guard's `extend`): the request, registered before it is sent
    /// (if `ttl` is shorter than what the key has now, the deadline drops at once and stays down until a reply says
    /// how it went), or the error when the lease already ended or `ttl` is out of range.
    pub(crate) fn begin_extension(&self, ttl: Duration) -> Result<Request, crate::Error> {
        crate::error::require_runtime()?;
        crate::keys::check_ttl(ttl)?;
        let lost = |reason| crate::Error::LeaseLost {
            name: self.name().to_owned(),
            reason,
        };
        if let Some(reason) = self.loss() {
            return Err(lost(reason));
        }
        self.shared
            .begin(ttl)
            .ok_or_else(|| lost(self.loss().unwrap_or(LossReason::Expired)))
    }

    /// The end of an extension that the lock confirmed: `Ok` unless the lease ended meanwhile.
    pub(crate) fn confirmed_extension(
        &self,
        request: Request,
        run: i64,
    ) -> Result<(), crate::Error> {
        self.shared.confirm(request, run);
        match self.loss() {
            None => Ok(()),
            Some(reason) => Err(crate::Error::LeaseLost {
                name: self.name().to_owned(),
                reason,
            }),
        }
    }

    /// Runs `work` while the lease holds, dropping it the moment the lease is lost (a guard's `run_until_lost`).
    pub(crate) async fn run_until_lost<F: Future>(
        &self,
        work: F,
    ) -> Result<F::Output, crate::Error> {
        crate::error::require_runtime()?;
        let lost = self.lost();
        tokio::select! {
            biased;
            reason = lost => Err(crate::Error::LeaseLost {
                name: self.name().to_owned(),
                reason,
            }),
            output = work => Ok(output),
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.name())
            .field("fence", &self.fence())
            .field("ttl", &self.ttl())
            .field("status", &*self.shared.lock())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// The deadline a request would give if it were the last to run, having run no earlier than `start`.
    fn bound(start: Instant, ttl: Duration) -> Instant {
        start + ttl - drift(ttl)
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_may_shorten_the_key_lowers_the_deadline_before_it_is_sent() {
        let t0 = Instant::now();
        let mut v = Validity::new(t0, 30 * S, 1_000);
        tokio::time::advance(S).await;
        let short = v.register(2 * S);
        // Outcome unknown (in flight, timed out, lost): the key may expire 2 s after it was sent.
        assert_eq!(v.valid_until, bound(short.sent, 2 * S));
        // A standard renewal does not raise it while the short one is unknown.
        tokio::time::advance(S).await;
        let renewal = v.register(30 * S);
        v.confirm(renewal, 3_000);
        assert_eq!(v.valid_until, bound(renewal.sent, 2 * S));
        // Once the short one is confirmed to have run *before* that renewal, it no longer matters.
        v.confirm(short, 2_000);
        assert_eq!(v.valid_until, bound(renewal.sent, 30 * S));
    }

    #[tokio::test(start_paused = true)]
    async fn confirmations_count_in_the_order_the_server_ran_them() {
        // 3 s lease; a renewal is sent, then an extension to 60 s; the server runs the extension first (the renewal
        // was retried after NOSCRIPT), then the renewal, which sets the key back to 3 s.
        let t0 = Instant::now();
        let mut v = Validity::new(t0, 3 * S, 1_000);
        tokio::time::advance(S).await;
        let renewal = v.register(3 * S);
        tokio::time::advance(S / 10).await;
        let extend = v.register(60 * S);
        v.confirm(extend, 2_000);
        // The renewal is still unknown: it could run after the extension.
        assert_eq!(v.valid_until, bound(extend.sent, 3 * S));
        v.confirm(renewal, 3_000);
        // It did run last: the key has 3 s from when it ran, no earlier than the extension was sent.
        assert_eq!(v.valid_until, bound(extend.sent, 3 * S));
        assert!(v.valid_until < t0 + 5 * S);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reply_for_a_request_that_ran_before_the_base_changes_nothing() {
        let t0 = Instant::now();
        let mut v = Validity::new(t0, 3 * S, 1_000);
        let early = v.register(1 * S / 2);
        tokio::time::advance(S).await;
        let later = v.register(3 * S);
        v.confirm(later, 5_000);
        // `early` is still unknown: if it ran after `later`, it ran no earlier than `later` was sent.
        assert_eq!(v.valid_until, bound(later.sent, S / 2));
        v.confirm(early, 4_000);
        assert_eq!(v.valid_until, bound(later.sent, 3 * S));
    }

    #[tokio::test(start_paused = true)]
    async fn a_suspension_longer_than_the_lease_ends_it_at_once() {
        let keys = LockKeys::new("p", "n").unwrap();
        let lease = Lease {
            shared: LeaseShared::new(
                keys,
                "t".into(),
                Fence::new(1),
                30 * S,
                clock::now(),
                30 * S,
                1,
            ),
        };
        assert!(lease.is_held());
        let lost = tokio::spawn(lease.lost());
        tokio::task::yield_now().await;
        // The machine sleeps for a minute: the monotonic clock does not move, the server's does.
        clock::suspend(60 * S);
        assert!(
            !lease.is_held(),
            "a lease outlived a suspension longer than itself"
        );
        // The loss signal follows within one timer period of the resume, not a whole monotonic lease later.
        tokio::time::advance(clock::MAX_SLEEP).await;
        assert_eq!(lost.await.unwrap(), LossReason::Expired);
    }

    #[tokio::test(start_paused = true)]
    async fn merged_unknowns_stay_conservative() {
        let t0 = Instant::now();
        let mut v = Validity::new(t0, 30 * S, 1_000);
        let mut first = None;
        for _ in 0..(MAX_UNCONFIRMED + 5) {
            tokio::time::advance(S / 10).await;
            let r = v.register(2 * S);
            first.get_or_insert(r);
        }
        assert!(v.unconfirmed.len() <= MAX_UNCONFIRMED);
        assert_eq!(v.valid_until, bound(first.unwrap().sent, 2 * S));
        // A later confirmed long renewal moves the base, but the unknown short ones still bound it.
        let renewal = v.register(30 * S);
        v.confirm(renewal, 9_000);
        assert_eq!(v.valid_until, bound(renewal.sent, 2 * S));
    }
}
