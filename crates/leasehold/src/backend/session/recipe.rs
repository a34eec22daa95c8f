//! One acquisition on a store with sessions, written once over the store's primitives: write an entry in the lock's
//! order, read the entries ahead, apply the kind's rule, wait for a change, read again.
//!
//! 1. **Claim, then enqueue.** What names the acquisition's entry is drawn before anything is written (etcd's waiter
//!    key, ZooKeeper's node prefix, the SQL hold), and held by a [`Pending`] that deletes the entry in the background
//!    (counted in the client's [`Background`](super::Background)) if the acquisition ends without a grant: dropped,
//!    given up, refused, or failed. Only then is the entry written, so that a write whose answer is lost is still
//!    cleaned up.
//! 2. **Check.** The entries ahead of this one are read (the read also checks this one still exists: gone, the wait
//!    ends with the store's "lost while waiting") and the kind's rule ([`admit`]) says: granted, wait for the entry at
//!    one place ahead, wait for any, or refused (a semaphore of another count).
//! 3. **Wait** for a change that may admit it (a watch, a notification, a poll; at most a session's TTL), or the
//!    session's loss, whichever is first; then check again.
//! 4. **A try** that is not admitted at once takes its entry back and answers busy.
//!
//! A store error while waiting (no answer, a member going away) is ridden out with backoff *keeping the entry* and its
//! place in the queue, unless the acquisition is `fail_fast`; an entry found gone, or the session lost, ends the
//! attempt, and the wait around it (`wait.rs`) begins another with a new entry. Before issue 35 only the SQL stores
//! kept their place; etcd and ZooKeeper wrote a new entry at the back of the queue after any error.

use std::sync::Arc;
use std::time::Duration;

use super::life::Shared;
use super::wait::Outage;
use super::{EngineError, Enqueued, Primitives, StoreError};
use crate::backend::admission::{admit, Admission, Kind};

/// The first pause after a store error inside a wait; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The tracing target of the recipe's events.
const TARGET: &str = "leasehold::session";

/// An acquisition's claim until it is granted or its entry taken back: dropped armed, it deletes the entry in the
/// background.
struct Pending<'a, P: Primitives> {
    session: &'a Arc<Shared<P>>,
    claim: Option<P::Claim>,
}

impl<P: Primitives> Pending<'_, P> {
    /// The entry stays (granted), or is already gone.
    fn disarm(&mut self) {
        self.claim = None;
    }
}

impl<P: Primitives> Drop for Pending<'_, P> {
    fn drop(&mut self) {
        if let Some(claim) = self.claim.take() {
            P::abandon(self.session, claim);
        }
    }
}

/// One acquisition of `kind` on the lock at `path` in `session`, storing `hold` in its entry: the grant once the rule
/// admits it, or, for a try (`waits` false), `None` when the first check finds it busy.
///
/// # Cancel safety
///
/// Dropping the future (or any error) deletes the entry in the background; at worst it stays until the session ends.
/// A store error ridden out while waiting is recorded in `outage` (logged once; reported if the wait runs out before
/// the store answers again).
pub(crate) async fn acquire<P: Primitives>(
    session: &Arc<Shared<P>>,
    path: &str,
    kind: Kind,
    hold: &str,
    waits: bool,
    fail_fast: bool,
    outage: &Outage<P::Error>,
) -> Result<Option<P::Grant>, P::Error> {
    session.check_alive()?;
    let mut pending = Pending {
        session,
        claim: Some(P::claim(session, path, kind, hold)?),
    };
    let Some(claim) = pending.claim.as_mut() else {
        unreachable!("the claim was just set");
    };
    let Enqueued { waiter, first } = P::enqueue(session, path, kind, hold, claim).await?;
    if first {
        pending.disarm();
        return Ok(Some(P::grant_of(&waiter)));
    }
    let mut state = P::WaitState::default();
    let mut backoff = FIRST_BACKOFF;
    loop {
        session.check_alive()?;
        let error = match P::ahead(session, path, &waiter, kind, &mut state).await {
            Ok((ahead, seen)) => {
                outage.answered();
                let kinds: Vec<Kind> = ahead.iter().map(|(kind, _)| *kind).collect();
                let on = match admit(kind, &kinds) {
                    Admission::Granted => {
                        pending.disarm();
                        return Ok(Some(P::grant_of(&waiter)));
                    }
                    // Refused: the entry is deleted in the background (`pending`).
                    Admission::WrongPermits(stored) => {
                        return Err(EngineError::WrongPermits {
                            stored: stored.get(),
                        }
                        .into());
                    }
                    // A try not admitted at once takes its entry back; if that delete gets no answer, `pending` does
                    // it again in the background.
                    _ if !waits => {
                        if P::release(session, &P::grant_of(&waiter)).await.is_ok() {
                            pending.disarm();
                        }
                        return Ok(None);
                    }
                    Admission::WaitFor(i) => Some(i),
                    Admission::WaitForAny => None,
                };
                backoff = FIRST_BACKOFF;
                let waited = tokio::select! {
                    waited = P::wait(session, path, &waiter, &ahead, on, seen, &mut state) => waited,
                    loss = session.lost() => return Err(P::Error::session_lost(loss)),
                };
                match waited {
                    Ok(()) => continue,
                    Err(e) => e,
                }
            }
            Err(e) => e,
        };
        // A store error: ridden out keeping the entry, unless it says the entry or the session is gone, or the
        // acquisition does not wait out errors.
        let rides_out = error.passes() && !error.is_lost() && waits && !fail_fast;
        if !rides_out {
            return Err(error);
        }
        tracing::debug!(target: TARGET, store = P::SESSION, %path, %error, "a check failed while waiting; the entry keeps its place");
        outage.ride_out(error);
        let pause = backoff;
        backoff = (backoff * 2).min(MAX_BACKOFF);
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            loss = session.lost() => return Err(P::Error::session_lost(loss)),
        }
    }
}
