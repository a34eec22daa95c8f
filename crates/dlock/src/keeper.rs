//! The lease keeper: one background task per client that renews every watched lease, in batches.
//!
//! Each lease is due for renewal `renew_every` after its last confirmed request. When the task wakes it takes every
//! lease due within a quarter of its interval, so leases taken at nearby times share one script call: 10,000 held
//! locks cost `10,000 / RENEW_BATCH` calls per round instead of 10,000. Renewing a little early is harmless; the
//! lease is measured from the instant each request leaves.
//!
//! A failed call is retried with backoff until the lease's validity deadline; at the deadline the lease ends as
//! [`LossReason::Expired`](crate::LossReason::Expired). That deadline also has its own timer in every
//! [`Lease::lost`](crate::Lease::lost) future, so a stuck request cannot delay the loss signal.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::client::Inner;
use crate::keys::millis;
use crate::lease::{LeaseShared, LossReason};
use crate::scripts::{RENEW, RENEW_BATCH};

/// First retry delay after a failed renewal; doubles per failure up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(1);

pub(crate) struct Keeper {
    state: Mutex<State>,
    wake: Notify,
    /// The renewal task, once started; started again if the runtime it ran on is gone.
    task: Mutex<Option<JoinHandle<()>>>,
    closed: AtomicBool,
}

#[derive(Default)]
struct State {
    leases: HashMap<u64, Entry>,
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

    /// Starts renewing a lease every `every`; its grant request left at `sent`. Returns the id to
    /// [`Keeper::forget`] it with.
    ///
    /// Must run inside a tokio runtime (it may start the keeper task).
    pub(crate) fn watch(
        self: &Arc<Self>,
        inner: Weak<Inner>,
        lease: Arc<LeaseShared>,
        sent: Instant,
        every: Duration,
    ) -> u64 {
        let next_renewal = sent + every;
        let (id, wake) = {
            let mut state = self.lock();
            let id = state.next_id;
            state.next_id += 1;
            state.leases.insert(
                id,
                Entry {
                    lease,
                    every,
                    next_renewal,
                    in_flight: false,
                    failures: 0,
                },
            );
            let wake = state.next_wake.is_none_or(|at| next_renewal < at);
            if wake {
                state.next_wake = Some(next_renewal);
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
                if entry.next_renewal <= now + entry.every / 4 {
                    entry.in_flight = true;
                    due.push((id, Arc::clone(&entry.lease)));
                } else {
                    next = min_instant(next, entry.next_renewal);
                }
            }
            next = min_instant(next, entry.lease.signal_at().unwrap_or(now));
            true
        });
        state.next_wake = next;
        (due, next)
    }

    /// Applies the outcome of one renewal call to its leases.
    fn settle(&self, batch: &[(u64, Arc<LeaseShared>)], sent: Instant, codes: Option<&[i64]>) {
        let mut state = self.lock();
        for (i, (id, lease)) in batch.iter().enumerate() {
            let Some(entry) = state.leases.get_mut(id) else {
                continue; // released while the call was out
            };
            entry.in_flight = false;
            match codes.map(|c| c.get(i).copied()) {
                Some(Some(1)) => {
                    lease.confirm(sent, lease.ttl);
                    entry.failures = 0;
                    entry.next_renewal = sent + entry.every;
                }
                Some(Some(code)) => {
                    lease.end(if code == 0 {
                        LossReason::Gone
                    } else {
                        LossReason::Taken
                    });
                    state.leases.remove(id);
                }
                // The call failed (or answered short): retry soon, the deadline timer guards the rest.
                Some(None) | None => {
                    entry.failures = entry.failures.saturating_add(1);
                    let backoff = RETRY_MIN
                        .saturating_mul(1 << entry.failures.min(8))
                        .min(RETRY_MAX)
                        .min(entry.every / 2);
                    entry.next_renewal = Instant::now() + backoff;
                }
            }
        }
    }
}

fn min_instant(a: Option<Instant>, b: Instant) -> Option<Instant> {
    Some(a.map_or(b, |a| a.min(b)))
}

async fn run(keeper: Arc<Keeper>, inner: Weak<Inner>) {
    loop {
        if keeper.closed.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        let (due, next) = keeper.collect_due(now);
        if !due.is_empty() {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            let mut due = due;
            while !due.is_empty() {
                let rest = due.split_off(due.len().min(RENEW_BATCH));
                tokio::spawn(renew(Arc::clone(&keeper), Arc::clone(&inner), due));
                due = rest;
            }
        }
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = keeper.wake.notified() => {}
                }
            }
            None => keeper.wake.notified().await,
        }
    }
}

async fn renew(keeper: Arc<Keeper>, inner: Arc<Inner>, batch: Vec<(u64, Arc<LeaseShared>)>) {
    let mut invocation = RENEW.prepare_invoke();
    for (_, lease) in &batch {
        invocation
            .key(&lease.keys.lock)
            .arg(&lease.token)
            .arg(millis(lease.ttl));
    }
    let mut conn = inner.conn.clone();
    let sent = Instant::now();
    let reply: Result<Vec<i64>, _> = invocation.invoke_async(&mut conn).await;
    match &reply {
        Ok(codes) => keeper.settle(&batch, sent, Some(codes)),
        Err(err) => {
            tracing::warn!(leases = batch.len(), error = %err, "lease renewal failed; retrying until the deadline");
            keeper.settle(&batch, sent, None);
        }
    }
    keeper.wake.notify_one();
}
