//! The lease keeper: one background task per client (or quorum) that renews every watched lease, in batches.
//!
//! Each lease is due for renewal `renew_every` after its last confirmed request, or earlier when its deadline comes
//! closer than the lease's usual slack (an extension to a shorter lease). When the task wakes it takes every lease
//! due within a quarter of its interval, so leases taken at nearby times share one script call: 10,000 held locks
//! cost `10,000 / RENEW_BATCH` calls per round instead of 10,000. Renewing a little early is harmless; every request
//! is registered with its lease before it leaves (see [`LeaseShared::begin`]).
//!
//! A failed call is retried with backoff until the lease's validity deadline; at the deadline the lease ends as
//! [`LossReason::Expired`](crate::LossReason::Expired). That deadline also has its own timer in every
//! [`Lease::lost`](crate::Lease::lost) future, so a stuck request cannot delay the loss signal.
//!
//! Where the leases live is behind [`Renews`]: one server (or a cluster, or the primary the sentinels name) for a
//! [`Client`](crate::Client), a majority of independent nodes for a [`Quorum`](crate::Quorum). The schedule, the
//! batching and the retries are the same for both.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::engine::clock;
use crate::engine::ids::IdMap;
use crate::engine::lease::{LeaseShared, NodeAnswer, Request, Settled};

/// The tracing target of this file's events: the module path it had before the files moved into folders, so that
/// log filters keep working (`leasehold::keeper=debug`).
const TARGET: &str = "leasehold::keeper";

/// The outcome of one renewal call: per node (one on a single server, each node of a quorum), the node's time when
/// the call ran there (µs; it orders the node's replies, which may run in another order than they were sent) and one
/// code per lease as `renew.lua` answers, or `None` for a node that did not answer; or why the call failed, its
/// outcome unknown everywhere.
pub(crate) type Renewed = Result<Vec<Option<NodeReply>>, String>;

/// One node's reply to a renewal call: the node's time when the call ran there (µs), and one code per lease.
pub(crate) type NodeReply = (i64, Vec<i64>);

/// What each node answered for the `lease`-th lease of a renewal call (see [`LeaseShared::settle`]).
pub(crate) fn answers(replies: &[Option<NodeReply>], lease: usize) -> Vec<NodeAnswer> {
    replies
        .iter()
        .map(|node| {
            node.as_ref()
                .and_then(|(run, codes)| codes.get(lease).map(|&code| (*run, code)))
        })
        .collect()
}

/// The most leases one renewal call carries. 10,000 held locks cost 20 calls per renewal round (on one server).
pub(crate) const RENEW_BATCH: usize = 500;

/// Where the watched leases live: renews a batch of them in one call.
pub(crate) trait Renews: Send + Sync + 'static {
    /// Whether one call may carry only leases of one hash slot (Redis Cluster).
    fn by_slot(&self) -> bool;

    /// Renews `leases`, each for its own lease length (see `renew.lua`).
    fn renew<'a>(
        &'a self,
        leases: &'a [Arc<LeaseShared>],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Renewed> + Send + 'a>>;

    /// Renews each batch as [`Renews::renew`] does, all at once (on a cluster, one pipeline per node): one outcome
    /// per batch, in order.
    fn renew_each<'a>(
        &'a self,
        batches: &'a [Vec<Arc<LeaseShared>>],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Vec<Renewed>> + Send + 'a>> {
        Box::pin(join_all(batches.iter().map(|leases| self.renew(leases))))
    }
}

pub(crate) struct Keeper {
    state: Mutex<State>,
    wake: Notify,
    /// The renewal task, once started; started again if the runtime it ran on is gone.
    task: Mutex<Option<JoinHandle<()>>>,
    closed: AtomicBool,
}

#[derive(Default)]
struct State {
    leases: IdMap<u64, Entry>,
    next_id: u64,
    /// When the task plans to wake next; a new lease due earlier must wake it.
    next_wake: Option<Instant>,
}

struct Entry {
    lease: Arc<LeaseShared>,
    every: Duration,
    next_renewal: Instant,
    in_flight: bool,
    failures: u32,
    /// Renew once, then forget the lease.
    once: bool,
}

impl Keeper {
    pub(crate) fn new() -> Keeper {
        Keeper {
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            task: Mutex::new(None),
            closed: AtomicBool::new(false),
        }
    }

    /// Starts renewing a lease every `every`; its grant request left at `sent`. With `once`, renews it once, now (a
    /// fixed lease that a hand-off granted with a shorter claim), and then forgets it. Returns the id to
    /// [`Keeper::forget`] it with.
    ///
    /// Must run inside a tokio runtime (it may start the keeper task).
    pub(crate) fn watch(
        self: &Arc<Self>,
        inner: Weak<dyn Renews>,
        lease: Arc<LeaseShared>,
        sent: Instant,
        every: Duration,
        once: bool,
    ) -> u64 {
        let entry = Entry {
            lease,
            every,
            next_renewal: if once { sent } else { sent + every },
            in_flight: false,
            failures: 0,
            once,
        };
        // A lease granted with less than its usual time left (a hand-off's claim) is due at once.
        let due = entry.due_at();
        let (id, wake) = {
            let mut state = self.lock();
            let id = state.next_id;
            state.next_id += 1;
            state.leases.insert(id, entry);
            let wake = state.next_wake.is_none_or(|at| due < at);
            if wake {
                state.next_wake = Some(due);
            }
            (id, wake)
        };
        let mut task = self.task.lock().unwrap_or_else(|e| e.into_inner());
        if task.as_ref().is_none_or(JoinHandle::is_finished) {
            *task = Some(tokio::spawn(run(Arc::clone(self), inner)));
        } else if wake {
            self.wake.notify_one();
        }
        id
    }

    /// Makes the task look at its schedule again (a deadline moved).
    pub(crate) fn nudge(&self) {
        self.wake.notify_one();
    }

    /// Stops renewing a lease (released or dropped).
    pub(crate) fn forget(&self, id: u64) {
        self.lock().leases.remove(&id);
    }

    /// Ends the task: the client is gone.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// How many leases are being kept (for tests and diagnostics).
    pub(crate) fn len(&self) -> usize {
        self.lock().leases.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock would be a bug in this module; the state stays consistent regardless,
        // so recover it instead of spreading the panic.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends leases past their deadline, marks the due ones in flight and returns them with the next wake time.
    fn collect_due(&self, now: Instant) -> (Vec<(u64, Arc<LeaseShared>)>, Option<Instant>) {
        let mut state = self.lock();
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        state.leases.retain(|&id, entry| {
            if entry.lease.is_ended() || entry.lease.expire_if_due(now) {
                return false;
            }
            if !entry.in_flight {
                let at = entry.due_at();
                if at <= now + entry.every / 4 {
                    entry.in_flight = true;
                    due.push((id, Arc::clone(&entry.lease)));
                } else {
                    next = min_instant(next, at);
                }
            }
            next = min_instant(next, entry.lease.signal_at().unwrap_or(now));
            true
        });
        state.next_wake = next;
        (due, next)
    }

    /// Applies the outcome of one renewal call to its leases: `replies` are the nodes' answers (see [`Renewed`]), or
    /// `None` when the call failed (or was dropped) and its outcome is unknown.
    fn settle(&self, batch: &[Renewal], replies: Option<&[Option<NodeReply>]>) {
        let mut state = self.lock();
        for (i, renewal) in batch.iter().enumerate() {
            let Some(entry) = state.leases.get_mut(&renewal.id) else {
                continue; // released while the call was out
            };
            entry.in_flight = false;
            let settled =
                replies.map(|replies| renewal.lease.settle(renewal.request, &answers(replies, i)));
            match settled {
                Some(Settled::Renewed) => {
                    entry.failures = 0;
                    entry.next_renewal = renewal.request.sent + entry.every;
                    if entry.once {
                        state.leases.remove(&renewal.id);
                    }
                }
                Some(Settled::Lost(code)) => {
                    if code == -2 {
                        tracing::warn!(target: TARGET, lock = %renewal.lease.keys.name(), "the lock key now holds another Redis type; lease lost");
                    }
                    state.leases.remove(&renewal.id);
                }
                Some(Settled::Ended) => {
                    state.leases.remove(&renewal.id);
                }
                // The call failed (or answered short, or too few nodes answered): the request stays unconfirmed in
                // the lease, whose deadline already allows for it; retry soon, the deadline timer guards the rest.
                Some(Settled::Unknown) | None => {
                    entry.failures = entry.failures.saturating_add(1);
                    let backoff =
                        crate::engine::backoff::Backoff::after(entry.failures).min(entry.every / 2);
                    entry.next_renewal = clock::now() + backoff;
                }
            }
        }
    }
}

impl Entry {
    /// When this lease should be renewed: `every` after its last confirmed renewal, or sooner when its deadline
    /// leaves less than the usual slack (`ttl - every`), as after an extension to a shorter lease.
    fn due_at(&self) -> Instant {
        match self.lease.deadline() {
            Some(deadline) => {
                let slack = self.lease.ttl.saturating_sub(self.every);
                self.next_renewal
                    .min(deadline.checked_sub(slack).unwrap_or(deadline))
            }
            None => self.next_renewal,
        }
    }
}

/// One lease in a renewal call.
struct Renewal {
    id: u64,
    lease: Arc<LeaseShared>,
    request: Request,
}

/// A renewal call's leases, settled as failed if the task is dropped before the reply (its runtime shut down):
/// otherwise they would stay in flight, and unrenewed, forever.
struct InFlight {
    keeper: Arc<Keeper>,
    batch: Vec<Renewal>,
    settled: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.settled {
            self.keeper.settle(&self.batch, None);
        }
    }
}

fn min_instant(a: Option<Instant>, b: Instant) -> Option<Instant> {
    Some(a.map_or(b, |a| a.min(b)))
}

async fn run(keeper: Arc<Keeper>, inner: Weak<dyn Renews>) {
    loop {
        if keeper.closed.load(Ordering::Acquire) {
            return;
        }
        let now = clock::now();
        let (due, next) = keeper.collect_due(now);
        if !due.is_empty() {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            tokio::spawn(renew(
                Arc::clone(&keeper),
                inner.clone(),
                batches(due, inner.by_slot()),
            ));
        }
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(clock::timer_for(at)) => {}
                    () = keeper.wake.notified() => {}
                }
            }
            None => keeper.wake.notified().await,
        }
    }
}

/// The renewal calls for `due`: at most [`RENEW_BATCH`] leases each, and on a cluster (`by_slot`) only leases of one
/// hash slot each, since a script's keys must share a slot there. 10,000 locks spread over a cluster's 16,384 slots
/// therefore cost about one script call per lock and round; they run at once, those of one node in one pipeline
/// ([`Renews::renew_each`]).
fn batches(
    mut due: Vec<(u64, Arc<LeaseShared>)>,
    by_slot: bool,
) -> Vec<Vec<(u64, Arc<LeaseShared>)>> {
    let mut batches = Vec::new();
    if by_slot {
        due.sort_by_key(|(_, lease)| lease.keys.slot());
    }
    while !due.is_empty() {
        let mut len = due.len().min(RENEW_BATCH);
        if by_slot {
            let slot = due[0].1.keys.slot();
            len = due[..len]
                .iter()
                .position(|(_, lease)| lease.keys.slot() != slot)
                .unwrap_or(len);
        }
        let rest = due.split_off(len);
        batches.push(due);
        due = rest;
    }
    batches
}

/// Renews `due`'s batches at once, and settles each with its outcome.
async fn renew(
    keeper: Arc<Keeper>,
    inner: Arc<dyn Renews>,
    due: Vec<Vec<(u64, Arc<LeaseShared>)>>,
) {
    let mut calls = Vec::with_capacity(due.len());
    let mut leases = Vec::with_capacity(due.len());
    let mut ended = Vec::new();
    for batch in due {
        let mut call = InFlight {
            keeper: Arc::clone(&keeper),
            batch: Vec::with_capacity(batch.len()),
            settled: false,
        };
        let mut shared = Vec::with_capacity(batch.len());
        for (id, lease) in batch {
            // Registered before the call leaves: see `LeaseShared::begin`.
            match lease.begin(lease.ttl) {
                Some(request) => {
                    shared.push(Arc::clone(&lease));
                    call.batch.push(Renewal { id, lease, request });
                }
                None => ended.push(id),
            }
        }
        if !call.batch.is_empty() {
            calls.push(call);
            leases.push(shared);
        }
    }
    for id in ended {
        keeper.forget(id);
    }
    if !calls.is_empty() {
        let replies = inner.renew_each(&leases).await;
        let mut replies = replies.into_iter();
        for call in &mut calls {
            call.settled = true;
            let reply = replies
                .next()
                .unwrap_or_else(|| Err("no reply for this renewal batch".to_owned()));
            settle_call(&keeper, &call.batch, reply);
        }
    }
    keeper.wake.notify_one();
}

/// Settles one renewal call's leases with its outcome.
fn settle_call(keeper: &Keeper, batch: &[Renewal], reply: Renewed) {
    let complete = |replies: &[Option<NodeReply>]| {
        replies
            .iter()
            .flatten()
            .all(|(_, codes)| codes.len() == batch.len())
    };
    match reply {
        Ok(replies) if complete(&replies) => {
            let renewed = |i: usize| replies.iter().flatten().any(|(_, codes)| codes[i] == 1);
            let renewed = (0..batch.len()).filter(|&i| renewed(i)).count();
            crate::engine::metrics::renewals(renewed, 0);
            tracing::debug!(target: TARGET, leases = batch.len(), renewed, "renewal batch");
            keeper.settle(batch, Some(&replies));
        }
        Ok(_) => {
            crate::engine::metrics::renewals(0, batch.len());
            tracing::warn!(target: TARGET,
                leases = batch.len(),
                "unexpected renewal reply; retrying until the deadline"
            );
            keeper.settle(batch, None);
        }
        Err(err) => {
            crate::engine::metrics::renewals(0, batch.len());
            tracing::warn!(target: TARGET, leases = batch.len(), error = %err, "lease renewal failed; retrying until the deadline");
            keeper.settle(batch, None);
        }
    }
}
