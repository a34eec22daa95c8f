//! What single kinds do only on Redis, each one script call: a write lock turned into a read share in place
//! ([`downgrade`], `downgrade.lua`), a nested hold of a reentrant mutex by its holder's token ([`lock_as`],
//! `reenter.lua`), and a semaphore's stored capacity changed ([`set_permits`], `set_permits.lua`).

use std::sync::Arc;
use std::time::Duration;

use crate::backend::redis::foreign::{explain_foreign, foreign, not_a_lock, script_error};
use crate::backend::redis::grant::{new_grant, short_of, Expiry, Grant};
use crate::backend::redis::release::Undo;
use crate::backend::redis::scripts::{DOWNGRADE, REENTER, SET_PERMITS};
use crate::backend::redis::store::RedisStore;
use crate::backend::Handle;
use crate::engine::keys::{millis, LockKeys};
use crate::engine::lease::LeaseShared;
use crate::error::Error;
use crate::fence::Fence;
use crate::fence::{new_token, token_of};

/// The deepest a reentrant mutex nests: re-entries of one guard in a process, and holds of one lock across processes
/// (`reenter.lua` counts them; reentrant holds are Redis's alone).
pub const MAX_DEPTH: usize = 32;

/// [`WriteGuard::downgrade`](crate::WriteGuard::downgrade) on Redis, once the write lease is known to be live: the
/// write grant `shared` (fence `fence`, its guard converted: see `Guard::converted`) of the lock `keys` becomes a read
/// share in one step, keeping `lease` (its length, and how often it is renewed).
pub(crate) async fn downgrade(
    inner: &Arc<RedisStore>,
    shared: Arc<LeaseShared>,
    fence: Fence,
    keys: Arc<LockKeys>,
    lease: (Duration, Option<Duration>),
) -> Result<Grant, Error> {
    let fence = i64::try_from(fence.get()).unwrap_or(i64::MAX);
    let write_hold = shared.token.clone();
    let read_hold = format!("r {}", token_of(&write_hold));
    // Until the reply says which hold Redis has, both are released if this call goes no further.
    let undo = Undo::new(
        inner,
        &keys,
        vec![write_hold.clone(), read_hold.clone()],
        shared.ttl,
    );
    let sent = crate::engine::clock::now();
    let mut invocation = DOWNGRADE.key(&keys.lock);
    invocation
        .key(keys.fence())
        .key(keys.queue())
        .key(keys.waiters())
        .arg(inner.wakeups.channel_prefix())
        .arg(millis(inner.fence_retention))
        .arg(write_hold.as_str())
        .arg(read_hold.as_str());
    let reply: redis::RedisResult<(i64, i64, i64)> =
        inner.conn.invoke_idempotent(&invocation).await;
    let (run, code, left) = reply.map_err(|err| not_a_lock(err, &keys.lock))?;
    undo.disarm();
    match code {
        1 => Ok(new_grant(
            inner,
            &keys,
            read_hold,
            fence,
            lease,
            Expiry::replied(sent, left, run, false),
            None,
        )),
        0 => Err(Error::NotOwner {
            name: keys.name().to_owned(),
        }),
        _ => Err(Error::NotALock {
            key: keys.lock.clone(),
            detail: "it is not a read-write lock".to_owned(),
        }),
    }
}

/// [`ReentrantMutex::lock_as`](crate::ReentrantMutex::lock_as) on Redis: a nested hold of the lock `keys`, entered with
/// `token`, the token of a hold of the group that holds it.
pub(crate) async fn lock_as(
    inner: &Arc<RedisStore>,
    handle: &Handle<'_>,
    keys: Arc<LockKeys>,
    token: &str,
) -> Result<Grant, Error> {
    let presented = token_of(token)
        .split(' ')
        .next()
        .unwrap_or_default()
        .to_owned();
    let hold = format!("n {}", new_token(handle.description)?);
    // If this call goes no further, the nested hold it may have made is released.
    let undo = Undo::new(inner, &keys, vec![hold.clone()], handle.ttl);
    let sent = crate::engine::clock::now();
    let mut invocation = REENTER.key(&keys.lock);
    invocation
        .key(keys.fence())
        .arg(hold.as_str())
        .arg(presented.as_str())
        .arg(millis(handle.ttl))
        .arg(MAX_DEPTH)
        .arg(millis(inner.fence_retention));
    let (reply, _, acked) = inner
        .conn
        .invoke_acked::<(i64, i64, i64, i64)>(&invocation, inner.replicas)
        .await;
    let (run, code, fence, left) = match reply {
        Ok(reply) => reply,
        Err(err) => {
            let err = not_a_lock(err, &keys.lock);
            return Err(explain_foreign(&inner.conn, &keys.lock, err).await);
        }
    };
    if let (1, Some((acked, _))) = (code, short_of(inner.replicas, acked)) {
        // Dropped armed on this return, the undo releases the nested hold.
        return Err(Error::NotReplicated {
            name: keys.name().to_owned(),
            acked,
            required: inner.replicas.map_or(0, |r| r.count),
        });
    }
    // The reply says what Redis has: the nested hold on code 1 (the guard below owns it), nothing otherwise.
    undo.disarm();
    match code {
        1 => Ok(new_grant(
            inner,
            &keys,
            hold,
            fence,
            handle.lease(),
            Expiry::replied(sent, left, run, false),
            None,
        )),
        0 => Err(Error::NotOwner {
            name: keys.name().to_owned(),
        }),
        -4 => Err(Error::TooDeep {
            name: keys.name().to_owned(),
            depth: MAX_DEPTH,
        }),
        _ => Err(explain_foreign(&inner.conn, &keys.lock, foreign(&keys.lock, "")).await),
    }
}

/// [`Semaphore::set_permits`](crate::Semaphore::set_permits) on Redis: stores `permits` as the capacity of the
/// semaphore `keys` while it is in use; the capacity it replaced, if it stored one.
pub(crate) async fn set_permits(
    inner: &RedisStore,
    keys: &LockKeys,
    permits: u64,
) -> Result<Option<u64>, Error> {
    let mut invocation = SET_PERMITS.key(&keys.lock);
    invocation
        .key(keys.fence())
        .key(keys.queue())
        .key(keys.waiters())
        .arg(inner.wakeups.channel_prefix())
        .arg(millis(inner.fence_retention))
        .arg(permits);
    let reply: redis::RedisResult<(i64, i64)> = inner.conn.invoke_idempotent(&invocation).await;
    let (code, previous) = match reply {
        Ok(reply) => reply,
        Err(err) => return Err(script_error(&inner.conn, &keys.lock, err).await),
    };
    match code {
        1 => Ok(u64::try_from(previous).ok().filter(|&p| p > 0)),
        0 => Ok(None),
        _ => Err(explain_foreign(&inner.conn, &keys.lock, foreign(&keys.lock, "")).await),
    }
}
