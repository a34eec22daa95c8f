//! The ZooKeeper store behind a [`crate::Client`] connected with a `zk://` URL: the recipe's session and grants,
//! turned into the crate's guards, leases and lock information.
//!
//! - **One session per lease TTL** (see [`crate::backend::sessions`]): a grant lives in the session whose timeout
//!   was asked as its lock's TTL (the ensemble negotiates it within its bounds; see [`ZkStore::session`]); each
//!   session is replaced by a new one at the first acquisition after it was lost. Every grant's [`Lease`] follows its
//!   session: its deadline is the session's, its loss the session's loss, or its own node found deleted (a watch on
//!   it, and a read of every grant's node after each answered keep-alive).
//! - **Kinds** map onto the three rules as on etcd, and the node's data is the hold as Redis stores it, so
//!   [`inspect`](ZkStore::inspect) reports holders, kinds and descriptions as on the other stores.

use std::sync::Arc;
use std::time::Duration;

use super::kind::{queue, Contender};
use super::recipe::Grant;
use super::session::{Conn, Shared, DEFAULT_TIMEOUT, MAX_TIMEOUT, MIN_TIMEOUT};
use super::url::{check_path, Target};
use super::watch::{park, watch, watched, Watch};
use super::ZkError;
use crate::backend::admission::{admitted, Kind};
use crate::backend::session::life::Session;
use crate::backend::session::{
    Admitted, Background, Engine, EngineError, Enqueued, Opened, Primitives, Renewal, StoreError,
};
use crate::engine::lease::LeaseShared;
use crate::error::{Error, InvalidArgument};
use crate::fence::Fence;

/// The tracing target of this file's events.
const TARGET: &str = "leasehold::zookeeper";

/// What a client asks of its ZooKeeper sessions.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// The session timeout asked for by the locks that set no TTL (ZooKeeper may grant less or more).
    pub(crate) timeout: Duration,
    /// How long one connection attempt may take.
    pub(crate) connection_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            timeout: DEFAULT_TIMEOUT,
            connection_timeout: Duration::from_secs(2),
        }
    }
}

/// ZooKeeper's settings and primitives under the session engine: where a client connects and where its locks live.
#[derive(Debug)]
pub(crate) struct ZooKeeper {
    target: Target,
    pub(crate) prefix: String,
    /// `CHROOT/PREFIX`: the node every lock of the client lives under.
    root: String,
    options: Options,
}

/// A client's ZooKeeper side: the engine over ZooKeeper's primitives.
pub(crate) type ZkStore = Engine<ZooKeeper>;

/// The session timeout a lock asking for `ttl` asks ZooKeeper for: `ttl` itself, refused outside what the protocol
/// and the keeper take ([`MIN_TIMEOUT`], 1 s, to [`MAX_TIMEOUT`], 24 days).
pub(crate) fn session_timeout(ttl: Duration) -> Result<Duration, Error> {
    if !(MIN_TIMEOUT..=MAX_TIMEOUT).contains(&ttl) {
        return Err(InvalidArgument::BadDuration {
            what: "lease",
            value: ttl,
            why: "must be at least 1s and at most 24 days on ZooKeeper (the session timeout asked for)",
        }
        .into());
    }
    Ok(ttl)
}

/// One-shot watches on a lock, set before an election observer's read (`Election::observe`): on its children (a
/// grant, a release, a waiter; on the node's creation when there is none) and on its holder's data (a proclamation, a
/// term's count). The first to fire ends the feed, and the next read sets new ones; the others are kept until they
/// fire ([`park`]), since dropping a watcher costs a request of its own.
pub(crate) struct ZkFeed {
    watches: Vec<Watch>,
}

impl std::fmt::Debug for ZkFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkFeed")
            .field("watches", &self.watches.len())
            .finish()
    }
}

impl ZkFeed {
    /// Resolves when one of the watches fired: always `false`, since a fired watch is spent (open another).
    pub(crate) async fn changed(&mut self) -> bool {
        if self.watches.is_empty() {
            return std::future::pending().await;
        }
        let watches = std::mem::take(&mut self.watches);
        let (_, _, rest) = futures_util::future::select_all(watches).await;
        rest.into_iter().for_each(park);
        false
    }
}

impl Drop for ZkFeed {
    fn drop(&mut self) {
        self.watches.drain(..).for_each(park);
    }
}

impl ZkStore {
    /// Watches on lock `name` (see [`ZkFeed`]), set before the observer's next read so that no change after it goes
    /// unheard; `None` when ZooKeeper could not be asked (the observer reads at its interval meanwhile).
    pub(crate) async fn feed(&self, name: &str) -> Option<ZkFeed> {
        let path = self.store.path(name).ok()?;
        let session = self.default_session().await.ok()?;
        let shared = &session.shared;
        let zk = shared.client().ok()?;
        let mut watches = Vec::new();
        match shared
            .call("observe", zk.get_and_watch_children(&path))
            .await
        {
            Ok((children, _, watcher)) => {
                watches.push(watch(watcher));
                if let Some(first) = queue(&children).first() {
                    let node = format!("{path}/{}", first.name);
                    let read = shared.call("observe", zk.get_and_watch_data(&node)).await;
                    if let Ok(Some(watcher)) = watched(read) {
                        watches.push(watch(watcher));
                    }
                }
            }
            Err(ZkError::ZooKeeper {
                source: zookeeper_client::Error::NoNode,
                ..
            }) => {
                let (_, watcher) = shared
                    .call("observe", zk.check_and_watch_stat(&path))
                    .await
                    .ok()?;
                watches.push(watch(watcher));
            }
            Err(_) => return None,
        }
        Some(ZkFeed { watches })
    }

    /// Connects: opens the first session now, so that an unreachable ensemble fails here and not at the first lock.
    /// (ZooKeeper takes any digest credentials: a wrong password shows only where a node's ACL asks for it.)
    pub(crate) async fn connect(
        url: &str,
        prefix: String,
        options: Options,
    ) -> Result<ZkStore, Error> {
        let target =
            super::url::parse_url(url).map_err(|e| InvalidArgument::BadUrl(e.to_string()))?;
        let shown: Arc<str> = super::url::redacted(url).into();
        let root = format!("{}/{prefix}", target.chroot);
        check_path(&root).map_err(|why| InvalidArgument::BadPrefix {
            prefix: prefix.clone(),
            rule: format!("on ZooKeeper it makes the node path {root:?}, which has {why}"),
        })?;
        let default_ttl = options.timeout;
        let zk = ZooKeeper {
            target,
            prefix,
            root,
            options,
        };
        let store = Engine::new(zk, shown, default_ttl);
        let session = store.default_session().await?;
        tracing::debug!(target: TARGET, url = %store.shown, session = format_args!("{:x}", session.shared.id()), timeout = ?session.shared.ttl, "ZooKeeper session opened");
        Ok(store)
    }

    /// The contenders of lock `name` in queue order (none when its node does not exist), read for `op`; with the
    /// lock's node and the session that read them.
    async fn contenders(
        &self,
        op: &'static str,
        name: &str,
    ) -> Result<(String, Arc<Session<ZooKeeper>>, Vec<Contender>), Error> {
        let path = self.store.path(name)?;
        let session = self.default_session().await?;
        let shared = &session.shared;
        let zk = shared.client().map_err(|e| self.error(e))?;
        let children = match shared.call(op, zk.list_children(&path)).await {
            Ok(children) => children,
            Err(ZkError::ZooKeeper {
                source: zookeeper_client::Error::NoNode,
                ..
            }) => Vec::new(),
            Err(e) => return Err(self.error(e)),
        };
        let contenders = queue(&children);
        Ok((path, session, contenders))
    }

    /// Deletes every contender of lock `name` (holders and waiters; not the locks nested under its name), and returns
    /// the hold of the first, the holder, if there was one.
    pub(crate) async fn force_release(&self, name: &str) -> Result<Option<String>, Error> {
        let (path, session, contenders) = self.contenders("force release", name).await?;
        let shared = &session.shared;
        let zk = &shared.client().map_err(|e| self.error(e))?;
        let mut first = None;
        for (i, contender) in contenders.iter().enumerate() {
            let node = format!("{path}/{}", contender.name);
            if i == 0 {
                first = shared
                    .call("force release", zk.get_data(&node))
                    .await
                    .ok()
                    .map(|(data, _)| {
                        let value = String::from_utf8_lossy(&data).into_owned();
                        if value.contains(crate::fence::TOKEN_PREFIX) {
                            crate::fence::token_of(&value).to_owned()
                        } else {
                            node.clone()
                        }
                    });
            }
            match shared.call("force release", zk.delete(&node, None)).await {
                Ok(())
                | Err(ZkError::ZooKeeper {
                    source: zookeeper_client::Error::NoNode,
                    ..
                }) => {}
                Err(e) => return Err(self.error(e)),
            }
        }
        Ok(first)
    }
}

impl StoreError for ZkError {
    fn store(_shown: &str) -> &'static str {
        "zookeeper"
    }

    fn transient(&self) -> bool {
        self.is_transient()
    }

    fn as_engine(&self) -> Option<&EngineError> {
        match self {
            ZkError::Engine(e) => Some(e),
            _ => None,
        }
    }
}

impl Primitives for ZooKeeper {
    type Error = ZkError;
    type Conn = Conn;
    /// The grant's node and its `czxid`.
    type Entry = (Arc<str>, i64);
    type Grant = Grant;

    const SESSION: &'static str = "ZooKeeper session";

    fn session_ttl(ttl: Duration) -> Result<Duration, Error> {
        session_timeout(ttl)
    }

    /// The node of lock `name`: `ROOT/NAME`; an error when that is not a path ZooKeeper takes.
    fn path(&self, name: &str) -> Result<String, Error> {
        node_of(format!("{}/{name}", self.root), name)
    }

    async fn open(
        &self,
        timeout: Duration,
        _background: &Arc<Background>,
    ) -> Result<Opened<Conn>, ZkError> {
        let digest = self.target.digest.as_deref().map(str::as_bytes);
        super::session::open(
            &self.target.servers,
            timeout,
            digest,
            self.options.connection_timeout,
        )
        .await
    }

    /// ZooKeeper negotiates the timeout within its bounds (`minSessionTimeout` and `maxSessionTimeout`, by default 2
    /// and 20 ticks): the session, and so every grant in it, runs with the negotiated one, which its guards' leases
    /// report ([`Lease::ttl`](crate::Lease::ttl) is 5/8 of it, the local validity), and a negotiated timeout other
    /// than the one asked is logged as a warning naming the bound. Tested by `zookeeper_client`'s
    /// `session::a_lease_outside_the_ensembles_bounds_runs_with_the_negotiated_timeout`.
    fn opened(&self, timeout: Duration, session: &Shared) {
        let negotiated = session.ttl;
        if negotiated != timeout {
            let bound = if negotiated > timeout {
                "minSessionTimeout"
            } else {
                "maxSessionTimeout"
            };
            tracing::warn!(target: TARGET, asked = ?timeout, ?negotiated, "ZooKeeper negotiated a session timeout of {negotiated:?} for a lease of {timeout:?} (the ensemble's {bound} is {negotiated:?}): the locks of that lease run with {negotiated:?}");
        }
    }

    fn id(conn: &Conn) -> String {
        format!("{:x}", conn.id)
    }

    async fn renew(shared: &Arc<Shared>, _round: i64) -> Renewal<Self::Entry> {
        super::session::renew(shared).await
    }

    async fn read_entries(shared: &Arc<Shared>, entries: Vec<Self::Entry>) -> Option<Vec<bool>> {
        super::session::read_nodes(shared, &entries).await
    }

    fn ended(conn: &Conn) -> impl std::future::Future<Output = ()> + Send + 'static {
        super::session::ended(conn)
    }

    fn on_lost(conn: &Conn) {
        super::session::drop_client(conn);
    }

    async fn close(shared: &Arc<Shared>) -> Result<(), ZkError> {
        super::session::close(shared).await
    }

    type Claim = super::recipe::Claim;
    type Waiter = super::recipe::Waiter;
    /// The contender's name.
    type Ahead = String;
    type Seen = ();
    type WaitState = ();

    fn claim(
        _session: &Arc<Shared>,
        path: &str,
        kind: Kind,
        _hold: &str,
    ) -> Result<Self::Claim, ZkError> {
        super::recipe::claim(path, kind)
    }

    /// Creates the node with the lock's children listed in the same round trip: granted at once when the kind's rule
    /// admits it behind the contenders that listing found ahead; otherwise they are the first check's, which then
    /// costs no round trip of its own.
    async fn enqueue(
        session: &Arc<Shared>,
        path: &str,
        kind: Kind,
        hold: &str,
        claim: &mut Self::Claim,
    ) -> Result<Enqueued<Self::Waiter>, ZkError> {
        let (waiter, ahead) = super::recipe::enqueue(session, path, hold, claim).await?;
        let first = ahead.as_deref().is_some_and(|ahead| admitted(kind, ahead));
        if !first {
            waiter.keep(ahead);
        }
        Ok(Enqueued { waiter, first })
    }

    fn abandon(session: &Arc<Shared>, claim: Self::Claim) {
        super::recipe::abandon(session, claim);
    }

    async fn ahead(
        session: &Arc<Shared>,
        path: &str,
        waiter: &Self::Waiter,
        _kind: Kind,
        _state: &mut Self::WaitState,
    ) -> Result<(Vec<(Kind, String)>, ()), ZkError> {
        Ok((super::recipe::ahead(session, path, waiter).await?, ()))
    }

    async fn wait(
        session: &Arc<Shared>,
        path: &str,
        waiter: &Self::Waiter,
        ahead: &[(Kind, String)],
        on: Option<usize>,
        _seen: (),
        _state: &mut (),
    ) -> Result<(), ZkError> {
        super::recipe::wait(session, path, waiter, ahead, on).await
    }

    fn grant_of(waiter: &Self::Waiter) -> Grant {
        waiter.grant()
    }

    fn fence(grant: &Grant) -> Fence {
        grant.fence()
    }

    fn entry(grant: &Grant) -> Self::Entry {
        (grant.node.as_str().into(), grant.czxid)
    }

    /// Watches the grant's node, which ends the lease as [`LossReason::Gone`] when someone else deletes it, starting
    /// from the watch the acquisition left set (see [`super::watch`]).
    fn granted(session: &Arc<Shared>, grant: &Grant, lease: &Arc<LeaseShared>) {
        tokio::spawn(super::watch::watch_node(
            Arc::downgrade(session),
            grant.node.clone(),
            Arc::downgrade(lease),
            grant.take_watch(),
        ));
    }

    async fn release(session: &Arc<Shared>, grant: &Grant) -> Result<bool, ZkError> {
        super::recipe::release(session, &grant.node).await
    }

    async fn rewrite(session: &Arc<Shared>, grant: &Grant, hold: &str) -> Result<bool, ZkError> {
        super::recipe::rewrite(session, &grant.node, hold).await
    }

    /// `ROOT.terms/NAME` (`ROOT` is the chroot and `/PREFIX`): a persistent node beside the client's locks, since a
    /// lock's node is a container, gone when its last contender is.
    fn term_record(&self, name: &str) -> Result<String, Error> {
        node_of(format!("{}.terms/{name}", self.root), name)
    }

    async fn begin_term(
        session: &Arc<Shared>,
        grant: &Grant,
        record: &str,
        hold: &str,
    ) -> Result<Option<u64>, ZkError> {
        super::recipe::begin_term(session, &grant.node, record, hold).await
    }

    async fn terms(engine: &ZkStore, record: &str) -> Result<u64, Error> {
        let session = engine.default_session().await?;
        let shared = &session.shared;
        let zk = shared.client().map_err(|e| engine.error(e))?;
        match shared.call("read a term count", zk.get_data(record)).await {
            Ok((data, _)) => super::recipe::parse_count(&data).map_err(|e| engine.error(e)),
            Err(ZkError::ZooKeeper {
                source: zookeeper_client::Error::NoNode,
                ..
            }) => Ok(0),
            Err(e) => Err(engine.error(e)),
        }
    }

    fn describe(grant: &Grant) -> String {
        grant.node.clone()
    }

    /// A contender's name.
    type Listed = Contender;

    /// The lock node's contenders in queue order (none when the node does not exist).
    async fn list(engine: &ZkStore, name: &str) -> Result<Vec<(Kind, Contender)>, Error> {
        let (_, _, contenders) = engine.contenders("inspect", name).await?;
        Ok(contenders.into_iter().map(|c| (c.kind, c)).collect())
    }

    /// Each holder's data and `czxid`, read from its node; ZooKeeper tells no time left on another client's session.
    async fn holders(
        engine: &ZkStore,
        name: &str,
        holders: Vec<Contender>,
    ) -> Result<Vec<Option<Admitted>>, Error> {
        let path = engine.store.path(name)?;
        let session = engine.default_session().await?;
        let shared = &session.shared;
        let zk = &shared.client().map_err(|e| engine.error(e))?;
        let reads = futures_util::future::join_all(holders.iter().map(|c| {
            let node = format!("{path}/{}", c.name);
            async move { shared.call("inspect", zk.get_data(&node)).await }
        }))
        .await;
        Ok(holders
            .into_iter()
            .zip(reads)
            .map(|(contender, read)| {
                let (data, stat) = read.ok()?;
                Some(Admitted {
                    value: String::from_utf8_lossy(&data).into_owned(),
                    entry: contender.name,
                    kind: contender.kind,
                    fence: Fence::new(stat.czxid.unsigned_abs()),
                    remaining: None,
                })
            })
            .collect())
    }

    /// Every node under the root with contenders among its children, walked breadth first.
    async fn lock_names(engine: &ZkStore) -> Result<Vec<String>, Error> {
        let session = engine.default_session().await?;
        let shared = &session.shared;
        let zk = &shared.client().map_err(|e| engine.error(e))?;
        let mut names = Vec::new();
        let mut level = vec![String::new()];
        while !level.is_empty() {
            let lists = futures_util::future::join_all(level.iter().map(|name| {
                let node = if name.is_empty() {
                    engine.store.root.clone()
                } else {
                    format!("{}/{name}", engine.store.root)
                };
                async move { shared.call("list", zk.list_children(&node)).await }
            }))
            .await;
            let mut next = Vec::new();
            for (name, list) in level.iter().zip(lists) {
                let children = match list {
                    Ok(children) => children,
                    // Reaped between the two reads: nothing there.
                    Err(ZkError::ZooKeeper {
                        source: zookeeper_client::Error::NoNode,
                        ..
                    }) => continue,
                    Err(e) => return Err(engine.error(e)),
                };
                if !name.is_empty() && !queue(&children).is_empty() {
                    names.push(name.clone());
                }
                for child in children
                    .iter()
                    .filter(|c| super::kind::contender(c).is_none())
                {
                    next.push(if name.is_empty() {
                        child.clone()
                    } else {
                        format!("{name}/{child}")
                    });
                }
            }
            level = next;
        }
        Ok(names)
    }
}

/// `path`, the node lock `name` makes, when ZooKeeper takes it; the refusal names the lock.
fn node_of(path: String, name: &str) -> Result<String, Error> {
    check_path(&path).map_err(|why| InvalidArgument::BadName {
        name: name.chars().take(64).collect(),
        why,
    })?;
    Ok(path)
}
