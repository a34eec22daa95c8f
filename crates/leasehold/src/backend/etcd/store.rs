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

use super::kind::key_kind;
use super::recipe::{Grant, Released, Waiter};
use super::session::{Conn, SessionOptions, Shared};
use super::{EtcdError, Kind};
use crate::backend::session::{
    Admitted, Background, Engine, EngineError, Enqueued, Opened, Primitives, Renewal, StoreError,
};
use crate::error::Error;
use crate::fence::Fence;

/// The tracing target of this file's events.
const TARGET: &str = "leasehold::etcd";

/// The most deletes one `force_release` transaction carries (etcd's default `--max-txn-ops` is 128).
const DELETE_BATCH: usize = 100;

/// etcd's settings and primitives under the session engine: where a client connects, its lock prefix, and what every
/// session is opened with but its TTL.
#[derive(Debug)]
pub(crate) struct Etcd {
    /// The URL as given (with the password, to open new sessions).
    url: String,
    pub(crate) prefix: String,
    options: SessionOptions,
}

impl Etcd {
    pub(crate) fn new(url: &str, prefix: String, options: SessionOptions) -> Etcd {
        Etcd {
            url: url.to_owned(),
            prefix,
            options,
        }
    }
}

/// A client's etcd side: the engine over etcd's primitives.
pub(crate) type EtcdStore = Engine<Etcd>;

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

/// A watch on one lock's prefix: what an election's observer waits on between its reads (`Election::observe`).
#[derive(Debug)]
pub(crate) struct EtcdFeed {
    stream: rpc::WatchStream,
}

impl EtcdFeed {
    /// Resolves when a key under the lock's prefix was written or deleted (true: read the lock again), or when the
    /// watch ended (false: cancelled by the member, the stream broken; open another).
    pub(crate) async fn changed(&mut self) -> bool {
        loop {
            match self.stream.message().await {
                Ok(Some(answer)) if answer.canceled() => return false,
                Ok(Some(answer)) if !answer.events().is_empty() => return true,
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return false,
            }
        }
    }
}

impl EtcdStore {
    /// A watch on lock `name`'s prefix from the member's current revision, opened before the observer's next read
    /// (so that nothing after that read goes unheard); `None` when it could not be opened in a call's time (the
    /// observer reads at its interval meanwhile, and tries again).
    pub(crate) async fn feed(&self, name: &str) -> Option<EtcdFeed> {
        let session = self.default_session().await.ok()?;
        let endpoints = &session.shared.conn.endpoints;
        let (i, mut client) = endpoints.current();
        let watched = format!("{}/", self.lock_path(name));
        let opened = async {
            let mut stream = client
                .watch(watched, Some(rpc::WatchOptions::new().with_prefix()))
                .await?;
            let created = stream.message().await?;
            Ok::<_, rpc::Error>((stream, created.is_some_and(|c| c.created())))
        };
        match tokio::time::timeout(endpoints.call_timeout(), opened).await {
            Ok(Ok((stream, true))) => Some(EtcdFeed { stream }),
            _ => {
                endpoints.failed(i);
                None
            }
        }
    }

    /// Connects: opens the session of the default lease now, so that an unreachable cluster fails here and not at the
    /// first lock. `options.ttl` is the default lease (of the locks that set no TTL).
    pub(crate) async fn connect(
        url: &str,
        prefix: String,
        options: SessionOptions,
    ) -> Result<EtcdStore, Error> {
        let shown = super::endpoints::redacted(url);
        let default_ttl = options.ttl;
        let store = Engine::new(Etcd::new(url, prefix, options), shown.into(), default_ttl);
        let session = store.default_session().await?;
        // etcd grants leases to anyone; reading the prefix needs the permission every lock needs, so refused or
        // missing credentials fail here, not at the first lock.
        let root = format!("{}/", store.store.prefix);
        session
            .shared
            .conn
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
            .map_err(|e| store.error(e))?;
        tracing::debug!(target: TARGET, url = %store.shown, lease = format_args!("{:x}", session.shared.conn.lease), ttl = ?session.shared.ttl, "etcd session opened");
        Ok(store)
    }

    /// The etcd path of lock `name`: `PREFIX/NAME` (its waiter keys live under `PREFIX/NAME/`).
    fn lock_path(&self, name: &str) -> String {
        format!("{}/{name}", self.store.prefix)
    }

    /// Every key (with its value) under a lock's `prefix`, oldest first, read for `op`; with the session that read it.
    async fn read_lock(
        &self,
        op: &'static str,
        prefix: &str,
    ) -> Result<(Arc<Shared>, rpc::GetResponse), Error> {
        let session = Arc::clone(&self.default_session().await?.shared);
        let read = session
            .conn
            .endpoints
            .call(op, |mut c| {
                let options = GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend);
                let prefix = prefix.to_owned();
                async move { c.get(prefix, Some(options)).await }
            })
            .await
            .map_err(|e| self.error(e))?;
        Ok((session, read))
    }

    /// Deletes every key of lock `name` (holders and waiters; not the keys of locks nested under its name), and
    /// returns the hold of the oldest, the holder, if there was one.
    pub(crate) async fn force_release(&self, name: &str) -> Result<Option<String>, Error> {
        let prefix = format!("{}/", self.lock_path(name));
        let (session, read) = self.read_lock("force release", &prefix).await?;
        let endpoints = &session.conn.endpoints;
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
                .map_err(|e| self.error(e))?;
        }
        Ok(own.into_iter().next().map(|(_, hold)| hold))
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

impl StoreError for EtcdError {
    fn store(_shown: &str) -> &'static str {
        "etcd"
    }

    fn transient(&self) -> bool {
        self.is_timeout()
            || matches!(self, EtcdError::Etcd { source, .. } if super::endpoints::is_transient(source))
    }

    fn as_engine(&self) -> Option<&EngineError> {
        match self {
            EtcdError::Engine(e) => Some(e),
            _ => None,
        }
    }
}

impl Primitives for Etcd {
    type Error = EtcdError;
    type Conn = Conn;
    /// The waiter key and its create revision.
    type Entry = (Arc<str>, i64);
    type Grant = Grant;

    const SESSION: &'static str = "etcd session";

    fn session_ttl(ttl: Duration) -> Result<Duration, Error> {
        lease_ttl(ttl)
    }

    fn path(&self, name: &str) -> Result<String, Error> {
        Ok(format!("{}/{name}", self.prefix))
    }

    async fn open(
        &self,
        ttl: Duration,
        _background: &Arc<Background>,
    ) -> Result<Opened<Conn>, EtcdError> {
        super::session::open(&self.url, &self.options.clone().ttl(ttl)).await
    }

    fn id(conn: &Conn) -> String {
        format!("{:x}", conn.lease)
    }

    async fn renew(shared: &Arc<Shared>, _round: i64) -> Renewal<Self::Entry> {
        super::session::renew(shared).await
    }

    async fn read_entries(shared: &Arc<Shared>, entries: Vec<Self::Entry>) -> Option<Vec<bool>> {
        super::session::read_keys(shared, &entries).await
    }

    async fn close(shared: &Arc<Shared>) -> Result<(), EtcdError> {
        super::session::revoke(shared).await
    }

    type Claim = super::recipe::Claim;
    type Waiter = Waiter;
    /// The key ahead.
    type Ahead = Vec<u8>;
    /// The revision the keys ahead were read at.
    type Seen = i64;
    type WaitState = ();

    fn claim(
        session: &Arc<Shared>,
        path: &str,
        kind: Kind,
        _hold: &str,
    ) -> Result<Self::Claim, EtcdError> {
        super::recipe::claim(session, path, kind)
    }

    async fn enqueue(
        session: &Arc<Shared>,
        path: &str,
        kind: Kind,
        hold: &str,
        claim: &mut Self::Claim,
    ) -> Result<Enqueued<Waiter>, EtcdError> {
        let (waiter, first) =
            super::recipe::enqueue_claimed(session, path, kind, hold, claim).await?;
        Ok(Enqueued { waiter, first })
    }

    fn abandon(session: &Arc<Shared>, claim: Self::Claim) {
        super::recipe::abandon(session, claim);
    }

    async fn ahead(
        session: &Arc<Shared>,
        path: &str,
        waiter: &Waiter,
        _kind: Kind,
        _state: &mut Self::WaitState,
    ) -> Result<(Vec<(Kind, Vec<u8>)>, i64), EtcdError> {
        super::recipe::ahead(session, path, waiter).await
    }

    async fn wait(
        session: &Arc<Shared>,
        path: &str,
        waiter: &Waiter,
        ahead: &[(Kind, Vec<u8>)],
        _on: Option<usize>,
        seen: i64,
        _state: &mut (),
    ) -> Result<(), EtcdError> {
        // The watch follows every key ahead, not only the one the rule names.
        super::recipe::wait(session, path, waiter, ahead, seen).await
    }

    fn grant_of(waiter: &Waiter) -> Grant {
        waiter.grant.clone()
    }

    fn fence(grant: &Grant) -> Fence {
        grant.fence()
    }

    fn entry(grant: &Grant) -> Self::Entry {
        (grant.key().into(), grant.revision())
    }

    async fn release(session: &Arc<Shared>, grant: &Grant) -> Result<bool, EtcdError> {
        Ok(super::recipe::release(session, grant).await? == Released::Released)
    }

    async fn rewrite(session: &Arc<Shared>, grant: &Grant, hold: &str) -> Result<bool, EtcdError> {
        super::recipe::rewrite(session, grant, hold).await
    }

    /// `PREFIX.terms/NAME`: beside the client's locks, not under any lock's prefix (whose keys are entries) nor under
    /// `PREFIX/` (whose keys `list` reads as locks). A plain key without a lease: it outlives the terms it counts.
    fn term_record(&self, name: &str) -> Result<String, Error> {
        Ok(format!("{}.terms/{name}", self.prefix))
    }

    async fn begin_term(
        session: &Arc<Shared>,
        grant: &Grant,
        record: &str,
        hold: &str,
    ) -> Result<Option<u64>, EtcdError> {
        super::recipe::begin_term(session, grant, record, hold).await
    }

    async fn terms(engine: &EtcdStore, record: &str) -> Result<u64, Error> {
        let session = engine.default_session().await?;
        let read = session
            .shared
            .conn
            .endpoints
            .call("read a term count", |mut c| async move {
                c.get(record, None).await
            })
            .await
            .map_err(|e| engine.error(e))?;
        match read.kvs().first() {
            Some(kv) => super::recipe::parse_count(kv.value()).map_err(|e| engine.error(e)),
            None => Ok(0),
        }
    }

    fn describe(grant: &Grant) -> String {
        grant.key().to_owned()
    }

    /// A key under the lock's prefix.
    type Listed = rpc::KeyValue;

    /// Every key under the lock's prefix, in create-revision order (a key another client wrote, `etcdctl lock`'s, an
    /// unknown layout's, counts as exclusive).
    async fn list(engine: &EtcdStore, name: &str) -> Result<Vec<(Kind, rpc::KeyValue)>, Error> {
        let prefix = format!("{}/", engine.lock_path(name));
        let (_, mut read) = engine.read_lock("inspect", &prefix).await?;
        Ok(read
            .take_kvs()
            .into_iter()
            .map(|kv| (key_kind(&prefix, kv.key()), kv))
            .collect())
    }

    /// Each holder's key and value, and the time left on its lease, as etcd counts it.
    async fn holders(
        engine: &EtcdStore,
        name: &str,
        holders: Vec<rpc::KeyValue>,
    ) -> Result<Vec<Option<Admitted>>, Error> {
        let prefix = format!("{}/", engine.lock_path(name));
        let session = engine.default_session().await?;
        let endpoints = &session.shared.conn.endpoints;
        let ttls = futures_util::future::join_all(holders.iter().map(|kv| {
            let lease = kv.lease();
            endpoints.call("lease time to live", move |mut c| async move {
                c.lease_time_to_live(lease, None).await
            })
        }))
        .await;
        Ok(holders
            .into_iter()
            .zip(ttls)
            .map(|(kv, ttl)| {
                Some(Admitted {
                    value: kv.value_str().unwrap_or_default().to_owned(),
                    entry: kv.key_str().unwrap_or_default().to_owned(),
                    kind: key_kind(&prefix, kv.key()),
                    fence: Fence::new(kv.create_revision().unsigned_abs()),
                    remaining: ttl
                        .ok()
                        .and_then(|t| u64::try_from(t.ttl()).ok())
                        .map(Duration::from_secs),
                })
            })
            .collect())
    }

    /// The lock names of every key under the client's prefix (leasehold's and `etcdctl lock`'s).
    async fn lock_names(engine: &EtcdStore) -> Result<Vec<String>, Error> {
        let session = engine.default_session().await?;
        let root = format!("{}/", engine.store.prefix);
        let read = session
            .shared
            .conn
            .endpoints
            .call("list", |mut c| {
                let root = root.clone();
                async move {
                    c.get(root, Some(GetOptions::new().with_prefix().with_keys_only()))
                        .await
                }
            })
            .await
            .map_err(|e| engine.error(e))?;
        Ok(read
            .kvs()
            .iter()
            .filter_map(|kv| lock_name(kv.key_str().ok()?.strip_prefix(&root)?))
            .map(str::to_owned)
            .collect())
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
