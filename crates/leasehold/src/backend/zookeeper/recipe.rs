//! The grant: create, check, wait, release. Kind-agnostic; a [`Kind`] brings only its admission rule.
//!
//! 1. **Create** an ephemeral sequential node `PATH/lh1-<grant>__lock__<seq>` (the lock's node and its parents are
//!    containers, made on the first `NoNode`), and list the lock's children (with a watch on them) in the same round
//!    trip: the listing is sent right behind the create, and ZooKeeper answers a session's requests in order, so it
//!    reads the lock as the create left it. When the kind's rule admits the node behind the contenders it found ahead,
//!    the acquisition is granted then: one round trip. When the create's answer is lost (a timeout, a connection
//!    lost), the create may or may not have happened: the children are listed and a node with this grant's id is
//!    adopted, but only when its `ephemeralOwner` is this session (Curator adopts without that check, CURATOR-604).
//!    Otherwise it is created again; a late first create then leaves a second node of the grant, which the check
//!    below deletes.
//! 2. **Check**: order the contenders by sequence, and apply the kind's rule to those ahead. The first check uses the
//!    create's listing; later ones list the children again (or use what the wait saw, below). The grant's own node
//!    missing from the list means it was deleted: the session expired, or a force release.
//! 3. **Wait**: watch the one node the rule names (`getData` with a watch, which leaves none on a node already gone; the children, for permits) until it
//!    changes, then check again. The first wait on a node also watches the waiter's own node, in the same round trip;
//!    when the node ahead is deleted before the waiter's own (ZooKeeper sends a session's events in the order of the
//!    changes) and the rule admits the waiter behind the rest of what the last check read, the check needs no round
//!    trip (see [`wait`]). A watch is kept across reconnects by the client; it ends without an event when the session
//!    ends, which the wait watches too. A check also runs every session timeout regardless.
//! 4. **Release**: delete the node. Its name is unique to the grant (grant id and sequence), so a late release never
//!    deletes a successor's node.
//!
//! The grant's lease watches its node from the watch the acquisition left set (the children's, or the waiter's own
//! node's): see [`super::watch`]. An uncontended cycle is two round trips, as a bare node's create and delete are:
//! the create with its listing, and the release's delete.
//!
//! The fence is the node's `czxid`, the zxid of the transaction that created it: global to the ensemble and only
//! growing, so successive holders of a lock get growing fences. Never the sequence number, which is per parent,
//! restarts when the container is reaped, and overflows at 2³¹.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt as _;
use zookeeper_client::{
    Acls, CheckWriteError, CreateMode, EventType, OneshotWatcher, StateWatcher,
};

use super::error::is_transient;
use super::kind::{node_prefix, queue, Contender};
use super::session::Shared;
use super::watch::{park, Watch};
use super::ZkError;
use crate::backend::admission::{admitted, Kind};
use crate::backend::session::{random_bytes, StoreError};
use crate::fence::Fence;

/// How many times a create is tried again after finding its parent gone (a container reaped in between).
const PARENT_ATTEMPTS: usize = 3;

/// The pause between two tries of a create whose answer was lost.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// A grant: an admitted node, with the zxid that fences it.
pub(crate) struct Grant {
    /// The node's path.
    pub(crate) node: String,
    pub(crate) czxid: i64,
    /// The watch the acquisition left set, that its lease's watch starts from (taken by it).
    watch: Mutex<Option<Watch>>,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("node", &self.node)
            .field("czxid", &self.czxid)
            .finish_non_exhaustive()
    }
}

impl Grant {
    /// The fence: the node's `czxid`.
    pub(crate) fn fence(&self) -> Fence {
        Fence::new(self.czxid.unsigned_abs())
    }

    /// The watch the acquisition left set on the node or the lock's children, if any (see [`super::watch`]).
    pub(crate) fn take_watch(&self) -> Option<Watch> {
        lock(&self.watch).take()
    }
}

/// The value behind `mutex`, whether or not a holder panicked.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The options of every node a grant creates, and of the containers above it: open to every client, as Curator's
/// and kazoo's defaults are (a `release --force` from another client must be able to delete it).
fn node_options() -> zookeeper_client::CreateOptions<'static> {
    CreateMode::EphemeralSequential.with_acls(Acls::anyone_all())
}

fn container_options() -> zookeeper_client::CreateOptions<'static> {
    CreateMode::Container.with_acls(Acls::anyone_all())
}

/// What names an acquisition's nodes before one is written: the lock's node and the prefix (kind and grant id) every
/// node of the acquisition starts with, and whether the create was answered on its first try (then no other create of
/// the acquisition can land after the clean-up's delete).
pub(crate) struct Claim {
    path: String,
    prefix: String,
    kind: Kind,
    settled: bool,
}

/// An acquisition's node, written: its node and `czxid`, its name under the lock's node, its prefix and kind; what
/// the next check reads without a round trip, and the watch the next wait or the grant starts from.
pub(crate) struct Waiter {
    node: String,
    czxid: i64,
    name: String,
    prefix: String,
    kind: Kind,
    /// The contenders ahead as a round trip already read them, for the next check (taken by it): the listing sent with
    /// the create, or the node ahead's deletion seen by a wait, with nothing else ahead that holds this one back.
    fresh: Mutex<Option<Vec<(Kind, String)>>>,
    /// The watch the grant's lease starts from: the one on the lock's children set by the listing sent with the
    /// create, until the waiter is known not to be admitted at once; then the one on the waiter's own node, set by its
    /// first wait on a node ahead.
    watch: Mutex<Option<OwnWatch>>,
}

/// A watch on the waiter's node (or, for a waiter admitted at once, its lock's children), and the session's states
/// when it was set.
struct OwnWatch {
    watch: Watch,
    /// The session's states as they were when it was set: a reconnect since then sets the watches again, and
    /// ZooKeeper answers that with the events of every watched node that changed in the meantime, in no set order.
    states: StateWatcher,
}

impl Waiter {
    /// Not admitted at once: keeps `ahead` (the contenders ahead, read in the create's round trip) for the first
    /// check, and leaves the watch on the lock's children to fire (see [`super::watch`]).
    pub(crate) fn keep(&self, ahead: Option<Vec<(Kind, String)>>) {
        *lock(&self.fresh) = ahead;
        if let Some(own) = lock(&self.watch).take() {
            park(own.watch);
        }
    }

    /// The grant the waiter's node is, with the watch its lease starts from.
    pub(crate) fn grant(&self) -> Grant {
        Grant {
            node: self.node.clone(),
            czxid: self.czxid,
            watch: Mutex::new(lock(&self.watch).take().map(|own| own.watch)),
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(own) = lock(&self.watch).take() {
            park(own.watch);
        }
    }
}

/// Draws the acquisition's node prefix under the lock's node `path`.
pub(crate) fn claim(path: &str, kind: Kind) -> Result<Claim, ZkError> {
    Ok(Claim {
        path: path.to_owned(),
        prefix: node_prefix(kind, grant_id()?),
        kind,
        settled: false,
    })
}

/// Deletes, in the background, the nodes of an acquisition that ended without a grant (see [`Cleanup`]); a lost
/// session has closed its client, and its nodes go with it.
pub(crate) fn abandon(session: &Arc<Shared>, claim: Claim) {
    let Ok(client) = session.client() else {
        return;
    };
    let cleanup = Cleanup {
        session: Arc::clone(session),
        client,
        path: claim.path,
        prefix: claim.prefix,
        again: !claim.settled,
    };
    session.background.spawn(cleanup.run());
}

/// Creates the claimed node under the lock's node `path`, storing `value`; with the contenders ahead of it, in queue
/// order, when the listing sent with the create read them (`None`: it did not answer, or a create whose answer was
/// lost was tried again, and the check must look for a twin).
pub(crate) async fn enqueue(
    session: &Shared,
    path: &str,
    value: &str,
    claim: &mut Claim,
) -> Result<(Waiter, Option<Vec<(Kind, String)>>), ZkError> {
    let states = session.states();
    let Created {
        name,
        czxid,
        retried,
        listed,
    } = create(session, path, &claim.prefix, value).await?;
    claim.settled = !retried;
    let (ahead, watch) = match listed {
        Some((children, watcher)) => {
            let watch = OwnWatch {
                watch: super::watch::watch(watcher),
                states,
            };
            let ahead = ahead_in(&children, &claim.prefix, &name)
                .filter(|_| !retried)
                .map(named);
            (ahead, Some(watch))
        }
        None => (None, None),
    };
    let waiter = Waiter {
        node: format!("{path}/{name}"),
        czxid,
        name,
        prefix: claim.prefix.clone(),
        kind: claim.kind,
        fresh: Mutex::new(None),
        watch: Mutex::new(watch),
    };
    Ok((waiter, ahead))
}

/// The contenders ahead of `waiter`'s node, in queue order, each with its kind and name: the listing read with the
/// create, the first time, when there is one; then a listing of the lock's children.
pub(crate) async fn ahead(
    session: &Shared,
    path: &str,
    waiter: &Waiter,
) -> Result<Vec<(Kind, String)>, ZkError> {
    let fresh = lock(&waiter.fresh).take();
    if let Some(ahead) = fresh {
        return Ok(ahead);
    }
    let ahead = check(session, path, &waiter.prefix, &waiter.name).await?;
    Ok(named(ahead))
}

/// Each contender's kind and name.
fn named(contenders: Vec<Contender>) -> Vec<(Kind, String)> {
    contenders.into_iter().map(|c| (c.kind, c.name)).collect()
}

/// Waits until the node `ahead[on]` changes (with `on` `None`, the lock's children do), or one session timeout passes.
///
/// A wait on a node ahead whose deletion may admit the waiter (the kind's rule admits it behind the contenders the
/// last check read less that one) also watches the waiter's own node, set in the same round trip by the first such
/// wait and kept until it fires (the grant's lease then starts from it). When the node ahead is deleted while the
/// waiter's own watch has not fired (and the connection was not re-established since it was set), the waiter's node
/// still existed at that deletion: ZooKeeper sends a session's watch events in the order of the changes, and the
/// client hands them on in that order. Contenders ahead only ever leave, and a rule that admits behind some admits
/// behind fewer, so the next check is answered without a round trip: a hand-off costs the release's delete and its
/// event, nothing more. Otherwise the next check lists the children.
pub(crate) async fn wait(
    session: &Shared,
    path: &str,
    waiter: &Waiter,
    ahead: &[(Kind, String)],
    on: Option<usize>,
) -> Result<(), ZkError> {
    let Some((at, (_, name))) = on.and_then(|i| Some((i, ahead.get(i)?))) else {
        return wait_for_children(session, path).await;
    };
    let watched = format!("{path}/{name}");
    // What is left ahead once the node ahead is gone, as far as this waiter knows: when the rule does not admit it
    // behind that (an exclusive waiter with more than one ahead), the node ahead going cannot grant it without a
    // listing, and its own node is not watched for that.
    let rest: Vec<(Kind, String)> = ahead
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != at)
        .map(|(_, entry)| entry.clone())
        .collect();
    let next = admitted(waiter.kind, &rest);
    let client = session.client()?;
    let mut own = lock(&waiter.watch).take();
    // Sent before the watch on the node ahead, without waiting: both in one round trip, the waiter's answered first.
    let setting = (own.is_none() && next)
        .then(|| (session.states(), client.get_and_watch_data(&waiter.node)));
    let ahead_watch = client.get_and_watch_data(&watched);
    if let Some((states, request)) = setting {
        let Some(watcher) = super::watch::watched(session.call("watch", request).await)? else {
            // The waiter's node is gone: the check says so.
            return Ok(());
        };
        own = Some(OwnWatch {
            watch: super::watch::watch(watcher),
            states,
        });
    }
    let watcher = super::watch::watched(session.call("watch", ahead_watch).await)?;
    let deleted = match watcher {
        None => true,
        Some(watcher) => {
            let ahead_watch = super::watch::watch(watcher);
            let own_fired = async {
                match own.as_mut() {
                    Some(own) => drop((&mut own.watch).await),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                // The waiter's own node changed (deleted, set) or the session did: the check looks.
                biased;
                () = own_fired => return Ok(()),
                event = ahead_watch => match event.event_type {
                    EventType::NodeDeleted => true,
                    EventType::Session => {
                        session.check_alive()?;
                        false
                    }
                    _ => false,
                },
                () = tokio::time::sleep(session.ttl) => false,
            }
        }
    };
    let Some(mut own) = own else {
        return Ok(());
    };
    // The node ahead went first when the waiter's own watch has not fired (see above).
    let fired = (&mut own.watch).now_or_never().is_some();
    let reconnected = own.states.changed().now_or_never().is_some();
    if fired {
        return Ok(());
    }
    if deleted && next && !reconnected {
        *lock(&waiter.fresh) = Some(rest);
    }
    if !reconnected {
        *lock(&waiter.watch) = Some(own);
    } else {
        park(own.watch);
    }
    Ok(())
}

/// Deletes the nodes of an abandoned acquisition: at once, and, when a create may still be on its way (`again`), once
/// more after two call timeouts unless the session ends first (its nodes go with it). Past that, the session bounds
/// how long a node can block others.
struct Cleanup {
    session: Arc<Shared>,
    client: zookeeper_client::Client,
    path: String,
    prefix: String,
    again: bool,
}

impl Cleanup {
    async fn run(self) {
        let pause = 2 * self.session.call_timeout();
        self.delete(pause).await;
        if !self.again {
            return;
        }
        let session = Arc::clone(&self.session);
        tokio::select! {
            () = tokio::time::sleep(pause) => self.delete(pause).await,
            // Without this clone of the client, a closed session can end on the server.
            _ = session.lost() => drop(self),
        }
    }

    /// One pass: deletes every child of the acquisition.
    async fn delete(&self, timeout: Duration) {
        let Ok(Ok(children)) =
            tokio::time::timeout(timeout, self.client.list_children(&self.path)).await
        else {
            return;
        };
        for child in children.iter().filter(|c| c.starts_with(&self.prefix)) {
            let node = format!("{}/{child}", self.path);
            let deleted = tokio::time::timeout(timeout, self.client.delete(&node, None)).await;
            tracing::debug!(%node, ?deleted, "deleted an abandoned ZooKeeper lock node");
        }
    }
}

/// Deletes `node` (a grant's release): true when it was there. A lost answer is tried again (a delete of a node already deleted by the
/// first try answers `NoNode`, which is as good).
pub(crate) async fn release(session: &Shared, node: &str) -> Result<bool, ZkError> {
    let mut tries = 0;
    loop {
        match session.call("release", session.client()?.delete(node, None)).await {
            Ok(()) => return Ok(true),
            Err(ZkError::ZooKeeper {
                source: zookeeper_client::Error::NoNode,
                ..
            // Not there: already deleted, by this release's earlier try whose answer was lost, or with the session.
            }) => return Ok(tries > 0),
            Err(e) if e.is_transient() && tries < 2 => tries += 1,
            Err(e) => return Err(e),
        }
    }
}

/// Writes `hold` as the data of the grant's node if the node is still there: true when it was. The node's name carries
/// the grant's id and sequence, so no other grant's node has its path; its `czxid` (the fence) and place stay.
pub(crate) async fn rewrite(session: &Shared, node: &str, hold: &str) -> Result<bool, ZkError> {
    let mut tries = 0;
    loop {
        match session
            .call(
                "proclaim",
                session.client()?.set_data(node, hold.as_bytes(), None),
            )
            .await
        {
            Ok(_) => return Ok(true),
            Err(ZkError::ZooKeeper {
                source: zookeeper_client::Error::NoNode,
                ..
            }) => return Ok(false),
            // Writing the same data again is harmless.
            Err(e) if e.is_transient() && tries < 2 => tries += 1,
            Err(e) => return Err(e),
        }
    }
}

/// Counts the grant's term of an election (see [`Primitives::begin_term`](crate::backend::session::Primitives)): one
/// `multi` that checks the grant's node exists, sets the count node `record` one higher at the version read, and sets
/// the grant's node's data to `hold` and the count. The count node is persistent (made with its parents on first
/// use), so it outlives the lock's container. A `multi` whose answer was lost is found by the grant's node already
/// holding `hold` and the count.
pub(crate) async fn begin_term(
    session: &Shared,
    node: &str,
    record: &str,
    hold: &str,
) -> Result<Option<u64>, ZkError> {
    let mut made = false;
    for _ in 0..TERM_TRIES {
        let client = session.client()?;
        let (count, version) = match session
            .call("read a term count", client.get_data(record))
            .await
        {
            Ok((data, stat)) => (parse_count(&data)?, stat.version),
            Err(ZkError::ZooKeeper {
                source: zookeeper_client::Error::NoNode,
                ..
            }) if !made => {
                made = true;
                let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
                session
                    .call("make a term count", client.mkdir(record, &persistent))
                    .await?;
                continue;
            }
            Err(e) => return Err(e),
        };
        let term = count + 1;
        let mut writer =
            client
                .new_check_writer(node, None)
                .map_err(|source| ZkError::ZooKeeper {
                    op: "count a term",
                    source,
                })?;
        let written = format!("{hold}{term}");
        let added = writer
            .add_set_data(record, term.to_string().as_bytes(), Some(version))
            .and_then(|()| writer.add_set_data(node, written.as_bytes(), None));
        added.map_err(|source| ZkError::ZooKeeper {
            op: "count a term",
            source,
        })?;
        match tokio::time::timeout(session.call_timeout(), writer.commit()).await {
            Ok(Ok(_)) => return Ok(Some(term)),
            Ok(Err(CheckWriteError::CheckFailed { .. })) => return Ok(None),
            // Another count landed between the read and the write: read again.
            Ok(Err(CheckWriteError::OperationFailed {
                source: zookeeper_client::Error::BadVersion,
                ..
            })) => {}
            Ok(Err(CheckWriteError::OperationFailed { index, source })) => {
                return Err(ZkError::Write { index, source })
            }
            Ok(Err(CheckWriteError::RequestFailed { source })) if !is_transient(&source) => {
                return Err(ZkError::ZooKeeper {
                    op: "count a term",
                    source,
                })
            }
            // No answer: the multi may have committed. The grant's node says.
            Ok(Err(CheckWriteError::RequestFailed { .. })) | Err(_) => {
                match session.call("count a term", client.get_data(node)).await {
                    Ok((data, _)) if data == written.as_bytes() => return Ok(Some(term)),
                    Ok(_) => {}
                    Err(ZkError::ZooKeeper {
                        source: zookeeper_client::Error::NoNode,
                        ..
                    }) => return Ok(None),
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Err(ZkError::ZooKeeper {
        op: "count a term (the count kept changing under a grant that holds the lock)",
        source: zookeeper_client::Error::BadVersion,
    })
}

/// How many times [`begin_term`] reads the count and tries its `multi`.
const TERM_TRIES: usize = 4;

/// A term count as ZooKeeper stores it: decimal digits, or nothing (a count node just made).
pub(crate) fn parse_count(data: &[u8]) -> Result<u64, ZkError> {
    if data.is_empty() {
        return Ok(0);
    }
    std::str::from_utf8(data)
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or(ZkError::ZooKeeper {
            op: "read a term count (it holds something other than a number)",
            source: zookeeper_client::Error::BadArguments(&"not a term count"),
        })
}

/// 64 random bits from the OS: the grant's id, which protects its node (see the module docs).
fn grant_id() -> Result<u64, ZkError> {
    Ok(u64::from_le_bytes(random_bytes()?))
}

/// A grant's node, just created.
struct Created {
    /// Its name under the lock's node.
    name: String,
    czxid: i64,
    /// Whether a create whose answer was lost was tried again (that one may still land).
    retried: bool,
    /// The lock's children, listed in the same round trip as the create that made it, when that listing answered,
    /// and the watch that listing set on them.
    listed: Option<(Vec<String>, OneshotWatcher)>,
}

/// Creates the grant's node under `path` (and `path` itself when it is missing), and lists `path`'s children in the
/// same round trip: the listing is sent right behind the create, without waiting for its answer, and ZooKeeper
/// answers a session's requests in the order they were sent, so it reads the lock as the create left it.
async fn create(
    session: &Shared,
    path: &str,
    prefix: &str,
    value: &str,
) -> Result<Created, ZkError> {
    let node = format!("{path}/{prefix}");
    let mut parents_made = 0;
    let mut lost_answers = 0;
    loop {
        let client = session.client()?;
        // `zookeeper_client` sends each request when it is called, not when its future is first polled: the create
        // leaves first, the listing right behind it on the same connection.
        let create = client.create(&node, value.as_bytes(), &node_options());
        let list = client.list_and_watch_children(path);
        let (created, listed) = tokio::join!(
            session.call("create", create),
            session.call("admission check", list)
        );
        // A listing whose create failed leaves its watch to fire (see `super::watch`).
        let listed = match (&created, listed) {
            (Ok(_), listed) => listed.ok(),
            (Err(_), Ok((_, watcher))) => {
                park(super::watch::watch(watcher));
                None
            }
            (Err(_), Err(_)) => None,
        };
        match created {
            Ok((stat, sequence)) => {
                return Ok(Created {
                    name: format!("{prefix}{sequence}"),
                    czxid: stat.czxid,
                    retried: lost_answers > 0,
                    listed,
                })
            }
            Err(ZkError::ZooKeeper {
                source: zookeeper_client::Error::NoNode,
                ..
            }) if parents_made < PARENT_ATTEMPTS => {
                parents_made += 1;
                session
                    .call(
                        "create the lock's node",
                        session.client()?.mkdir(path, &container_options()),
                    )
                    .await?;
            }
            Err(e) if e.is_transient() => {
                lost_answers += 1;
                if let Some((name, czxid)) = find_own(session, path, prefix).await? {
                    return Ok(Created {
                        name,
                        czxid,
                        retried: true,
                        listed: None,
                    });
                }
                session.check_alive()?;
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// After a create whose answer was lost: the node of this acquisition under `path`, if one exists and belongs to
/// this session (its `ephemeralOwner`), with its `czxid` read by a plain `exists` (ZooKeeper 3.8.0's multi-op stats
/// are unreliable, ZOOKEEPER-4026).
async fn find_own(
    session: &Shared,
    path: &str,
    prefix: &str,
) -> Result<Option<(String, i64)>, ZkError> {
    let children = match session
        .call(
            "list after a lost create",
            session.client()?.list_children(path),
        )
        .await
    {
        Ok(children) => children,
        // No lock node yet: the create never got there. No answer: try the create again, and let a late twin be
        // found by the check.
        Err(ZkError::ZooKeeper {
            source: zookeeper_client::Error::NoNode,
            ..
        }) => return Ok(None),
        Err(e) if e.is_transient() => return Ok(None),
        Err(e) => return Err(e),
    };
    for child in children.iter().filter(|c| c.starts_with(prefix)) {
        let node = format!("{path}/{child}");
        let stat = session
            .call(
                "read a node after a lost create",
                session.client()?.check_stat(&node),
            )
            .await?;
        if let Some(stat) = stat.filter(|s| s.ephemeral_owner == session.id()) {
            return Ok(Some((child.clone(), stat.czxid)));
        }
    }
    Ok(None)
}

/// Lists the lock's children: the contenders ahead of the node `name`, in queue order.
/// Another node of the same acquisition (a create whose lost answer was retried) is deleted on the way.
async fn check(
    session: &Shared,
    path: &str,
    prefix: &str,
    name: &str,
) -> Result<Vec<Contender>, ZkError> {
    let children = session
        .call("admission check", session.client()?.list_children(path))
        .await?;
    for twin in children
        .iter()
        .filter(|c| c.starts_with(prefix) && *c != name)
    {
        release(session, &format!("{path}/{twin}")).await?;
    }
    let Some(ahead) = ahead_in(&children, prefix, name) else {
        session.check_alive()?;
        return Err(ZkError::lost_while_waiting(format!("{path}/{name}")));
    };
    Ok(ahead)
}

/// The contenders among `children` ahead of the node `name`, in queue order, leaving out the other nodes of its
/// acquisition (`prefix`); `None` when `name` is not among them.
fn ahead_in(children: &[String], prefix: &str, name: &str) -> Option<Vec<Contender>> {
    let mut contenders = queue(children);
    contenders.retain(|c| c.name == name || !c.name.starts_with(prefix));
    let at = contenders.iter().position(|c| c.name == name)?;
    contenders.truncate(at);
    Some(contenders)
}

/// Waits until the lock's children change, or one session timeout passes.
async fn wait_for_children(session: &Shared, path: &str) -> Result<(), ZkError> {
    let (_, watcher) = session
        .call("watch", session.client()?.list_and_watch_children(path))
        .await?;
    if let Ok(event) = tokio::time::timeout(session.ttl, watcher.changed()).await {
        if event.event_type == EventType::Session {
            session.check_alive()?;
        }
    }
    Ok(())
}
