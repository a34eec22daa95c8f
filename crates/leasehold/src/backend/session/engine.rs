//! A client's side of a store with sessions ([`Engine`]): its sessions, an acquisition around the store's recipe, the
//! grant turned into a lease that follows its session ([`Granted`]), and the grant's release ([`Hold`]).
//!
//! Each store is an `Engine<Its primitives>`; what only it does (`connect`, `inspect`, `held_locks`,
//! `force_release`) is an `impl Engine<…>` in its own folder.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::info::{held_among, lock_info};
use super::life::Session;
use super::sessions::{Sessions, StoreSession};
use super::state::Background;
use super::{EngineError, Primitives, SessionLoss, StoreError};
use crate::backend::admission::{admit, Admission, Kind};
use crate::backend::session::wait::{Outage, Terms, Wait};
use crate::backend::LockKeys;
use crate::engine::info::LockInfo;
use crate::engine::lease::{Lease, LeaseShared};
use crate::error::Error;

/// The tracing target of the engine's events (each names its store's session).
const TARGET: &str = "leasehold::session";

/// A client's side of a store with sessions: the store's settings and primitives (`store`), the URL as errors show it,
/// and the client's sessions, one per lease TTL.
pub(crate) struct Engine<P: Primitives> {
    pub(crate) store: P,
    /// The URL as shown in errors and logs: password hidden.
    pub(crate) shown: Arc<str>,
    sessions: Sessions<Session<P>>,
}

impl<P: Primitives> StoreSession for Session<P> {
    fn is_lost(&self) -> bool {
        self.loss().is_some()
    }

    fn following(&self) -> usize {
        self.shared.state.following()
    }
}

impl<P: Primitives + std::fmt::Debug> std::fmt::Debug for Engine<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("url", &self.shown)
            .field("store", &self.store)
            .field("sessions", &self.sessions)
            .finish()
    }
}

/// A grant just taken: its lease, which follows its session, and what releases it.
pub(crate) struct Granted<P: Primitives> {
    pub(crate) lease: Lease,
    pub(crate) hold: Hold<P>,
}

/// What a guard of a grant on a store with sessions holds to release it: the session its entry lives in, and the
/// grant.
pub(crate) struct Hold<P: Primitives> {
    /// The client's URL as shown in errors.
    pub(crate) shown: Arc<str>,
    pub(crate) session: Arc<Session<P>>,
    pub(crate) grant: P::Grant,
}

impl<P: Primitives> Engine<P> {
    /// No session yet: a lock that sets no TTL asks for `default_ttl`.
    pub(crate) fn new(store: P, shown: Arc<str>, default_ttl: Duration) -> Self {
        Engine {
            store,
            shown,
            sessions: Sessions::new(default_ttl),
        }
    }

    /// The clean-ups running in the background (dropped guards, abandoned acquisitions, dropped sessions).
    pub(crate) fn background(&self) -> &Arc<Background> {
        &self.sessions.background
    }

    /// The default lease: of the locks that set no TTL.
    pub(crate) fn default_ttl(&self) -> Duration {
        self.sessions.default_ttl()
    }

    /// The crate's error for an error of the store.
    pub(crate) fn error(&self, e: P::Error) -> Error {
        e.into_error(&self.shown)
    }

    /// The live session of `ttl` (as [`Primitives::session_ttl`] made it), or a new one when there is none yet or the
    /// last one was lost.
    pub(crate) async fn session(&self, ttl: Duration) -> Result<Arc<Session<P>>, P::Error> {
        self.sessions
            .get(ttl, |replacing| async move {
                let session = Session::open(&self.store, ttl, self.background()).await?;
                self.store.opened(ttl, &session.shared);
                if replacing {
                    tracing::info!(target: TARGET, store = P::SESSION, session = %P::id(&session.shared.conn), "the {} was lost; opened a new one", P::SESSION);
                }
                Ok(session)
            })
            .await
    }

    /// The session of the default lease (what the reads use), with the crate's error. (The SQL stores read without a
    /// session.)
    #[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
    pub(crate) async fn default_session(&self) -> Result<Arc<Session<P>>, Error> {
        self.session(self.default_ttl())
            .await
            .map_err(|e| self.error(e))
    }

    /// Grants the client's sessions follow now.
    pub(crate) fn kept_leases(&self) -> usize {
        self.sessions.following()
    }

    /// Waits until every background clean-up has been answered (or given up).
    pub(crate) async fn settle(&self) {
        self.background().settle().await;
    }

    /// Ends every session on the store (every entry of the client goes with them), then waits for the background
    /// clean-ups: true when every session's end was answered.
    pub(crate) async fn close(&self) -> bool {
        self.sessions
            .close(|s| async move { s.close().await })
            .await
    }

    /// The lock's state: its entries in queue order ([`Primitives::list`]), each admitted or waiting by the kinds'
    /// rules, and what the admitted ones hold ([`Primitives::holders`]).
    pub(crate) async fn inspect(&self, name: &str) -> Result<LockInfo, Error> {
        let listed = P::list(self, name).await?;
        let entries = listed.len();
        let kinds: Vec<Kind> = listed.iter().map(|(kind, _)| *kind).collect();
        let admitted = listed
            .into_iter()
            .enumerate()
            .filter(|(i, (kind, _))| admit(*kind, &kinds[..*i]) == Admission::Granted)
            .map(|(_, (_, entry))| entry)
            .collect();
        // A holder that left between the list and its read is no holder.
        let holders = P::holders(self, name, admitted)
            .await?
            .into_iter()
            .flatten()
            .collect();
        Ok(lock_info(name, holders, entries))
    }

    /// How many terms of the election `name` were counted ([`Primitives::terms`]).
    pub(crate) async fn terms(&self, name: &str) -> Result<u64, Error> {
        let record = self.store.term_record(name)?;
        P::terms(self, &record).await
    }

    /// Where the count of the terms of the election `name` lives ([`Primitives::term_record`]).
    pub(crate) fn term_record(&self, name: &str) -> Result<String, Error> {
        self.store.term_record(name)
    }

    /// The held locks whose names match the glob `pattern` (`*`, `?`, `[…]`, `\` as Redis's `SCAN MATCH`), each read
    /// by [`inspect`](Self::inspect).
    pub(crate) async fn held_locks(&self, pattern: &str) -> Result<Vec<LockInfo>, Error> {
        let names = P::lock_names(self).await?;
        held_among(
            names,
            pattern,
            |name| async move { self.inspect(&name).await },
        )
        .await
    }

    /// Waits as `terms` say until the lock of `keys` admits `kind`, storing `hold` (the hold string: token, tag,
    /// description) in the grant's entry, in the session of the lock's TTL. What passes by itself (no answer, a
    /// member going away, a session lost: a new one is opened) is ridden out until the wait's deadline, unless
    /// `fail_fast`; a try never retries.
    ///
    /// The future is boxed: the engine's acquisition nests deep enough that, inlined into every kind's lock future
    /// (which matches over every store), a caller's own `async` block around `lock()` passed the compiler's default
    /// recursion limit (the `cluster` test binary found it). One allocation per acquisition, beside round trips.
    pub(crate) fn acquire(
        &self,
        keys: Arc<LockKeys>,
        kind: Kind,
        hold: String,
        terms: Terms,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Granted<P>, Error>> + Send + '_>>
    {
        Box::pin(self.acquire_unboxed(keys, kind, hold, terms))
    }

    async fn acquire_unboxed(
        &self,
        keys: Arc<LockKeys>,
        kind: Kind,
        hold: String,
        terms: Terms,
    ) -> Result<Granted<P>, Error> {
        let Terms {
            ttl,
            wait,
            fail_fast,
        } = terms;
        let ttl = P::session_ttl(ttl)?;
        let path = self.store.path(keys.name())?;
        let waits = matches!(wait, Wait::Until(_));
        // Each attempt's entry has a hold of its own: an earlier attempt's entry may still be on its way to deletion
        // when the next is written.
        let attempts = AtomicUsize::new(0);
        let outage = Outage::new(keys.name());
        let attempt = || async {
            let hold = match attempts.fetch_add(1, Ordering::Relaxed) {
                0 => hold.clone(),
                _ => crate::fence::redrawn(&hold)
                    .map_err(|e| P::Error::from(EngineError::Entropy(e.to_string())))?,
            };
            let session = self.session(ttl).await?;
            let grant = super::recipe::acquire(
                &session.shared,
                &path,
                kind,
                &hold,
                waits,
                fail_fast,
                &outage,
            )
            .await?;
            match grant {
                Some(grant) => self.hold(&keys, hold, session, grant).map(Some),
                None => Ok(None),
            }
        };
        super::wait::until_granted(
            keys.name(),
            wait,
            fail_fast,
            &outage,
            attempt,
            P::Error::passes,
            |e| match e.as_engine() {
                Some(&EngineError::WrongPermits { stored }) => {
                    crate::backend::admission::wrong_permits(keys.name(), kind, stored)
                }
                _ => self.error(e),
            },
        )
        .await
    }

    /// A grant's lease, which follows its session from the session's last answered keep-alive (writing the entry
    /// renewed nothing). An error when the session was lost by then: the entry is deleted in the background and the
    /// wait goes on.
    fn hold(
        &self,
        keys: &Arc<LockKeys>,
        hold: String,
        session: Arc<Session<P>>,
        grant: P::Grant,
    ) -> Result<Granted<P>, P::Error> {
        let shared = &session.shared;
        let validity = shared.validity;
        let (sent, round) = shared.state.acked();
        let lease = LeaseShared::new(
            Arc::clone(keys),
            hold,
            P::fence(&grant),
            validity,
            sent,
            validity,
            round,
        );
        let following = shared.state.follow(&lease, P::entry(&grant));
        P::granted(shared, &grant, &lease);
        let lease = Lease { shared: lease };
        let hold = Hold {
            shown: Arc::clone(&self.shown),
            session: Arc::clone(&session),
            grant,
        };
        if !following || !lease.is_held() {
            hold.release_in_background();
            return Err(P::Error::session_lost(
                session.loss().unwrap_or(SessionLoss::Expired),
            ));
        }
        let shared = &lease.shared;
        crate::engine::trace::kind_event!(crate::engine::trace::kind_of_hold(&shared.token), debug, lock = %keys.name(), hold = %crate::engine::trace::words(&shared.token), fence = shared.fence.get(), "granted");
        Ok(Granted { lease, hold })
    }
}

impl<P: Primitives> Hold<P> {
    /// Whether the session the grant's entry lives in is lost (its entry is gone, or goes with the session).
    pub(crate) fn session_lost(&self) -> bool {
        self.session.loss().is_some()
    }

    /// Deletes the grant's entry if it is still the grant's: true when it was.
    pub(crate) async fn release(&self) -> Result<bool, Error> {
        P::release(&self.session.shared, &self.grant)
            .await
            .map_err(|e| e.into_error(&self.shown))
    }

    /// Stores `hold` as the grant's entry's hold if the entry is still the grant's: true when it was.
    pub(crate) async fn rewrite(&self, hold: &str) -> Result<bool, Error> {
        P::rewrite(&self.session.shared, &self.grant, hold)
            .await
            .map_err(|e| e.into_error(&self.shown))
    }

    /// Counts the grant's term: the count at `record` goes up and the entry's hold becomes `hold` and the count
    /// ([`Primitives::begin_term`]); `None` when the entry was gone.
    pub(crate) async fn begin_term(&self, record: &str, hold: &str) -> Result<Option<u64>, Error> {
        P::begin_term(&self.session.shared, &self.grant, record, hold)
            .await
            .map_err(|e| e.into_error(&self.shown))
    }

    /// Releases in the background (a dropped guard), counted in the client's [`Background`]; without a runtime the
    /// entry goes with its session.
    pub(crate) fn release_in_background(self) {
        let background = Arc::clone(&self.session.shared.background);
        background.spawn(async move {
            if let Err(e) = self.release().await {
                tracing::debug!(target: TARGET, store = P::SESSION, grant = %P::describe(&self.grant), error = %e, "a background release failed; the entry goes with the session");
            }
        });
    }
}
