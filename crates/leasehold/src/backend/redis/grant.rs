//! A grant on Redis, for every kind: what bounds its expiry ([`Expiry`]), the grant with its lease in the client's
//! keeper ([`new_grant`]; the seam, `kinds/store.rs`, makes the guard of it), a grant a release handed over by message ([`take_hand_off`]), and a
//! grant too few replicas acknowledged ([`unreplicated`], [`short_of`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::redis::conn::ReplicaAcks;
use crate::backend::redis::release::release_in_background;
use crate::backend::redis::store::RedisStore;
use crate::backend::redis::wake::{Expecting, Handed};
use crate::engine::keys::LockKeys;
use crate::engine::lease::{Lease, LeaseShared};
use crate::engine::ttl::drift;
use crate::error::Error;
use crate::fence::Fence;

/// A Redis grant: its lease, its entry in the client's keeper (`None`: a fixed lease), and the hand-off route it holds
/// until it ends (see `Expecting::taken`). The seam (`kinds/store.rs`) makes the guard of it, which releases it: a
/// grant dropped before that stays held, and renewed, until the client goes.
#[must_use = "only the guard made of a grant releases it"]
pub(crate) struct Grant {
    pub(crate) lease: Lease,
    pub(crate) kept: Option<u64>,
    pub(crate) route: Option<u128>,
}

/// The grant of `hold` with fence `fence`, whose expiry `expiry` describes; `lease` is the lease to keep and how often
/// to renew it (never: `None`). Shared by every lock kind.
pub(crate) fn new_grant(
    inner: &Arc<RedisStore>,
    keys: &Arc<LockKeys>,
    hold: String,
    fence: i64,
    lease: (Duration, Option<Duration>),
    expiry: Expiry,
    route: Option<u128>,
) -> Grant {
    let (ttl, renew_every) = lease;
    let fence = Fence::new(u64::try_from(fence).unwrap_or(0));
    crate::engine::trace::kind_event!(crate::engine::trace::kind_of_hold(&hold), debug, lock = %keys.name(), hold = %crate::engine::trace::words(&hold), fence = fence.get(), ttl = ?ttl, handed = expiry.handed, "granted");
    let Expiry {
        sent,
        left,
        run,
        handed,
    } = expiry;
    let lease = LeaseShared::new(Arc::clone(keys), hold, fence, ttl, sent, left, run);
    let keeper = |every, once| {
        let weak = Arc::downgrade(inner);
        let renews: std::sync::Weak<dyn crate::engine::keeper::Renews> = weak;
        Some(
            inner
                .keeper
                .watch(renews, Arc::clone(&lease), sent, every, once),
        )
    };
    let kept = match renew_every {
        Some(every) => keeper(every, false),
        // A fixed lease handed over with a shorter claim: extended once to its whole lease, at once.
        None if handed && left < ttl => keeper(ttl / 3, true),
        None => None,
    };
    Grant {
        lease: Lease { shared: lease },
        kept,
        route,
    }
}

/// A grant (`token`, a mutex token or a hold) that too few replicas acknowledged: released in the background
/// (owner-checked), never taken by this wait, and reported.
pub(crate) fn unreplicated(
    inner: &Arc<RedisStore>,
    keys: &Arc<LockKeys>,
    expecting: Option<&mut Expecting>,
    token: String,
    ttl: Duration,
    acked: i64,
) -> Error {
    if let Some(expecting) = expecting {
        expecting.drop_handed(&token);
    }
    release_in_background(Arc::clone(inner), Arc::clone(keys), token, ttl);
    Error::NotReplicated {
        name: keys.name().to_owned(),
        acked: u32::try_from(acked).unwrap_or(0),
        required: inner.replicas.map_or(0, |r| r.count),
    }
}

/// A grant a release handed to `handed.token` (whose attempt was sent at `sent`), taken by a wait of any kind: the
/// grant, keeping `lease`, when the deadline it gives leaves at least a quarter of the claim; otherwise the token, to be
/// confirmed by an attempt.
///
/// The deadline: the release ran after the attempt that stored the token, which ran after it was sent, so the claim
/// lease it set ends no earlier than `sent + claim` (less the drift allowance, as for every lease).
pub(crate) fn take_hand_off(
    inner: &Arc<RedisStore>,
    keys: &Arc<LockKeys>,
    expecting: &mut Expecting,
    handed: Handed,
    sent: Instant,
    lease: (Duration, Option<Duration>),
) -> Result<Grant, String> {
    // A grant whose replication nobody confirmed (the release that handed it did not wait for replicas) is confirmed
    // by an attempt first, when the client requires acknowledgements: that attempt's call waits for them.
    if inner.replicas.is_some() || !hand_off_usable(&handed, sent) {
        return Err(handed.token);
    }
    let route = expecting.handed_over(&handed.token);
    let expiry = Expiry::handed(&handed, sent);
    let fence = i64::try_from(handed.fence).unwrap_or(i64::MAX);
    Ok(new_grant(
        inner,
        keys,
        handed.token,
        fence,
        lease,
        expiry,
        route,
    ))
}

/// When a grant a release handed to `handed.token` (whose attempt was sent at `sent`) can be started on at once: the
/// deadline it gives, if that leaves at least a quarter of the claim; otherwise it must be confirmed by an attempt.
///
/// The release ran after the attempt that stored the token, which ran after it was sent, so the claim lease it set
/// ends no earlier than `sent + claim` (less the drift allowance, as for every lease).
fn hand_off_usable(handed: &Handed, sent: Instant) -> bool {
    let valid_until = sent + handed.claim - drift(handed.claim);
    valid_until.saturating_duration_since(crate::engine::clock::now()) >= handed.claim / 4
}

/// What bounds a new grant's expiry from below: the request that made it possible left at `sent` (lease clock), and
/// the key had `left` to live when it ran (server time `run`, µs). `handed` when a release granted it (a claim lease).
pub(crate) struct Expiry {
    pub(crate) sent: Instant,
    pub(crate) left: Duration,
    pub(crate) run: i64,
    pub(crate) handed: bool,
}

impl Expiry {
    /// A grant whose request left at `sent` and ran at server time `run` (µs), `left_ms` before its lease ends.
    pub(crate) fn replied(sent: Instant, left_ms: i64, run: i64, handed: bool) -> Expiry {
        Expiry {
            sent,
            left: Duration::from_millis(u64::try_from(left_ms).unwrap_or(0)),
            run,
            handed,
        }
    }

    /// A grant a release handed over, by its message; the attempt that stored its token left at `sent`.
    pub(crate) fn handed(handed: &Handed, sent: Instant) -> Expiry {
        Expiry {
            sent,
            left: handed.claim,
            run: handed.run,
            handed: true,
        }
    }
}

/// How many replicas acknowledged a call, when that is fewer than the client requires: `(acked, required)`.
pub(crate) fn short_of(required: Option<ReplicaAcks>, acked: Option<u32>) -> Option<(u32, u32)> {
    let required = required?.count;
    let acked = acked.unwrap_or(0);
    (acked < required).then_some((acked, required))
}
