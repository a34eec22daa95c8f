//! The etcd store behind a [`crate::Client`] connected with an `etcd://` URL: the recipe's session and
//! grants, turned into the crate's guards, leases and lock information.
//!
//! - **One session per lease TTL** (see [`crate::backend::sessions`]): a grant lives under the etcd lease of its
//!   lock's TTL, rounded up to whole seconds; each session is replaced by a new one (a new etcd lease) at the first
//!   acquisition after it was lost. Every grant's [`Lease`] follows its session (see
//!   [`Shared::follow`](super::session::Shared::follow)): its deadline is the session's, its loss is the session's
//!   loss or its own key found gone.
//! - **Kinds** map onto the recipe's three rules: a mutex, a fair mutex, a writer and a reentrant root are
//!   exclusive keys, a reader a shared key, a semaphore permit a key of `N` permits. The waiter key's value is the
//!   hold as Redis stores it (`dl1:…`, `r dl1:…`, `s1 dl1:…`), so [`inspect`](EtcdStore::inspect) reports holders,
//!   kinds and descriptions as on Redis.
//! - **Waiting** rides out what passes (a member down, a session lost while waiting) with backoff until the wait's
//!   deadline, unless the lock handle is `fail_fast`; a try never retries.

use std::sync::Arc;
use std::time::Duration;

use super::rpc::{self, DeleteOptions, GetOptions, SortOrder, SortTarget, Txn, TxnOp};

use super::kind::{admit, key_kind, Admission};
use super::recipe::{Grant, Released};
use super::session::{Session, SessionOptions};
use super::{EtcdError, Kind};
use crate::backend::redis::keys::LockKeys;
use crate::backend::session::{lock_info, Admitted, Background};
use crate::backend::sessions::{Sessions, StoreSession};
use crate::backend::{Terms, Wait};
use crate::client::{Client, LockInfo};
use crate::engine::lease::{Lease, LeaseShared};
use crate::error::Error;
use crate::fence::Fence;
use crate::kinds::guard::Guard;

/// The tracing target of this file's events.
const TARGET: &str = "leasehold::etcd";

/// The most deletes one `force_release` transaction carries (etcd's default `--max-txn-ops` is 128).
const DELETE_BATCH: usize = 100;

/// A client's etcd side: where it connects, its lock prefix, and its sessions (one per lease TTL).
pub(crate) struct EtcdStore {
    /// The URL as given (with the password, to open new sessions).
    url: String,
    /// The URL as shown in errors and logs: password hidden.
    shown: Arc<str>,
    pub(crate) prefix: String,
    /// What every session is opened with, but its TTL.
    options: SessionOptions,
    sessions: Sessions<Session>,
    /// The clean-ups running in the background (dropped guards, abandoned acquisitions, dropped sessions), for
    /// [`Client::flush_releases`] and [`Client::close`]: the sessions' own.
    background: Arc<Background>,
}

impl StoreSession for Session {
    fn is_lost(&self) -> bool {
        self.loss().is_some()
    }

    fn following(&self) -> usize {
        self.shared.state.following()
    }
}

/// The etcd lease a lock asking for `ttl` is granted under: `ttl` rounded up to whole seconds (etcd's unit). A lease
/// shorter than etcd's shortest ([`MIN_TTL`](super::MIN_TTL), 2 s) is refused rather than silently lengthened.
pub(crate) fn lease_ttl(ttl: Duration) -> Result<Duration, Error> {
    if ttl < super::MIN_TTL {
        return Err(crate::error::InvalidArgument::BadDuration {
            what: "lease",
            value: ttl,
            why: "must be at least 2s on etcd (etcd's shortest lease); it is rounded up to whole seconds",
        }
        .into());
    }
    Ok(Duration::from_secs(
        ttl.as_secs() + u64::from(ttl.subsec_nanos() != 0),
    ))
}

/// What a guard of an etcd grant needs to release it: the session the key lives under, and the grant.
pub(crate) struct EtcdHold {
    /// The client's URL as shown in errors.
    shown: Arc<str>,
    session: Arc<Session>,
    grant: Grant,
    background: Arc<Background>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("url", &self.shown)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects: opens the session of the default lease now, so that an unreachable cluster fails here and not at the
    /// first lock. `options.ttl` is the default lease (of the locks that set no TTL).
    pub(crate) async fn connect(
        url: &str,
        prefix: String,
        mut options: SessionOptions,
    ) -> Result<EtcdStore, Error> {
        let shown = super::endpoints::redacted(url);
        let sessions = Sessions::new(options.ttl);
        options.background = Arc::clone(&sessions.background);
        let store = EtcdStore {
            url: url.to_owned(),
            shown: shown.into(),
            prefix,
            background: Arc::clone(&options.background),
            options,
            sessions,
        };
        let session = store
            .session(store.sessions.default_ttl())
            .await
            .map_err(|e| store_error(&store.shown, e))?;
        // etcd grants leases to anyone; reading the prefix needs the permission every lock needs, so refused or
        // missing credentials fail here, not at the first lock.
        let root = format!("{}/", store.prefix);
        session
            .shared
            .endpoints
            .call("permission check", |mut c| {
                let root = root.clone();
                async move {
                    let options = GetOptions::new()
                        .with_prefix()
                        .with_keys_only()
                        .with_limit(1);
                    c.get(root, Some(options)).await
                }
            })
            .await
            .map_err(|e| store_error(&store.shown, e))?;
        tracing::debug!(target: TARGET, url = %store.shown, lease = format_args!("{:x}", session.lease_id()), ttl = ?session.ttl(), "etcd session opened");
        Ok(store)
    }

    /// The default lease: of the locks that set no TTL.
    pub(crate) fn default_ttl(&self) -> Duration {
        self.sessions.default_ttl()
    }

    /// The live session of lease `ttl` (whole seconds, at least [`MIN_TTL`](super::MIN_TTL)), or a new one (a new
    /// lease) when there is none yet or the last one was lost.
    async fn session(&self, ttl: Duration) -> Result<Arc<Session>, EtcdError> {
        self.sessions
            .get(ttl, |replacing| async move {
                let session = Session::connect(&self.url, self.options.clone().ttl(ttl)).await?;
                if replacing {
                    tracing::info!(target: TARGET, lease = format_args!("{:x}", session.lease_id()), "the etcd session was lost; opened a new one");
                }
                Ok(session)
            })
            .await
    }

    /// Grants the client's sessions follow now.
    pub(crate) fn kept_leases(&self) -> usize {
        self.sessions.following()
    }

    /// The etcd path of lock `name`: `PREFIX/NAME` (its waiter keys live under `PREFIX/NAME/`).
    pub(crate) fn path(&self, name: &str) -> String {
        format!("{}/{name}", self.prefix)
    }

    /// Waits as `wait` says until the lock of `keys` admits `kind`, storing `hold` (the hold string: token, tag,
    /// description) in the waiter key, and returns the grant's guard.
    pub(crate) async fn acquire(
        &self,
        client: &Client,
        keys: Arc<LockKeys>,
        kind: Kind,
        hold: String,
        terms: Terms,
    ) -> Result<Guard, Error> {
        let Terms {
            ttl,
            wait,
            fail_fast,
        } = terms;
        let ttl = lease_ttl(ttl)?;
        let path = self.path(keys.name());
        let waits = matches!(wait, Wait::Until(_));
        let attempt = || async {
            let session = self.session(ttl).await?;
            match session.grant(&path, kind, &hold, waits).await? {
                Some(grant) => self
                    .hold(client, &keys, hold.clone(), session, grant)
                    .map(Some),
                None => Ok(None),
            }
        };
        // What passes by itself: a lost session (a new one is opened), no answer, a member going away.
        let passes = |e: &EtcdError| {
            e.is_lost()
                || e.is_timeout()
                || matches!(e, EtcdError::Etcd { source, .. } if super::endpoints::is_transient(source))
        };
        crate::backend::until_granted(keys.name(), wait, fail_fast, attempt, passes, |e| match e {
            EtcdError::WrongPermits { stored } => {
                crate::backend::admission::wrong_permits(keys.name(), kind, stored)
            }
            e => store_error(&self.shown, e),
        })
        .await
    }

    /// The guard of a grant: a lease that follows the session, from the session's last acknowledged keep-alive (the
    /// key's creation does not renew the lease). An error when the session was lost by then: the grant is given back
    /// and the wait goes on.
    fn hold(
        &self,
        client: &Client,
        keys: &Arc<LockKeys>,
        hold: String,
        session: Arc<Session>,
        grant: Grant,
    ) -> Result<Guard, EtcdError> {
        let ttl = session.ttl();
        let (sent, round) = session.shared.state.acked();
        let lease = LeaseShared::new(Arc::clone(keys), hold, grant.fence(), ttl, sent, ttl, round);
        let following = session.shared.follow(&lease, grant.key(), grant.revision());
        let guard = Guard::on_session(
            client.clone(),
            Lease {
                shared: Arc::clone(&lease),
            },
            crate::backend::SessionHold::Etcd(EtcdHold {
                shown: Arc::clone(&self.shown),
                session: Arc::clone(&session),
                grant,
                background: Arc::clone(&self.background),
            }),
        );
        if !following || !guard.is_held() {
            // Dropped: released in the background, if the key is still there at all.
            drop(guard);
            return Err(EtcdError::SessionLost(
                session.loss().unwrap_or(super::SessionLoss::Expired),
            ));
        }
        crate::engine::trace::kind_event!(crate::engine::trace::kind_of_hold(&lease.token), debug, lock = %keys.name(), hold = %crate::engine::trace::words(&lease.token), fence = lease.fence.get(), "granted");
        Ok(guard)
    }

    /// Every key (with its value) under a lock's `prefix`, oldest first, read for `op`; with the session that read it.
    async fn read_lock(
        &self,
        op: &'static str,
        prefix: &str,
    ) -> Result<(Arc<Session>, rpc::GetResponse), Error> {
        let session = self
            .session(self.default_ttl())
            .await
            .map_err(|e| store_error(&self.shown, e))?;
        let read = session
            .shared
            .endpoints
            .call(op, |mut c| {
                let options = GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend);
                let prefix = prefix.to_owned();
                async move { c.get(prefix, Some(options)).await }
            })
            .await
            .map_err(|e| store_error(&self.shown, e))?;
        Ok((session, read))
    }

    /// The lock's state: every key under its prefix in create-revision order, each admitted or waiting by the rules.
    pub(crate) async fn inspect(&self, name: &str) -> Result<LockInfo, Error> {
        let prefix = format!("{}/", self.path(name));
        let (session, read) = self.read_lock("inspect", &prefix).await?;
        let endpoints = &session.shared.endpoints;
        let kvs = read.kvs();
        let keys: Vec<Vec<u8>> = kvs.iter().map(|kv| kv.key().to_vec()).collect();
        let admitted: Vec<_> = kvs
            .iter()
            .enumerate()
            .filter(|(i, kv)| {
                admit(key_kind(&prefix, kv.key()), &prefix, &keys[..*i]) == Admission::Granted
            })
            .map(|(_, kv)| kv)
            .collect();
        // The time left on each holder's lease, as etcd counts it.
        let ttls = futures_util::future::join_all(admitted.iter().map(|kv| {
            let lease = kv.lease();
            endpoints.call("lease time to live", move |mut c| async move {
                c.lease_time_to_live(lease, None).await
            })
        }))
        .await;
        let admitted = admitted
            .into_iter()
            .zip(ttls)
            .map(|(kv, ttl)| Admitted {
                value: kv.value_str().unwrap_or_default().to_owned(),
                entry: kv.key_str().unwrap_or_default().to_owned(),
                kind: key_kind(&prefix, kv.key()),
                fence: Fence::new(kv.create_revision().unsigned_abs()),
                remaining: ttl
                    .ok()
                    .and_then(|t| u64::try_from(t.ttl()).ok())
                    .map(Duration::from_secs),
            })
            .collect();
        Ok(lock_info(name, admitted, kvs.len()))
    }

    /// The held locks whose names match the glob `pattern` (`*`, `?`, `[…]`, `\` as Redis's `SCAN MATCH`).
    pub(crate) async fn held_locks(&self, pattern: &str) -> Result<Vec<LockInfo>, Error> {
        let session = self
            .session(self.default_ttl())
            .await
            .map_err(|e| store_error(&self.shown, e))?;
        let root = format!("{}/", self.prefix);
        let read = session
            .shared
            .endpoints
            .call("list", |mut c| {
                let root = root.clone();
                async move {
                    c.get(root, Some(GetOptions::new().with_prefix().with_keys_only()))
                        .await
                }
            })
            .await
            .map_err(|e| store_error(&self.shown, e))?;
        let names: Vec<String> = read
            .kvs()
            .iter()
            .filter_map(|kv| lock_name(kv.key_str().ok()?.strip_prefix(&root)?))
            .map(str::to_owned)
            .collect();
        crate::backend::session::held_among(names, pattern, |name| async move {
            self.inspect(&name).await
        })
        .await
    }

    /// Deletes every key of lock `name` (holders and waiters; not the keys of locks nested under its name), and
    /// returns the hold of the oldest, the holder, if there was one.
    pub(crate) async fn force_release(&self, name: &str) -> Result<Option<String>, Error> {
        let prefix = format!("{}/", self.path(name));
        let (session, read) = self.read_lock("force release", &prefix).await?;
        let endpoints = &session.shared.endpoints;
        let own: Vec<(String, String)> = read
            .kvs()
            .iter()
            .filter_map(|kv| {
                let key = kv.key_str().ok()?;
                let rest = key.strip_prefix(&prefix)?;
                (lock_name(&format!("x/{rest}")) == Some("x")).then(|| {
                    let value = kv.value_str().unwrap_or_default();
                    let hold = if value.contains(crate::fence::TOKEN_PREFIX) {
                        crate::fence::token_of(value)
                    } else {
                        key
                    };
                    (key.to_owned(), hold.to_owned())
                })
            })
            .collect();
        for chunk in own.chunks(DELETE_BATCH) {
            endpoints
                .call("force release", |mut c| {
                    let txn = Txn::new().and_then(
                        chunk
                            .iter()
                            .map(|(key, _)| TxnOp::delete(key.as_str(), None::<DeleteOptions>))
                            .collect::<Vec<_>>(),
                    );
                    async move { c.txn(txn).await }
                })
                .await
                .map_err(|e| store_error(&self.shown, e))?;
        }
        Ok(own.into_iter().next().map(|(_, hold)| hold))
    }

    /// Waits until every background release has been answered (or given up).
    pub(crate) async fn settle(&self) {
        self.background.settle().await;
    }

    /// Revokes the lease of every session (every key of the client goes with them), then waits for the background
    /// releases: true when every revoke was answered.
    pub(crate) async fn close(&self) -> bool {
        self.sessions
            .close(|s| async move { s.revoke().await })
            .await
    }
}

impl EtcdHold {
    /// Whether the session the key lives under is lost (its key is gone, or goes with the lease).
    pub(crate) fn session_lost(&self) -> bool {
        self.session.loss().is_some()
    }

    /// Deletes the grant's key if it is still the grant's: true when it was.
    pub(crate) async fn release(&self) -> Result<bool, Error> {
        match self.session.release(self.grant.clone()).await {
            Ok(Released::Released) => Ok(true),
            Ok(Released::AlreadyGone) => Ok(false),
            Err(e) => Err(store_error(&self.shown, e)),
        }
    }

    /// Releases in the background (a dropped guard); without a runtime the key goes with the session's lease when
    /// the client is dropped.
    pub(crate) fn release_in_background(self) {
        let background = Arc::clone(&self.background);
        background.spawn(async move {
            if let Err(e) = self.release().await {
                tracing::debug!(target: TARGET, key = %self.grant.key(), error = %e, "a background release failed; the key goes with the session's lease");
            }
        });
    }
}

/// The lock name of a key under the client's prefix: `NAME/<lease hex>/lh1.<tag>.<grant>` (leasehold's) or
/// `NAME/<lease hex>` (`etcdctl lock`'s); `None` for any other key.
fn lock_name(rest: &str) -> Option<&str> {
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    let (head, last) = rest.rsplit_once('/')?;
    if last.starts_with("lh1.") {
        let (name, lease) = head.rsplit_once('/')?;
        return (hex(lease) && !name.is_empty()).then_some(name);
    }
    (hex(last) && !head.is_empty()).then_some(head)
}

/// The crate's error for an error of the recipe.
pub(crate) fn store_error(url: &str, e: EtcdError) -> Error {
    match e {
        EtcdError::Entropy(why) => Error::Entropy(why),
        e => Error::Store {
            store: "etcd",
            url: url.to_owned(),
            source: Box::new(e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names_come_from_leasehold_and_etcdctl_keys() {
        assert_eq!(
            lock_name("orders:42/694d7a1b2c/lh1.x.0123456789abcdef"),
            Some("orders:42")
        );
        assert_eq!(lock_name("a/b/694d/lh1.s.0123456789abcdef"), Some("a/b"));
        assert_eq!(lock_name("jobs/694d7a1b2c"), Some("jobs"));
        assert_eq!(lock_name("jobs/not-hex"), None);
        assert_eq!(lock_name("694d"), None);
    }
}
