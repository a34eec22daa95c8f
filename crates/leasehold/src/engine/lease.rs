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

use crate::engine::clock;
use crate::engine::keys::LockKeys;
use crate::engine::ttl::drift;
use crate::fence::Fence;

/// Why a lease ended: it lives in `error.rs`, which names it, below the engine.
pub use crate::error::LossReason;

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

/// What one node's expiry of the key is computed from. See DESIGN.md, "The validity deadline", for why it is complete.
///
/// The node's expiry is set by whichever expiry-setting request of this grant it ran last: `E = run + ttl`.
/// That request is either the confirmed one that ran last (`base`), or an unconfirmed one that ran after it.
/// For each we know a lower bound of when it ran: the base ran no earlier than `base.start`; an unconfirmed request
/// that ran after the base ran no earlier than its own send instant nor than `base.start`. The node's bound is the
/// smallest of these lower bounds plus the respective lease, less the drift allowance.
#[derive(Debug, Clone)]
struct NodeExpiry {
    /// The confirmed request that ran last on this node; `None` while the node is not known to hold the key (it
    /// did not grant, or a request found the key gone or taken there).
    base: Option<Base>,
    /// The renewal code of the request that found the key gone (0) or taken (< 0) on this node, since.
    refused: Option<i64>,
    unconfirmed: Vec<Unconfirmed>,
}

#[derive(Debug, Clone, Copy)]
struct Base {
    /// No earlier than the instant the request ran, on our clock.
    start: Instant,
    ttl: Duration,
    /// When it ran, in the node's microseconds: replies are ordered by this, not by their send order.
    run: i64,
}

impl NodeExpiry {
    fn bound(&self) -> Option<Instant> {
        let base = self.base?;
        let mut until = base.start + base.ttl - drift(base.ttl);
        for u in &self.unconfirmed {
            until = until.min(u.sent.max(base.start) + u.ttl - drift(u.ttl));
        }
        Some(until)
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

    /// `request` was answered here: it is no longer unknown.
    fn answered(&mut self, request: Request) {
        if let Some(i) = self.unconfirmed.iter().position(|u| u.id == request.id) {
            self.unconfirmed.swap_remove(i);
        }
    }

    fn confirm(&mut self, request: Request, run: i64) {
        self.answered(request);
        self.refused = None;
        match &mut self.base {
            // It ran after the base, so no earlier than the base did, nor than it was sent.
            Some(base) if run > base.run => {
                base.start = base.start.max(request.sent);
                base.ttl = request.ttl;
                base.run = run;
            }
            // Same microsecond: the order is unknown, so keep the shorter lease.
            Some(base) if run == base.run => {
                base.start = base.start.max(request.sent);
                base.ttl = base.ttl.min(request.ttl);
            }
            // A request that ran before the base was overwritten by it: it changes nothing.
            Some(_) => {}
            // A node that held the key without our knowing (a late grant): this request's run is the first fact.
            None => {
                self.base = Some(Base {
                    start: request.sent,
                    ttl: request.ttl,
                    run,
                });
            }
        }
    }

    /// A request found the key gone or held by another owner on this node: renewals never re-create it, so the node
    /// no longer counts, until a later request is confirmed there (only a grant that landed late can do that).
    fn refuse(&mut self, request: Request, code: i64) {
        self.answered(request);
        self.base = None;
        self.refused = Some(code);
    }
}

/// What the validity deadline is computed from: one view of the key's expiry per node that holds it (one on a single
/// server), and the deadline a majority of them supports.
///
/// On a quorum each node runs one client's requests in an order of its own (a script re-sent after `NOSCRIPT` runs
/// behind later requests; a request retried on a fresh connection runs after whatever the new connection carried), so
/// each node's replies are ordered by that node's clock, as on one server, never by the order they were sent in.
/// The lock is safe from other owners while a majority of the nodes keep the key: the deadline is the `majority`-th
/// latest of the nodes' bounds, and when fewer than a majority are known to hold the key the lease has ended.
#[derive(Debug, Clone)]
pub(crate) struct Validity {
    nodes: Vec<NodeExpiry>,
    majority: usize,
    next_id: u64,
    /// The deadline computed from the above (cached).
    valid_until: Instant,
}

/// A node's answer to one request of a lease: `Some((run, code))` with the node's time in µs and the code of
/// `renew.lua` (1 renewed, 0 gone, -1 taken, -2 another type), `None` when it did not answer.
pub(crate) type NodeAnswer = Option<(i64, i64)>;

/// What the answers to one request add up to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// A majority ran it and still hold the key.
    Renewed,
    /// So many nodes found the key gone or taken that no majority holds it: the lease ended, with this code of the
    /// node answers (-1 when any node found another owner).
    Lost(i64),
    /// Neither: too few answered. The request stays unconfirmed where nobody answered.
    Unknown,
    /// The lease had ended (or its deadline passed) before the answers came: they change nothing.
    Ended,
}

impl Validity {
    /// A grant on one node that ran at `run` and left the key `left` to live, sent at `sent`.
    #[cfg(test)]
    fn new(sent: Instant, left: Duration, run: i64) -> Validity {
        Validity::granted(sent, left, &[Some(run)])
    }

    /// A grant sent at `sent` that left the key `left` to live on the nodes of `runs` that are `Some` (with the
    /// node's time when it ran); the other nodes do not hold it as far as anyone knows. A majority is more than half
    /// of all nodes.
    fn granted(sent: Instant, left: Duration, runs: &[Option<i64>]) -> Validity {
        let nodes = runs
            .iter()
            .map(|run| NodeExpiry {
                base: run.map(|run| Base {
                    start: sent,
                    ttl: left,
                    run,
                }),
                refused: None,
                unconfirmed: Vec::new(),
            })
            .collect();
        let mut validity = Validity {
            nodes,
            majority: runs.len() / 2 + 1,
            next_id: 1,
            valid_until: sent,
        };
        validity.recompute();
        validity
    }

    /// Recomputes the deadline; false when no majority of the nodes is known to hold the key any more (the lease is
    /// then over, and keeps the last deadline it had).
    fn recompute(&mut self) -> bool {
        let until = match self.nodes.as_slice() {
            // One server: its bound, without the allocation below (the keeper's hot path).
            [node] => node.bound(),
            nodes => {
                let mut bounds: Vec<Instant> = nodes.iter().filter_map(NodeExpiry::bound).collect();
                bounds.sort_unstable_by(|a, b| b.cmp(a));
                bounds.get(self.majority - 1).copied()
            }
        };
        match until {
            Some(until) => {
                self.valid_until = until;
                true
            }
            None => false,
        }
    }

    fn register(&mut self, ttl: Duration) -> Request {
        let request = Request {
            id: self.next_id,
            sent: clock::now(),
            ttl,
        };
        self.next_id += 1;
        for node in &mut self.nodes {
            node.unconfirmed.push(Unconfirmed {
                id: request.id,
                sent: request.sent,
                ttl,
            });
            if node.unconfirmed.len() > MAX_UNCONFIRMED {
                node.merge();
            }
        }
        self.recompute();
        request
    }

    /// Applies each node's answer to `request` (one per node, in node order).
    fn settle(&mut self, request: Request, answers: &[NodeAnswer]) -> Settled {
        let mut renewed = 0;
        for (node, answer) in self.nodes.iter_mut().zip(answers) {
            match *answer {
                Some((run, 1)) => {
                    node.confirm(request, run);
                    renewed += 1;
                }
                Some((_, code)) => node.refuse(request, code),
                None => {}
            }
        }
        if !self.recompute() {
            let code = self
                .nodes
                .iter()
                .filter_map(|n| n.refused)
                .min()
                .unwrap_or(0);
            return Settled::Lost(code);
        }
        if renewed >= self.majority {
            Settled::Renewed
        } else {
            Settled::Unknown
        }
    }

    /// A single server's confirmation: `request` ran at `run` and set the expiry.
    #[cfg(test)]
    fn confirm(&mut self, request: Request, run: i64) {
        self.settle(request, &[Some((run, 1))]);
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
        LeaseShared::with(
            keys,
            token,
            fence,
            ttl,
            Validity::granted(sent, left, &[Some(run)]),
        )
    }

    /// A lease of `ttl` held on a majority of nodes: granted with its whole lease by a round sent at `sent` on the
    /// nodes of `runs` that are `Some` (the node's time when its grant ran, µs), one entry per node of the quorum.
    pub(crate) fn on_nodes(
        keys: Arc<LockKeys>,
        token: String,
        fence: Fence,
        ttl: Duration,
        sent: Instant,
        runs: &[Option<i64>],
    ) -> Arc<LeaseShared> {
        LeaseShared::with(keys, token, fence, ttl, Validity::granted(sent, ttl, runs))
    }

    fn with(
        keys: Arc<LockKeys>,
        token: String,
        fence: Fence,
        ttl: Duration,
        validity: Validity,
    ) -> Arc<LeaseShared> {
        Arc::new(LeaseShared {
            keys,
            token,
            fence,
            ttl,
            granted: clock::now(),
            status: Mutex::new(Status::Held(validity)),
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
    pub(crate) fn confirm(&self, request: Request, run: i64) {
        self.settle(request, &[Some((run, 1))]);
    }

    /// Applies the answers of the nodes (one per node, in node order; one on a single server) to `request`: each
    /// node that renewed moves its own view of the expiry, ordered by its own clock; a node that found the key gone
    /// or taken no longer counts; the deadline is the one a majority supports. Ends the lease when no majority holds
    /// the key any more.
    ///
    /// A confirmation that arrives after the deadline passed does not revive the lease: whoever looked in between
    /// was told it was lost, and that must stay true.
    pub(crate) fn settle(&self, request: Request, answers: &[NodeAnswer]) -> Settled {
        let now = clock::now();
        self.update(|status| match status {
            Status::Held(validity) if now >= validity.valid_until - TIMER_GUARD => {
                *status = status.ended(LossReason::Expired);
                (Settled::Ended, true)
            }
            Status::Held(validity) => {
                let before = validity.valid_until;
                let settled = validity.settle(request, answers);
                if let Settled::Lost(code) = settled {
                    *status = status.ended(loss_reason(code));
                    return (settled, true);
                }
                (settled, validity.valid_until != before)
            }
            Status::Ended { .. } => (Settled::Ended, false),
        })
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
        crate::engine::metrics::ended(reason, clock::now().saturating_duration_since(self.granted));
        let (lock, fence) = (self.keys.name(), self.fence.get());
        let kind = crate::engine::trace::kind_of_hold(&self.token);
        let hold = || crate::engine::trace::words(&self.token);
        match reason {
            LossReason::Released => {
                crate::engine::trace::kind_event!(kind, debug, lock = %lock, hold = %hold(), fence, "lease ended: released")
            }
            reason => {
                crate::engine::trace::kind_event!(kind, warn, lock = %lock, hold = %hold(), fence, %reason, "lease lost")
            }
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

    /// The time left on the grant: from now to its validity deadline ([`valid_until`](Lease::valid_until)), less
    /// the small margin [`is_held`](Lease::is_held) keeps; zero once the lease ended. Guards dereference to their
    /// lease, so `guard.remaining()` reads the same.
    ///
    /// Renewals move it forward: with the watchdog on it starts near the lease and stays above two thirds of it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locks: leasehold::Client) -> Result<(), leasehold::Error> {
    /// use std::time::Duration;
    ///
    /// let guard = locks.mutex("batch").ttl(Duration::from_secs(60)).fixed_lease().lock().await?;
    /// if guard.remaining() < Duration::from_secs(10) {
    ///     guard.extend(Duration::from_secs(60)).await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn remaining(&self) -> Duration {
        self.shared
            .deadline()
            .map_or(Duration::ZERO, |valid_until| {
                (valid_until - TIMER_GUARD).saturating_duration_since(clock::now())
            })
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
        crate::engine::ttl::check_ttl(ttl)?;
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
        self.ended_extension()
    }

    /// The end of an extension whose answers were applied: `Ok` unless the lease ended meanwhile.
    pub(crate) fn ended_extension(&self) -> Result<(), crate::Error> {
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

/// The code of a renewal or extension answer that is not 1 (renewed), as the reason the lease ended: 0 the lock is
/// gone, anything else another owner holds it (or something that is not a lock).
pub(crate) fn loss_reason(code: i64) -> LossReason {
    match code {
        0 => LossReason::Gone,
        _ => LossReason::Taken,
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
    async fn on_a_quorum_each_node_orders_its_replies_by_its_own_clock() {
        // The outside review's schedule: 3 nodes, 3 s lease; the keeper's renewal meets NOSCRIPT and is re-sent
        // while an extension to 60 s goes out; every node runs the extension first and the 3 s renewal last. The
        // replies come back in send order's reverse, each stamped with the node's own clock.
        let t0 = Instant::now();
        let mut v = Validity::granted(t0, 3 * S, &[Some(1_000), Some(5_000), Some(9_000)]);
        tokio::time::advance(S).await;
        let renewal = v.register(3 * S);
        tokio::time::advance(S / 10).await;
        let extend = v.register(60 * S);
        let ran = |offsets: [i64; 3], at: i64| offsets.map(|o| Some((o + at, 1)));
        let clocks = [1_000, 5_000, 9_000];
        assert_eq!(v.settle(extend, &ran(clocks, 2_000)), Settled::Renewed);
        // The renewal is still unknown everywhere: it may run after the extension, and does.
        assert_eq!(v.valid_until, bound(extend.sent, 3 * S));
        assert_eq!(v.settle(renewal, &ran(clocks, 3_000)), Settled::Renewed);
        assert_eq!(v.valid_until, bound(extend.sent, 3 * S));
        assert!(
            v.valid_until < t0 + 5 * S,
            "the holder believes in the 60 s extension"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn on_a_quorum_the_deadline_is_the_one_a_majority_supports() {
        let t0 = Instant::now();
        let mut v = Validity::granted(t0, 3 * S, &[Some(10), Some(10), Some(10), None, None]);
        tokio::time::advance(S).await;
        // One node confirms a 60 s extension, the other two granting nodes do not answer: the bound of a majority
        // (the third latest) is still the grant's.
        let extend = v.register(60 * S);
        let only_first = [Some((20, 1)), None, None, None, None];
        assert_eq!(v.settle(extend, &only_first), Settled::Unknown);
        assert_eq!(v.valid_until, bound(t0, 3 * S));
        // A late grant on a fourth node, found by a renewal, counts from then on.
        let renewal = v.register(3 * S);
        let answers = [Some((30, 1)), Some((30, 1)), None, Some((30, 1)), None];
        assert_eq!(v.settle(renewal, &answers), Settled::Renewed);
        assert_eq!(v.valid_until, bound(renewal.sent, 3 * S));
        // Two of the four holders find the key gone: two still hold it, fewer than a majority of five.
        let next = v.register(3 * S);
        let gone = [Some((40, 0)), Some((40, -1)), None, Some((40, 1)), None];
        assert_eq!(v.settle(next, &gone), Settled::Lost(-1));
    }

    #[tokio::test(start_paused = true)]
    async fn on_a_quorum_a_node_that_found_the_key_gone_counts_no_more() {
        let t0 = Instant::now();
        let mut v = Validity::granted(t0, 3 * S, &[Some(10), Some(10), Some(10)]);
        let first = v.register(3 * S);
        // One node lost it (FLUSHALL): two of three still hold it.
        assert_eq!(
            v.settle(first, &[Some((20, 0)), None, None]),
            Settled::Unknown
        );
        // Another renewal: a second node says gone. The first is not asked to say it again.
        let second = v.register(3 * S);
        assert_eq!(
            v.settle(second, &[None, Some((30, 0)), Some((30, 1))]),
            Settled::Lost(0)
        );
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
        assert!(v.nodes[0].unconfirmed.len() <= MAX_UNCONFIRMED);
        assert_eq!(v.valid_until, bound(first.unwrap().sent, 2 * S));
        // A later confirmed long renewal moves the base, but the unknown short ones still bound it.
        let renewal = v.register(30 * S);
        v.confirm(renewal, 9_000);
        assert_eq!(v.valid_until, bound(renewal.sent, 2 * S));
    }
}
