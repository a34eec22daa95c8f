//! The mutex's acquisition on Redis: one attempt (`acquire.lua`, coalesced with other tasks' attempts), a try, and
//! the wait (the client's place in the lock's queue, hand-offs taken as they come, attempts again on a wake-up, at the
//! holder's lease end and every heartbeat). Also what every Redis acquisition shares: the outcomes of a coalesced
//! acquire call, the release of a grant nobody waits for any more, and riding out an outage.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::redis::batch::{self, Coalescer, Failure, Item};
use crate::backend::redis::conn::{ReplicaAcks, Sent};
use crate::backend::redis::foreign::{explain_foreign, foreign, held_as, not_a_lock};
use crate::backend::redis::grant::{
    new_grant, short_of, take_hand_off, unreplicated, Expiry, Grant,
};
use crate::backend::redis::release::release_in_background;
use crate::backend::redis::scripts::{Numbers, ScriptCall, ACQUIRE, CLAIM, HEARTBEAT};
use crate::backend::redis::store::RedisStore;
use crate::backend::redis::wake::Expecting;
use crate::backend::Handle;
use crate::engine::keys::{millis, LockKeys};
use crate::error::Error;
use crate::fence::new_token;

/// The tracing target of this file's events: the module path the mutex's acquisition had before it moved here, so
/// that log filters keep working (`leasehold::mutex=debug`).
const TARGET: &str = "leasehold::mutex";

/// A waiter whose holder reported no expiry (never the case for keys leasehold writes) looks again after this long.
const NO_TTL_RECHECK: Duration = Duration::from_secs(1);

/// How an attempt relates to waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// A single try: never join the queue.
    No,
    /// The first attempt of a wait: join the queue when busy.
    First,
    /// A later attempt: this client may be queued already, so a grant also takes it out of the queue.
    Queued,
}

/// The outcome of one acquire script call.
enum Attempt {
    Granted(Grant),
    /// Held by another owner, with its remaining lease when it has one.
    Busy(Option<Duration>),
}

/// Tries the mutex `keys` once, as [`Mutex::try_lock`](crate::Mutex::try_lock) does on Redis: never joins the queue.
pub(crate) async fn try_lock(
    inner: &Arc<RedisStore>,
    handle: &Handle<'_>,
    keys: Arc<LockKeys>,
) -> Result<Grant, Error> {
    let started = Instant::now();
    match attempt(inner, handle, &keys, Wait::No, None, None).await? {
        Attempt::Granted(guard) => {
            crate::engine::metrics::granted(started.elapsed());
            Ok(guard)
        }
        Attempt::Busy(remaining) => {
            tracing::debug!(target: TARGET, lock = %keys.name(), holder_lease_left = ?remaining, "busy");
            Err(Error::Busy {
                name: keys.name().to_owned(),
                remaining,
            })
        }
    }
}

/// Waits for the mutex `keys` until `deadline` (`None`: as long as it takes), as [`Mutex::lock`](crate::Mutex::lock)
/// does on Redis: joins the lock's queue, takes a grant a release hands over, and otherwise attempts again when woken,
/// when the holder's lease would end, and at least every heartbeat, riding out outages unless `fail_fast`.
pub(crate) async fn lock(
    inner: &Arc<RedisStore>,
    handle: &Handle<'_>,
    keys: Arc<LockKeys>,
    deadline: Option<Instant>,
) -> Result<Grant, Error> {
    let started = Instant::now();
    let timed_out = || Error::Timeout {
        name: keys.name().to_owned(),
        waited: started.elapsed(),
    };
    let wakeups = &inner.wakeups;
    let epoch = wakeups.epoch();
    let mut outage = Outage::default();
    // Every token this wait sends may be stored for a hand-off: registered before it leaves.
    let mut expecting = wakeups.expecting(&keys);
    // Queued only where a release can reach it: a client not yet subscribed would be passed over as gone, and lose
    // its place. It joins the queue by the attempt it makes once subscribed.
    let join = if wakeups.reachable() {
        Wait::First
    } else {
        Wait::No
    };
    let first = attempt_until(inner, handle, &keys, join, None, &mut expecting, deadline);
    let mut remaining = match first.await {
        Some(Ok(Attempt::Granted(guard))) => return Ok(guard),
        Some(Ok(Attempt::Busy(remaining))) => remaining,
        Some(Err(err)) => outage.ride(err, &keys, handle.fail_fast)?,
        None => return Err(timed_out()),
    };
    let timed_out = |outage: &mut Outage| outage.take().unwrap_or_else(timed_out);

    tracing::debug!(target: TARGET, lock = %keys.name(), holder_lease_left = ?remaining, "busy; waiting");
    let waiting = wakeups.join(&keys.lock);
    // Bumped after a subscriber reconnect: a hand-off may have been missed.
    let mut wake = waiting.wakeups();
    // Only the head of the local queue contends in Redis: a release costs O(1) attempts per process. A release
    // may still hand the lock to the token of this task's first attempt while it queues here.
    let (permit, queued) = match waiting.local.queue.try_acquire() {
        Ok(permit) => (permit, false),
        Err(_) => {
            let queue = async {
                loop {
                    tokio::select! {
                        permit = waiting.local.queue.acquire() => return permit.ok().map(Ok),
                        () = expecting.arrived() => {}
                    }
                    let Some((handed, sent)) = expecting.handed() else {
                        continue;
                    };
                    let token = match take_hand_off(
                        inner,
                        &keys,
                        &mut expecting,
                        handed,
                        sent,
                        handle.lease(),
                    ) {
                        Ok(guard) => return Some(Err(guard)),
                        Err(token) => token,
                    };
                    // Too close to its end to start on: confirm it with one attempt, which finds the lock held
                    // by that token (or, if it lapsed, queues again).
                    let confirm = attempt(
                        inner,
                        handle,
                        &keys,
                        Wait::Queued,
                        Some(&token),
                        Some(&mut expecting),
                    );
                    match confirm.await {
                        Ok(Attempt::Granted(guard)) => return Some(Err(guard)),
                        Ok(Attempt::Busy(_)) => expecting.drop_handed(&token),
                        // Left in the mailbox: released if this wait ends, else it lapses with its claim.
                        Err(_) => {}
                    }
                }
            };
            match until(deadline, queue).await {
                Some(Some(Ok(permit))) => (permit, true),
                Some(Some(Err(guard))) => {
                    // The grant went to this client, which has left the Redis queue: the local head queues it
                    // again for the tasks still waiting.
                    waiting.local.bump();
                    return Ok(guard);
                }
                _ => return Err(timed_out(&mut outage)),
            }
        }
    };
    if until(deadline, wakeups.ready(&keys.lock)).await.is_none() {
        return Err(timed_out(&mut outage));
    }
    // The first attempt already queued this client; it need not be repeated if we were subscribed when it was
    // made, nothing was delivered since, and no local waiter went before us.
    let mut look_again = queued || epoch.is_none() || wakeups.epoch() != epoch;
    loop {
        // A release handed the lock to one of our tokens: start at once when the grant's deadline leaves room,
        // otherwise confirm it with the attempt below (which finds the lock held by that token).
        let mut prev = expecting.last().map(str::to_owned);
        if let Some((handed, sent)) = expecting.handed() {
            match take_hand_off(inner, &keys, &mut expecting, handed, sent, handle.lease()) {
                Ok(guard) => {
                    outage.over(&keys);
                    drop(permit);
                    return Ok(guard);
                }
                Err(token) => {
                    prev = Some(token);
                    look_again = true;
                }
            }
        }
        if look_again {
            // Seen before the attempt: a wake-up that lands after it still wakes us below.
            wake.borrow_and_update();
            let attempt = attempt_until(
                inner,
                handle,
                &keys,
                Wait::Queued,
                prev.as_deref(),
                &mut expecting,
                deadline,
            );
            remaining = match attempt.await {
                Some(Ok(Attempt::Granted(guard))) => {
                    outage.over(&keys);
                    drop(permit);
                    return Ok(guard);
                }
                Some(Ok(Attempt::Busy(remaining))) => {
                    outage.over(&keys);
                    // A hand-off that was waiting for this confirmation has lapsed: forget it.
                    if let Some(token) = prev.as_deref() {
                        expecting.drop_handed(token);
                    }
                    remaining
                }
                Some(Err(err)) => outage.ride(err, &keys, handle.fail_fast)?,
                None => return Err(timed_out(&mut outage)),
            };
        }
        look_again = true;
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(timed_out(&mut outage));
        }
        // Handed the lock by a release; otherwise look again when the holder's lease ends, and at least every
        // heartbeat, which keeps this client's queue entry (and the token a release would grant) fresh and bounds
        // the cost of a lost message.
        let lease_end = now
            + remaining
                .unwrap_or(NO_TTL_RECHECK)
                .clamp(Duration::from_millis(1), HEARTBEAT);
        let wake_at = deadline.map_or(lease_end, |d| d.min(lease_end));
        tokio::select! {
            () = expecting.arrived() => look_again = false,
            _ = wake.changed() => {}
            () = tokio::time::sleep_until(wake_at) => {}
        }
    }
}

/// One attempt, given up at `deadline` (`None` then): a paused or unreachable server cannot hold a bounded call
/// past its bound. A grant that lands after the attempt was given up is released (see `AcquireItem::orphaned`).
async fn attempt_until(
    inner: &Arc<RedisStore>,
    handle: &Handle<'_>,
    keys: &Arc<LockKeys>,
    wait: Wait,
    prev: Option<&str>,
    expecting: &mut Expecting,
    deadline: Option<Instant>,
) -> Option<Result<Attempt, Error>> {
    until(
        deadline,
        attempt(inner, handle, keys, wait, prev, Some(expecting)),
    )
    .await
}

/// One acquire attempt with a fresh token (coalesced with other tasks' attempts when calls are out: see
/// `batch.rs`). A caller that will wait joins the lock's queue when busy, with this token registered for a
/// hand-off (in `expecting`, before the request leaves); `prev` is the token of its previous attempt, which a
/// release may have handed the lock to meanwhile.
async fn attempt(
    inner: &Arc<RedisStore>,
    handle: &Handle<'_>,
    keys: &Arc<LockKeys>,
    wait: Wait,
    prev: Option<&str>,
    expecting: Option<&mut Expecting>,
) -> Result<Attempt, Error> {
    let token = new_token(handle.description)?;
    // On the lease clock (see clock.rs), read before the request leaves.
    let sent = crate::engine::clock::now();
    let expecting = match expecting {
        Some(expecting) if wait != Wait::No => {
            expecting.add(&token, sent);
            Some(expecting)
        }
        _ => None,
    };
    let item = AcquireItem {
        keys: Arc::clone(keys),
        token,
        ttl: handle.ttl,
        wait,
        prev: prev.map(str::to_owned),
    };
    // A request dropped on the way is undone by the coalescer (`AcquireItem::orphaned`); one that failed is
    // undone below. Retried once on a dropped connection with the same token: a retry that finds the grant of
    // its first run reports that grant (acquire.lua is idempotent per token).
    let token = item.token.clone();
    let (code, value, run, left) = match batch::run(inner, item).await {
        Ok(outcome) => outcome,
        Err(Failure { err, reached }) => {
            let err = not_a_lock(err, &keys.lock);
            // A server error means the script did not grant, and a request that never reached Redis (the
            // connection was refused) cannot have granted either; anything else (timeout, dropped connection)
            // may have granted, or stored the token for a release to hand the lock to later: released in the
            // background, owner-checked. (A wait riding out an outage thus leaves no background release behind
            // per refused attempt.)
            if reached && !matches!(err, Error::NotALock { .. }) && !is_server_error(&err) {
                // From now on the token is being released: the wait must never take a grant to it (a hand-off
                // whose message comes late, or an attempt that finds the lock held by it), or that release would
                // free a lock in use. A late message for it is given back instead (a second, harmless release).
                if let Some(expecting) = expecting {
                    expecting.drop_handed(&token);
                }
                release_in_background(Arc::clone(inner), Arc::clone(keys), token, handle.ttl);
            }
            return Err(explain_foreign(&inner.conn, &keys.lock, err).await);
        }
    };
    let expiry = |left: i64, handed: bool| Expiry::replied(sent, left, run, handed);
    match code {
        1 => {
            // Routed nowhere until this grant ends: a message for it may still come (see `Expecting::taken`).
            let route = expecting.and_then(|e| e.taken(&token));
            Ok(Attempt::Granted(grant(
                inner,
                handle,
                keys,
                token,
                value,
                expiry(left, false),
                route,
            )))
        }
        2 => {
            // A release handed the lock to our previous attempt's token; this attempt stored nothing.
            let prev = prev.unwrap_or_default().to_owned();
            let route = expecting.and_then(|e| e.taken(&prev));
            Ok(Attempt::Granted(grant(
                inner,
                handle,
                keys,
                prev,
                value,
                expiry(left, true),
                route,
            )))
        }
        0 => {
            crate::engine::metrics::busy();
            Ok(Attempt::Busy(
                u64::try_from(value).ok().map(Duration::from_millis),
            ))
        }
        101 | 102 => {
            let granted = if code == 101 {
                token
            } else {
                prev.unwrap_or_default().to_owned()
            };
            Err(unreplicated(
                inner, keys, expecting, granted, handle.ttl, value,
            ))
        }
        -1 => Err(explain_foreign(&inner.conn, &keys.lock, foreign(&keys.lock, "")).await),
        -3 => Err(held_as(&keys.lock, value)),
        _ => Err(Error::NotALock {
            key: keys.fence().to_string(),
            detail: "the fence counter is not a number".to_owned(),
        }),
    }
}

/// The grant whose expiry `expiry` describes.
fn grant(
    inner: &Arc<RedisStore>,
    handle: &Handle<'_>,
    keys: &Arc<LockKeys>,
    token: String,
    fence: i64,
    expiry: Expiry,
    route: Option<u128>,
) -> Grant {
    new_grant(inner, keys, token, fence, handle.lease(), expiry, route)
}

/// One lock's answer from `acquire.lua`: code, fence (or the holder's time left), server µs when the call ran, the
/// grant's time left in ms.
pub(crate) type AcquireReply = (i64, i64, i64, i64);

/// One acquire attempt, as the coalescer carries it.
pub(crate) struct AcquireItem {
    keys: Arc<LockKeys>,
    token: String,
    ttl: Duration,
    wait: Wait,
    prev: Option<String>,
}

impl Item for AcquireItem {
    type Outcome = AcquireReply;

    fn coalescer(inner: &RedisStore) -> &Coalescer<Self> {
        &inner.acquires
    }

    fn slot(&self) -> u16 {
        self.keys.slot()
    }

    fn script(inner: &RedisStore, items: &[Self]) -> ScriptCall {
        let mut invocation = ScriptCall::new(&ACQUIRE, 4 * items.len());
        for item in items {
            invocation
                .key(&item.keys.lock)
                .key(item.keys.fence())
                .key(item.keys.queue())
                .key(item.keys.waiters());
        }
        invocation
            .arg(millis(inner.fence_retention))
            .arg(inner.wakeups.client_id());
        for item in items {
            invocation
                .arg(item.token.as_str())
                .arg(millis(item.ttl))
                .arg(match item.wait {
                    Wait::No => "0",
                    Wait::First => "1",
                    Wait::Queued => "2",
                })
                .arg(millis(item.ttl.min(CLAIM)))
                .arg(item.prev.as_deref().unwrap_or(""));
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
        release_orphaned(inner, &self.keys, self.token, self.prev, self.ttl, outcome);
    }
}

/// The code of an acquire outcome that granted (1: to this attempt's token, 2: to the previous attempt's) but whose
/// call too few replicas acknowledged: [`NOT_REPLICATED`] plus the original code.
pub(crate) const NOT_REPLICATED: i64 = 100;

/// [`acquire_outcomes`] of a coalesced acquire call of `n` locks, as [`Item::outcomes`] takes it.
pub(crate) fn acquire_call_outcomes(
    n: usize,
    (reply, reached, acked): Sent<Numbers>,
    inner: &RedisStore,
) -> Result<Vec<AcquireReply>, Failure> {
    acquire_outcomes(reply, reached, n, short_of(inner.replicas, acked))
}

/// Splits an acquire script's reply (`acquire.lua`, `set_acquire.lua`: `{now, code, value, ms, ...}`) for `n` locks
/// into one outcome each. When too few replicas acknowledged the call (`short`), every grant in it is marked
/// [`NOT_REPLICATED`], with the count of replicas that acknowledged as its value: the attempt releases it and reports
/// [`Error::NotReplicated`].
pub(crate) fn acquire_outcomes(
    reply: redis::RedisResult<Numbers>,
    reached: bool,
    n: usize,
    short: Option<(u32, u32)>,
) -> Result<Vec<AcquireReply>, Failure> {
    match reply {
        Ok(Numbers(reply)) if reply.len() == 1 + 3 * n => {
            let run = reply[0];
            Ok(reply[1..]
                .chunks(3)
                .map(|c| match (c[0], short) {
                    // The value is then the count of replicas that acknowledged (the fence is of no use).
                    (1 | 2, Some((acked, _))) => {
                        (NOT_REPLICATED + c[0], i64::from(acked), run, c[2])
                    }
                    (code, _) => (code, c[1], run, c[2]),
                })
                .collect())
        }
        Ok(_) => Err(Failure {
            err: redis::RedisError::from((
                redis::ErrorKind::Parse,
                "unexpected reply to an acquire",
            )),
            reached: true,
        }),
        Err(err) => Err(Failure { err, reached }),
    }
}

/// Settles an acquire whose caller went away: what may hold the lock for it is its token (granted, or unknown), or
/// the wait's previous token (a release handed the lock to it); each is released in the background. Releases are
/// owner-checked, so an unknown outcome costs nothing.
pub(crate) fn release_orphaned(
    inner: &Arc<RedisStore>,
    keys: &Arc<LockKeys>,
    token: String,
    prev: Option<String>,
    ttl: Duration,
    outcome: Option<AcquireReply>,
) {
    let tokens = match outcome.map(|(code, ..)| code) {
        Some(1 | 101) => [Some(token), None],
        Some(2 | 102) => [prev, None],
        Some(_) => [None, None],
        None => [Some(token), prev],
    };
    for token in tokens.into_iter().flatten() {
        release_in_background(Arc::clone(inner), Arc::clone(keys), token, ttl);
    }
}

/// A wait's view of a Redis outage: the last error while it lasts, and the backoff before the next attempt.
#[derive(Default)]
pub(crate) struct Outage {
    error: Option<Error>,
    backoff: crate::engine::backoff::Backoff,
}

impl Outage {
    /// An attempt failed with `err`: ends the wait (`Err`) unless the error is transient and the wait rides outages;
    /// otherwise returns how long to wait before the next attempt (a wake-up still cuts it short).
    pub(crate) fn ride(
        &mut self,
        err: Error,
        keys: &LockKeys,
        fail_fast: bool,
    ) -> Result<Option<Duration>, Error> {
        if fail_fast || !is_transient(&err) {
            return Err(err);
        }
        if self.error.is_none() {
            let cause = match &err {
                Error::Redis(cause) => cause.to_string(),
                other => other.to_string(),
            };
            tracing::warn!(target: "leasehold::outage", lock = %keys.name(),
                "Redis unavailable while waiting for lock {:?} ({cause}); retrying until it answers", keys.name());
            self.backoff.reset();
        }
        self.error = Some(err);
        Ok(Some(self.backoff.next()))
    }

    /// Redis answered again.
    pub(crate) fn over(&mut self, keys: &LockKeys) {
        if self.error.take().is_some() {
            tracing::info!(target: "leasehold::outage", lock = %keys.name(), "Redis answers again; still waiting");
        }
    }

    /// The error to end the wait with when its deadline passes during an outage.
    pub(crate) fn take(&mut self) -> Option<Error> {
        self.error.take()
    }
}

/// A reply the server gave as an error (the script did not run to a grant), as opposed to a lost or refused request.
pub(crate) fn is_server_error(err: &Error) -> bool {
    matches!(err, Error::Redis(e) if e.code().is_some())
}

/// Whether `err` may pass by itself: the connection (refused, dropped, timed out) or a server that is starting,
/// busy, or failing over.
fn is_transient(err: &Error) -> bool {
    let Error::Redis(err) = err else {
        return false;
    };
    err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.kind() == redis::ErrorKind::ClusterConnectionNotFound
        // MOVED and ASK reach us only when the cluster client gave up following them (a slot whose new owner is
        // not reachable yet, during a failover).
        || matches!(
            err.code(),
            Some(
                "LOADING" | "BUSY" | "TRYAGAIN" | "MASTERDOWN" | "READONLY" | "CLUSTERDOWN" | "MOVED"
                    | "ASK"
            )
        )
}

/// Runs `fut` until `deadline`; `None` when the deadline came first.
pub(crate) async fn until<F: Future>(deadline: Option<Instant>, fut: F) -> Option<F::Output> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, fut).await.ok(),
        None => Some(fut.await),
    }
}
