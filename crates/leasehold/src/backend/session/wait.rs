//! The wait of an acquisition on a store with sessions: its terms, and the retries around the store's attempts.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::Error;

/// How an acquisition on a store with sessions (etcd, ZooKeeper, PostgreSQL, MySQL/MariaDB) waits.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Wait {
    /// One try: busy unless admitted at once.
    Try,
    /// Until admitted, or until the deadline.
    Until(Option<Instant>),
}

/// How one acquisition on a store with sessions goes: the lease it asks for (which chooses the session its grant
/// lives under: `sessions.rs`), how it waits, and whether a wait ends at the first store error.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Terms {
    pub(crate) ttl: Duration,
    pub(crate) wait: Wait,
    pub(crate) fail_fast: bool,
}

/// The first pause after a failed attempt of a wait on a store with sessions; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// What a wait learned of the store being unavailable: the last error it rode out, which a wait that runs out reports
/// instead of a plain timeout (the command's exit 69, not 75), and whether it said so yet (one warning per wait). Shared
/// by the retries of whole attempts ([`until_granted`]) and the recipe's, which keep the entry (`recipe.rs`).
pub(crate) struct Outage<E> {
    name: String,
    last: std::sync::Mutex<Option<E>>,
}

impl<E: std::fmt::Display> Outage<E> {
    /// Nothing ridden out yet, in the wait for lock `name`.
    pub(crate) fn new(name: &str) -> Self {
        Outage {
            name: name.to_owned(),
            last: std::sync::Mutex::new(None),
        }
    }

    fn last(&self) -> std::sync::MutexGuard<'_, Option<E>> {
        self.last.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `error` as ridden out; the first of a run of them is logged as a warning.
    pub(crate) fn ride_out(&self, error: E) {
        let mut last = self.last();
        if last.is_none() {
            let name = &self.name;
            tracing::warn!(target: "leasehold::outage", lock = %name,
                "the store is unavailable while waiting for lock {name:?} ({error}); retrying until it answers");
        }
        *last = Some(error);
    }

    /// The store answered again: a wait that runs out now is a plain timeout.
    pub(crate) fn answered(&self) {
        self.last().take();
    }

    /// The last error ridden out and not answered since, if any.
    fn take(&self) -> Option<E> {
        self.last().take()
    }
}

/// The wait of an acquisition on a store with sessions, around its `attempt`s (each: the session, the grant, the
/// guard; `None` when a try found the lock busy): it rides out what `passes` (a member down, a session lost while
/// waiting) with backoff until the wait's deadline, unless `fail_fast`; a try never retries. `store_error` makes the
/// crate's error of the store's.
pub(crate) async fn until_granted<T, E, A>(
    name: &str,
    wait: Wait,
    fail_fast: bool,
    outage: &Outage<E>,
    mut attempt: impl FnMut() -> A,
    passes: impl Fn(&E) -> bool,
    store_error: impl Fn(E) -> Error,
) -> Result<T, Error>
where
    E: std::fmt::Display,
    A: std::future::Future<Output = Result<Option<T>, E>>,
{
    crate::error::require_runtime()?;
    let started = Instant::now();
    let (waits, deadline) = match wait {
        Wait::Try => (false, None),
        Wait::Until(deadline) => (true, deadline),
    };
    let mut backoff = FIRST_BACKOFF;
    loop {
        let outcome = match deadline {
            None => attempt().await,
            Some(deadline) => match tokio::time::timeout_at(deadline, attempt()).await {
                Ok(outcome) => outcome,
                Err(_) => {
                    return Err(match outage.take() {
                        Some(e) => store_error(e),
                        None => Error::Timeout {
                            name: name.to_owned(),
                            waited: started.elapsed(),
                        },
                    })
                }
            },
        };
        let error = match outcome {
            Ok(Some(guard)) => return Ok(guard),
            Ok(None) => {
                return Err(Error::Busy {
                    name: name.to_owned(),
                    remaining: None,
                })
            }
            Err(e) => e,
        };
        // A refusal (permission denied, a bad request) ends the wait at once.
        if !waits || fail_fast || !passes(&error) {
            return Err(store_error(error));
        }
        outage.ride_out(error);
        match deadline {
            Some(deadline) if Instant::now() + backoff >= deadline => {
                tokio::time::sleep_until(deadline).await;
            }
            _ => tokio::time::sleep(backoff).await,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
