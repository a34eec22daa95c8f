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

#[derive(Debug, Clone, Copy)]
pub(crate) enum Status {
    Held {
        /// Conservative end of the lease on our monotonic clock.
        valid_until: Instant,
        /// When the request behind `valid_until` was sent; later confirmations of earlier requests are ignored.
        confirmed_sent: Instant,
    },
    /// The lease ended; `valid_until` is the last deadline it had.
    Ended {
        reason: LossReason,
        valid_until: Instant,
    },
}

impl Status {
    fn valid_until(&self) -> Instant {
        match *self {
            Status::Held { valid_until, .. } | Status::Ended { valid_until, .. } => valid_until,
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
    status: Mutex<Status>,
    /// Notified on every change of `status`.
    changed: Notify,
}

impl LeaseShared {
    pub(crate) fn new(
        keys: Arc<LockKeys>,
        token: String,
        fence: Fence,
        ttl: Duration,
        sent: Instant,
    ) -> Arc<LeaseShared> {
        Arc::new(LeaseShared {
            keys,
            token,
            fence,
            ttl,
            status: Mutex::new(Status::Held {
                valid_until: sent + ttl - drift(ttl),
                confirmed_sent: sent,
            }),
            changed: Notify::new(),
        })
    }

    pub(crate) fn status(&self) -> Status {
        *self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `change` to the status; notifies the waiters when it returns true.
    fn update(&self, change: impl FnOnce(&mut Status) -> bool) -> bool {
        let changed = change(&mut self.status.lock().unwrap_or_else(|e| e.into_inner()));
        if changed {
            self.changed.notify_waiters();
        }
        changed
    }

    pub(crate) fn is_ended(&self) -> bool {
        matches!(self.status(), Status::Ended { .. })
    }

    /// When the loss timer should fire for the current deadline, if the lease is still held.
    pub(crate) fn signal_at(&self) -> Option<Instant> {
        match self.status() {
            Status::Held { valid_until, .. } => Some(valid_until - TIMER_GUARD),
            Status::Ended { .. } => None,
        }
    }

    /// Records a confirmed extension to `ttl`, measured from `sent`, the instant before the request left.
    ///
    /// A confirmation that arrives after the deadline passed does not revive the lease: whoever looked in between
    /// was told it was lost, and that must stay true.
    pub(crate) fn confirm(&self, sent: Instant, ttl: Duration) {
        let now = Instant::now();
        self.update(|status| match status {
            Status::Held {
                valid_until,
                confirmed_sent,
            } => {
                if now >= *valid_until - TIMER_GUARD {
                    *status = status.ended(LossReason::Expired);
                    true
                } else if sent >= *confirmed_sent {
                    *valid_until = sent + ttl - drift(ttl);
                    *confirmed_sent = sent;
                    true
                } else {
                    false
                }
            }
            Status::Ended { .. } => false,
        });
    }

    /// Ends the lease unless it already ended. Returns true when this call ended it.
    pub(crate) fn end(&self, reason: LossReason) -> bool {
        self.update(|status| match status {
            Status::Held { .. } => {
                *status = status.ended(reason);
                true
            }
            Status::Ended { .. } => false,
        })
    }

    /// Ends the lease as [`LossReason::Expired`] if its deadline (less the timer guard) has passed at `now`.
    pub(crate) fn expire_if_due(&self, now: Instant) -> bool {
        self.update(|status| match status {
            Status::Held { valid_until, .. } if now >= *valid_until - TIMER_GUARD => {
                *status = status.ended(LossReason::Expired);
                true
            }
            _ => false,
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
        &self.shared.token
    }

    /// The lease length that the watchdog keeps renewing (or the fixed lease).
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// The conservative validity deadline on the monotonic clock: measured from the instant *before* the last
    /// confirmed acquire or renewal request was sent, plus the lease, minus the drift allowance (1 % of the lease
    /// plus 2 ms). The server cannot expire the key before this instant unless its clock jumps.
    ///
    /// After the lease ended this is the last deadline it had.
    pub fn valid_until(&self) -> Instant {
        self.shared.status().valid_until()
    }

    /// True while the lease has not ended and its validity deadline lies ahead.
    pub fn is_held(&self) -> bool {
        match self.shared.status() {
            Status::Held { valid_until, .. } => Instant::now() < valid_until - TIMER_GUARD,
            Status::Ended { .. } => false,
        }
    }

    /// How the lease ended, or `None` while it is held.
    pub fn loss(&self) -> Option<LossReason> {
        match self.shared.status() {
            Status::Held { .. } => (!self.is_held()).then_some(LossReason::Expired),
            Status::Ended { reason, .. } => Some(reason),
        }
    }

    /// Resolves when the lease ends, with the reason: at the latest at the validity deadline if no renewal was
    /// confirmed by then, at once when a renewal finds the key gone or taken, or with [`LossReason::Released`]
    /// when the guard is released or dropped.
    ///
    /// The returned future owns what it needs (`'static`), so it can be raced against work in another task.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping it changes nothing.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locks: dlock::Client) -> Result<(), dlock::Error> {
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
                match shared.status() {
                    Status::Ended { reason, .. } => return reason,
                    Status::Held { valid_until, .. } => {
                        tokio::select! {
                            () = tokio::time::sleep_until(valid_until - TIMER_GUARD) => {
                                shared.expire_if_due(Instant::now());
                            }
                            () = changed => {}
                        }
                    }
                }
            }
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.name())
            .field("fence", &self.fence())
            .field("ttl", &self.ttl())
            .field("status", &self.shared.status())
            .finish()
    }
}
