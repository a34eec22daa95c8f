//! The queued kinds' acquisition on Redis ([`FairMutex`](crate::FairMutex), [`RwLock`](crate::RwLock),
//! [`Semaphore`](crate::Semaphore), [`ReentrantMutex`](crate::ReentrantMutex)): one attempt (`set_acquire.lua`,
//! coalesced), a try, and the wait, in which every waiting task has its own entry in the lock's queue (so that grants
//! follow the order of arrival at Redis across every waiter of every process) and leaves it when its wait ends
//! ([`Leave`]). The admission rule lives in `scripts/set.lua`; what follows a grant is the mutex's (`grant.rs`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::redis::acquire::{
    acquire_call_outcomes, is_server_error, release_orphaned, until, AcquireReply, Outage,
};
use crate::backend::redis::batch::{self, Coalescer, Failure, Item};
use crate::backend::redis::conn::{ReplicaAcks, Sent};
use crate::backend::redis::foreign::{explain_foreign, foreign, held_as, not_a_lock};
use crate::backend::redis::grant::{new_grant, take_hand_off, unreplicated, Expiry, Grant};
use crate::backend::redis::release::{add_lock_keys, release_in_background};
use crate::backend::redis::scripts::{Numbers, ScriptCall, CLAIM, HEARTBEAT, LEAVE, SET_ACQUIRE};
use crate::backend::redis::store::RedisStore;
use crate::backend::redis::wake::Expecting;
use crate::backend::{Ask, Handle};
use crate::engine::keys::{millis, LockKeys};
use crate::error::Error;
use crate::fence::new_token;

/// The tracing target of this file's events: the module path the queued kinds' acquisition had before it moved here,
/// so that log filters keep working (`leasehold::queued=debug`).
const TARGET: &str = "leasehold::queued";

/// How an attempt relates to waiting (`set_acquire.lua`'s mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Try,
    First,
    Again,
}

enum Attempt {
    Granted(Grant),
    Busy(Option<Duration>),
}

/// Tries once for `ask` on the lock `keys`: granted only when the lock admits it and nobody live waits.
pub(crate) async fn try_acquire(
    inner: &Arc<RedisStore>,
    handle: &Handle<'_>,
    keys: Arc<LockKeys>,
    ask: &Ask,
) -> Result<Grant, Error> {
    match attempt(inner, handle, &keys, ask, Mode::Try, None, "", None).await? {
        Attempt::Granted(guard) => Ok(guard),
        Attempt::Busy(remaining) => Err(Error::Busy {
            name: keys.name().to_owned(),
            remaining,
        }),
    }
}

/// Waits in the lock's queue until `ask` is granted, or `deadline`.
pub(crate) async fn wait(
    inner: &Arc<RedisStore>,
    handle: &Handle<'_>,
    keys: Arc<LockKeys>,
    ask: &Ask,
    deadline: Option<Instant>,
) -> Result<Grant, Error> {
    let started = Instant::now();
    let wakeups = &inner.wakeups;
    let timed_out = |outage: &mut Outage| {
        outage.take().unwrap_or_else(|| Error::Timeout {
            name: keys.name().to_owned(),
            waited: started.elapsed(),
        })
    };
    let mut outage = Outage::default();
    // Subscribed before the first attempt: a release that finds nobody listening on our channel skips our entry.
    let waiting = wakeups.join(&keys.lock);
    let mut wake = waiting.wakeups();
    if until(deadline, wakeups.ready(&keys.lock)).await.is_none() {
        return Err(timed_out(&mut outage));
    }
    let wid = format!(
        "{}/{}",
        wakeups.client_id(),
        inner.waits.fetch_add(1, Ordering::Relaxed)
    );
    let mut leave = Leave {
        inner: Arc::clone(inner),
        keys: Arc::clone(&keys),
        wid: wid.clone(),
        armed: true,
    };
    let mut expecting = wakeups.expecting(&keys);
    let mut mode = Mode::First;
    loop {
        let mut prev = expecting.last().map(str::to_owned);
        if let Some((handed, sent)) = expecting.handed() {
            match take_hand_off(inner, &keys, &mut expecting, handed, sent, handle.lease()) {
                Ok(guard) => {
                    leave.armed = false;
                    return Ok(guard);
                }
                Err(hold) => prev = Some(hold),
            }
        }
        wake.borrow_and_update();
        let attempt = attempt(
            inner,
            handle,
            &keys,
            ask,
            mode,
            prev.as_deref(),
            &wid,
            Some(&mut expecting),
        );
        let remaining = match until(deadline, attempt).await {
            Some(Ok(Attempt::Granted(guard))) => {
                leave.armed = false;
                outage.over(&keys);
                return Ok(guard);
            }
            Some(Ok(Attempt::Busy(remaining))) => {
                outage.over(&keys);
                if let Some(hold) = prev.as_deref() {
                    expecting.drop_handed(hold);
                }
                mode = Mode::Again;
                remaining
            }
            Some(Err(err)) => outage.ride(err, &keys, handle.fail_fast)?,
            None => return Err(timed_out(&mut outage)),
        };
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(timed_out(&mut outage));
        }
        // Granted by a release (a message), or look again when the first hold's lease ends, and at least every
        // heartbeat, which keeps our queue entry live and bounds the cost of a lost message.
        let next = now
            + remaining
                .unwrap_or(HEARTBEAT)
                .clamp(Duration::from_millis(1), HEARTBEAT);
        let wake_at = deadline.map_or(next, |d| d.min(next));
        tokio::select! {
            () = expecting.arrived() => {}
            _ = wake.changed() => {}
            () = tokio::time::sleep_until(wake_at) => {}
        }
    }
}

/// One attempt with a fresh hold (coalesced with other tasks' attempts when calls are out: see `batch.rs`).
// The Redis side (`inner`) comes apart from the handle since the handle is the client's no more (the stores return
// grants): one argument more than clippy's default.
#[allow(clippy::too_many_arguments)]
async fn attempt(
    inner: &Arc<RedisStore>,
    handle: &Handle<'_>,
    keys: &Arc<LockKeys>,
    ask: &Ask,
    mode: Mode,
    prev: Option<&str>,
    wid: &str,
    expecting: Option<&mut Expecting>,
) -> Result<Attempt, Error> {
    let hold = format!("{} {}", ask.tag, new_token(handle.description)?);
    let sent = crate::engine::clock::now();
    let expecting = match expecting {
        Some(expecting) if mode != Mode::Try => {
            expecting.add(&hold, sent);
            Some(expecting)
        }
        _ => None,
    };
    let item = SetAcquireItem {
        keys: Arc::clone(keys),
        hold: hold.clone(),
        ttl: handle.ttl,
        mode,
        prev: prev.map(str::to_owned),
        wid: wid.to_owned(),
        limit: ask.limit,
    };
    let (code, value, run, left) = match batch::run(inner, item).await {
        Ok(outcome) => outcome,
        Err(Failure { err, reached }) => {
            let err = not_a_lock(err, &keys.lock);
            // As for the mutex: an attempt that may have run may have granted, or stored the hold for a release
            // to grant later. It is released, and never taken by this wait from now on.
            if reached && !matches!(err, Error::NotALock { .. }) && !is_server_error(&err) {
                if let Some(expecting) = expecting {
                    expecting.drop_handed(&hold);
                }
                release_in_background(Arc::clone(inner), Arc::clone(keys), hold, handle.ttl);
            }
            return Err(explain_foreign(&inner.conn, &keys.lock, err).await);
        }
    };
    let expiry = |handed: bool| Expiry::replied(sent, left, run, handed);
    let granted = |hold: String, handed: bool, route: Option<u128>| {
        Attempt::Granted(new_grant(
            inner,
            keys,
            hold,
            value,
            handle.lease(),
            expiry(handed),
            route,
        ))
    };
    match code {
        1 => {
            let route = expecting.and_then(|e| e.taken(&hold));
            Ok(granted(hold, false, route))
        }
        2 => {
            let prev = prev.unwrap_or_default().to_owned();
            let route = expecting.and_then(|e| e.taken(&prev));
            Ok(granted(prev, true, route))
        }
        0 => {
            crate::engine::metrics::busy();
            Ok(Attempt::Busy(
                u64::try_from(value).ok().map(Duration::from_millis),
            ))
        }
        101 | 102 => {
            let granted = if code == 101 {
                hold
            } else {
                prev.unwrap_or_default().to_owned()
            };
            Err(unreplicated(
                inner, keys, expecting, granted, handle.ttl, value,
            ))
        }
        -2 => Err(Error::NotALock {
            key: keys.fence().to_string(),
            detail: "the fence counter is not a number".to_owned(),
        }),
        -5 => Err(Error::WrongPermits {
            name: keys.name().to_owned(),
            asked: ask.limit,
            stored: u64::try_from(value).unwrap_or(0),
        }),
        -3 => Err(held_as(&keys.lock, value)),
        // -1: the name holds something leasehold did not write.
        _ => Err(explain_foreign(&inner.conn, &keys.lock, foreign(&keys.lock, "")).await),
    }
}

/// A wait that ended without a grant leaves the lock's queue at once, in the background (a drop guard, so a dropped
/// wait leaves too). A hold a release granted it meanwhile is released by the hand-off routing (`Expecting`'s drop,
/// or the subscriber when the message comes later) or by the coalescer (an attempt that was out).
struct Leave {
    inner: Arc<RedisStore>,
    keys: Arc<LockKeys>,
    wid: String,
    armed: bool,
}

impl Drop for Leave {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // the entry stops counting after its liveness window
        };
        let inner = Arc::clone(&self.inner);
        let keys = Arc::clone(&self.keys);
        let wid = std::mem::take(&mut self.wid);
        runtime.spawn(async move {
            let mut invocation = ScriptCall::new(&LEAVE, 5);
            add_lock_keys(&mut invocation, &keys);
            invocation
                .arg(inner.wakeups.channel_prefix())
                .arg(millis(inner.fence_retention))
                .arg(wid.as_str());
            let reply: redis::RedisResult<i64> = inner.conn.invoke_idempotent(&invocation).await;
            if let Err(err) = reply {
                tracing::debug!(target: TARGET, lock = %keys.name(), error = %err, "leaving the queue failed; the entry lapses");
            }
        });
    }
}

/// One attempt of a queued kind, as the coalescer carries it.
pub(crate) struct SetAcquireItem {
    keys: Arc<LockKeys>,
    hold: String,
    ttl: Duration,
    mode: Mode,
    prev: Option<String>,
    wid: String,
    limit: u64,
}

impl Item for SetAcquireItem {
    /// As `acquire.lua`'s: code, fence (or ms until the first hold ends), server µs, ms left.
    type Outcome = AcquireReply;

    fn coalescer(inner: &RedisStore) -> &Coalescer<Self> {
        &inner.set_acquires
    }

    fn slot(&self) -> u16 {
        self.keys.slot()
    }

    fn script(inner: &RedisStore, items: &[Self]) -> ScriptCall {
        let mut invocation = ScriptCall::new(&SET_ACQUIRE, 4 * items.len());
        for item in items {
            invocation
                .key(&item.keys.lock)
                .key(item.keys.fence())
                .key(item.keys.queue())
                .key(item.keys.waiters());
        }
        invocation
            .arg(millis(inner.fence_retention))
            .arg(inner.wakeups.client_id())
            .arg(inner.wakeups.channel_prefix());
        for item in items {
            invocation
                .arg(item.hold.as_str())
                .arg(millis(item.ttl))
                .arg(match item.mode {
                    Mode::Try => "0",
                    Mode::First => "1",
                    Mode::Again => "2",
                })
                .arg(millis(item.ttl.min(CLAIM)))
                .arg(item.prev.as_deref().unwrap_or(""))
                .arg(item.wid.as_str())
                .arg(item.limit);
        }
        invocation
    }

    fn acks(inner: &RedisStore) -> Option<ReplicaAcks> {
        inner.replicas
    }

    fn outcomes(
        items: &[Self],
        sent: Sent<Numbers>,
        inner: &RedisStore,
    ) -> Result<Vec<AcquireReply>, Failure> {
        acquire_call_outcomes(items.len(), sent, inner)
    }

    fn orphaned(self, inner: &Arc<RedisStore>, outcome: Option<AcquireReply>) {
        release_orphaned(inner, &self.keys, self.hold, self.prev, self.ttl, outcome);
    }
}
