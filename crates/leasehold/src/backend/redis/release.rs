//! Releasing on Redis: a guard's release (`release.lua`, coalesced with other tasks' releases), its extension
//! (`renew.lua`), the keeper entry and hand-off route it lets go of, and the owner-checked release in the background
//! of a grant nobody holds a guard for (a dropped guard, an acquire given up, a hold a reply left unknown: [`Undo`]),
//! recorded for the client's drop when no runtime can finish it (`orphans.rs`).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::redis::batch::{self, Coalescer, Failure, Item};
use crate::backend::redis::conn::{ReplicaAcks, Sent};
use crate::backend::redis::foreign::not_a_lock;
use crate::backend::redis::grant::short_of;
use crate::backend::redis::scripts::{Numbers, ScriptCall, RELEASE, RENEW};
use crate::backend::redis::store::RedisStore;
use crate::engine::keys::{millis, LockKeys};
use crate::engine::lease::{Lease, LeaseShared, LossReason};
use crate::error::Error;

/// The tracing target of this file's events: the module path they had before they moved here, so that log filters
/// keep working (`leasehold::guard=debug`).
const TARGET: &str = "leasehold::guard";

/// The Redis side of [`Guard::release`](crate::Guard::release), once the lease has ended: releases `shared`'s grant,
/// owner-checked, handing the lock to the next waiter. `settled` is set once Redis answered (the guard's drop then has
/// nothing left to do); `earlier_loss` is how the lease had ended before the call, if it had.
pub(crate) async fn release(
    inner: &Arc<RedisStore>,
    shared: &LeaseShared,
    earlier_loss: Option<LossReason>,
    settled: &mut bool,
) -> Result<(), Error> {
    let name = || shared.keys.name().to_owned();
    let item = ReleaseItem {
        keys: Arc::clone(&shared.keys),
        token: shared.token.clone(),
    };
    // Coalesced with other tasks' releases when calls are out (batch.rs).
    let reply = batch::run(inner, item).await;
    // From here on, the drop has nothing left to do (on an error it retries in the background).
    *settled = reply.is_ok();
    let code = match reply {
        Ok(-2) => {
            return Err(not_a_lock(
                redis::RedisError::from((redis::ErrorKind::Extension, "WRONGTYPE", String::new())),
                &shared.keys.lock,
            ))
        }
        Ok(code) => code,
        Err(failure) => return Err(not_a_lock(failure.err, &shared.keys.lock)),
    };
    crate::engine::trace::kind_event!(crate::engine::trace::kind_of_hold(&shared.token), debug, lock = %shared.keys.name(), hold = %crate::engine::trace::words(&shared.token), fence = shared.fence.get(), ?earlier_loss, still_ours = code == 1, "released");
    match (earlier_loss, code) {
        (Some(reason), _) => Err(Error::LeaseLost {
            name: name(),
            reason,
        }),
        (None, 1) => Ok(()),
        (None, _) => Err(Error::NotOwner { name: name() }),
    }
}

/// The Redis side of [`Guard::extend`](crate::Guard::extend): moves `lease`'s end to `ttl` from now if its grant still
/// owns the lock (`renew.lua`).
pub(crate) async fn extend(inner: &RedisStore, lease: &Lease, ttl: Duration) -> Result<(), Error> {
    let request = lease.begin_extension(ttl)?;
    let shared = &lease.shared;
    let mut invocation = RENEW.key(&shared.keys.lock);
    invocation.arg(&shared.token).arg(millis(ttl));
    let (reply, _, acked) = inner
        .conn
        .invoke_acked::<Vec<i64>>(&invocation, inner.replicas)
        .await;
    let reply = reply.map_err(|e| not_a_lock(e, &shared.keys.lock))?;
    // The keeper schedules renewals from the deadline: let it look again.
    inner.keeper.nudge();
    // An extension too few replicas acknowledged does not count, as a renewal: the request stays unconfirmed
    // (the deadline assumes the worst of it) until a later acknowledged one.
    if let (Some((acked, required)), [_, 1]) = (short_of(inner.replicas, acked), reply.as_slice()) {
        return Err(Error::NotReplicated {
            name: shared.keys.name().to_owned(),
            acked,
            required,
        });
    }
    match reply.as_slice() {
        [run, 1] => lease.confirmed_extension(request, *run),
        [_, code] => {
            shared.end(crate::engine::lease::loss_reason(*code));
            Err(Error::NotOwner {
                name: shared.keys.name().to_owned(),
            })
        }
        _ => Err(Error::Redis(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "unexpected reply to a renewal",
        )))),
    }
}

/// Lets go of a guard's keeper entry (`kept`) and hand-off route (`route`), when it has them.
pub(crate) fn forget(inner: &RedisStore, kept: &mut Option<u64>, route: &mut Option<u128>) {
    if let Some(id) = kept.take() {
        inner.keeper.forget(id);
    }
    if let Some(route) = route.take() {
        inner.wakeups.untake(route);
    }
}

/// The owner-checked release of one token, handing the lock to the next waiting client (see `scripts/release.lua`).
pub(crate) fn release_invocation(
    keys: &LockKeys,
    token: &str,
    channel_prefix: &str,
    fence_retention: Duration,
) -> ScriptCall {
    releases([(keys, token)], channel_prefix, fence_retention)
}

/// The owner-checked releases of `locks` (keys and token each) in one `release.lua` call.
fn releases<'a>(
    locks: impl IntoIterator<Item = (&'a LockKeys, &'a str)> + Clone,
    channel_prefix: &str,
    fence_retention: Duration,
) -> ScriptCall {
    let mut invocation = ScriptCall::new(&RELEASE, 5 * locks.clone().into_iter().count());
    for (keys, _) in locks.clone() {
        add_lock_keys(&mut invocation, keys);
    }
    invocation.arg(channel_prefix).arg(millis(fence_retention));
    for (_, token) in locks {
        invocation.arg(token);
    }
    invocation
}

/// Adds the keys a release touches, in the order `release.lua` and `leave.lua` take them: lock, queue, waiters,
/// released, fence.
pub(crate) fn add_lock_keys(invocation: &mut ScriptCall, keys: &LockKeys) {
    invocation
        .key(&keys.lock)
        .key(keys.queue())
        .key(keys.waiters())
        .key(keys.released())
        .key(keys.fence());
}

/// One release, as the coalescer carries it.
pub(crate) struct ReleaseItem {
    keys: Arc<LockKeys>,
    token: String,
}

impl Item for ReleaseItem {
    /// `release.lua`'s code for the lock.
    type Outcome = i64;

    fn coalescer(inner: &RedisStore) -> &Coalescer<Self> {
        &inner.releases
    }

    fn slot(&self) -> u16 {
        self.keys.slot()
    }

    fn script(inner: &RedisStore, items: &[Self]) -> ScriptCall {
        releases(
            items.iter().map(|item| (&*item.keys, item.token.as_str())),
            inner.wakeups.channel_prefix(),
            inner.fence_retention,
        )
    }

    fn acks(_: &RedisStore) -> Option<ReplicaAcks> {
        None // a release needs no acknowledgement: losing it on a failover only lets the lock expire
    }

    fn outcomes(
        items: &[Self],
        (reply, reached, _): Sent<Numbers>,
        _: &RedisStore,
    ) -> Result<Vec<i64>, Failure> {
        match reply {
            Ok(Numbers(codes)) if codes.len() == items.len() => Ok(codes),
            Ok(_) => Err(Failure {
                err: redis::RedisError::from((
                    redis::ErrorKind::Parse,
                    "unexpected reply to a release",
                )),
                reached: true,
            }),
            Err(err) => Err(Failure { err, reached }),
        }
    }

    fn orphaned(self, _: &Arc<RedisStore>, _: Option<i64>) {
        // The caller was `release`, whose guard's drop releases again in the background (harmless: idempotent).
    }
}

/// Owner-checked release from a drop: spawned on the current tokio runtime if there is one, retried with backoff
/// for at most one lease (after that the key has expired anyway). Without a runtime, or when the runtime drops the
/// task before it is done (it is shutting down), the release is left to the client's drop (see `orphans.rs`).
pub(crate) fn release_in_background(
    inner: Arc<RedisStore>,
    keys: Arc<LockKeys>,
    token: String,
    ttl: Duration,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        inner.orphans.push(keys, token);
        return;
    };
    let give_up = Instant::now() + ttl;
    inner.orphans.started();
    let task = Orphan {
        inner,
        keys,
        token,
        done: false,
    };
    runtime.spawn(async move {
        let mut backoff = crate::engine::backoff::Backoff::new();
        loop {
            let invocation = release_invocation(
                &task.keys,
                &task.token,
                task.inner.wakeups.channel_prefix(),
                task.inner.fence_retention,
            );
            let reply: redis::RedisResult<Numbers> =
                task.inner.conn.invoke_idempotent(&invocation).await;
            match reply {
                Ok(_) => break,
                Err(err) if Instant::now() + backoff.peek() < give_up => {
                    tracing::debug!(target: TARGET, lock = %task.keys.name(), error = %err, "background release failed; retrying");
                    tokio::time::sleep(backoff.next()).await;
                }
                Err(err) => {
                    tracing::warn!(target: TARGET, lock = %task.keys.name(), error = %err, "background release gave up; the key expires with its lease");
                    break;
                }
            }
        }
        task.finish();
    });
}

/// Holds that a request may have left in Redis: released in the background if the request ends without a reply (an
/// error, or its future dropped), forgotten once [`Undo::disarm`] says the reply told what Redis has.
pub(crate) struct Undo {
    inner: Arc<RedisStore>,
    keys: Arc<LockKeys>,
    holds: Vec<String>,
    ttl: Duration,
}

impl Undo {
    pub(crate) fn new(
        inner: &Arc<RedisStore>,
        keys: &Arc<LockKeys>,
        holds: Vec<String>,
        ttl: Duration,
    ) -> Undo {
        Undo {
            inner: Arc::clone(inner),
            keys: Arc::clone(keys),
            holds,
            ttl,
        }
    }

    pub(crate) fn disarm(mut self) {
        self.holds.clear();
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        for hold in self.holds.drain(..) {
            release_in_background(
                Arc::clone(&self.inner),
                Arc::clone(&self.keys),
                hold,
                self.ttl,
            );
        }
    }
}

/// A background release in progress; if its task is dropped unfinished, the release is recorded as an orphan.
struct Orphan {
    inner: Arc<RedisStore>,
    keys: Arc<LockKeys>,
    token: String,
    done: bool,
}

impl Orphan {
    fn finish(mut self) {
        self.done = true;
    }
}

impl Drop for Orphan {
    fn drop(&mut self) {
        if !self.done {
            self.inner
                .orphans
                .push(Arc::clone(&self.keys), std::mem::take(&mut self.token));
        }
        self.inner.orphans.finished();
    }
}
