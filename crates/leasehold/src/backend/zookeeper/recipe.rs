//! The grant: create, check, wait, release. Kind-agnostic; a [`Kind`] brings only its admission rule.
//!
//! 1. **Create** an ephemeral sequential node `PATH/lh1-<grant>__lock__<seq>` (the lock's node and its parents are
//!    containers, made on the first `NoNode`). When the answer is lost (a timeout, a connection lost), the create may
//!    or may not have happened: the children are listed and a node with this grant's id is adopted, but only when its
//!    `ephemeralOwner` is this session (Curator adopts without that check, CURATOR-604). Otherwise it is created again;
//!    a late first create then leaves a second node of the grant, which the check below deletes.
//! 2. **Check**: list the children, order the contenders by sequence, and apply the kind's rule to those ahead. The
//!    grant's own node missing from the list means it was deleted: the session expired, or a force release.
//! 3. **Wait**: watch the one node the rule names (`exists` with a watch; the children, for permits) until it
//!    changes, then check again. A watch is kept across reconnects by the client; it ends without an event when the
//!    session ends, which the wait watches too. A check also runs every session timeout regardless.
//! 4. **Release**: delete the node. Its name is unique to the grant (grant id and sequence), so a late release never
//!    deletes a successor's node.
//!
//! The fence is the node's `czxid`, the zxid of the transaction that created it: global to the ensemble and only
//! growing, so successive holders of a lock get growing fences. Never the sequence number, which is per parent,
//! restarts when the container is reaped, and overflows at 2³¹.

use std::sync::Arc;
use std::time::Duration;

use zookeeper_client::{Acls, CreateMode, EventType};

use super::kind::{node_prefix, queue, Contender};
use super::session::Shared;
use super::ZkError;
use crate::backend::admission::Kind;
use crate::backend::session::{random_bytes, StoreError};
use crate::fence::Fence;

/// How many times a create is tried again after finding its parent gone (a container reaped in between).
const PARENT_ATTEMPTS: usize = 3;

/// The pause between two tries of a create whose answer was lost.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// A grant: an admitted node, with the zxid that fences it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    /// The node's path.
    pub(crate) node: String,
    pub(crate) czxid: i64,
}

impl Grant {
    /// The fence: the node's `czxid`.
    pub(crate) fn fence(&self) -> Fence {
        Fence::new(self.czxid.unsigned_abs())
    }
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
    settled: bool,
}

/// An acquisition's node, written: its grant once admitted, its name under the lock's node, and its prefix.
pub(crate) struct Waiter {
    pub(crate) grant: Grant,
    name: String,
    prefix: String,
}

/// Draws the acquisition's node prefix under the lock's node `path`.
pub(crate) fn claim(path: &str, kind: Kind) -> Result<Claim, ZkError> {
    Ok(Claim {
        path: path.to_owned(),
        prefix: node_prefix(kind, grant_id()?),
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

/// Creates the claimed node under the lock's node `path`, storing `value`.
pub(crate) async fn enqueue(
    session: &Shared,
    path: &str,
    value: &str,
    claim: &mut Claim,
) -> Result<Waiter, ZkError> {
    let (name, czxid, retried) = create(session, path, &claim.prefix, value).await?;
    claim.settled = !retried;
    Ok(Waiter {
        grant: Grant {
            node: format!("{path}/{name}"),
            czxid,
        },
        name,
        prefix: claim.prefix.clone(),
    })
}

/// The contenders ahead of `waiter`'s node, in queue order, each with its kind and name.
pub(crate) async fn ahead(
    session: &Shared,
    path: &str,
    waiter: &Waiter,
) -> Result<Vec<(Kind, String)>, ZkError> {
    let ahead = check(session, path, &waiter.prefix, &waiter.name).await?;
    Ok(ahead.into_iter().map(|c| (c.kind, c.name)).collect())
}

/// Waits until the node `ahead[on]` changes (with `on` `None`, the lock's children do), or one session timeout passes.
pub(crate) async fn wait(
    session: &Shared,
    path: &str,
    ahead: &[(Kind, String)],
    on: Option<usize>,
) -> Result<(), ZkError> {
    let watched = on
        .and_then(|i| ahead.get(i))
        .map(|(_, name)| format!("{path}/{name}"));
    wait_for_change(session, path, watched.as_deref()).await
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

/// 64 random bits from the OS: the grant's id, which protects its node (see the module docs).
fn grant_id() -> Result<u64, ZkError> {
    Ok(u64::from_le_bytes(random_bytes()?))
}

/// Creates the grant's node under `path` (and `path` itself when it is missing); returns its name, its `czxid`, and
/// whether a create whose answer was lost was tried again (that one may still land).
async fn create(
    session: &Shared,
    path: &str,
    prefix: &str,
    value: &str,
) -> Result<(String, i64, bool), ZkError> {
    let node = format!("{path}/{prefix}");
    let mut parents_made = 0;
    let mut lost_answers = 0;
    loop {
        let created = session
            .call(
                "create",
                session
                    .client()?
                    .create(&node, value.as_bytes(), &node_options()),
            )
            .await;
        match created {
            Ok((stat, sequence)) => {
                return Ok((format!("{prefix}{sequence}"), stat.czxid, lost_answers > 0))
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
                    return Ok((name, czxid, true));
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
    let mut contenders = queue(&children);
    contenders.retain(|c| c.name == name || !c.name.starts_with(prefix));
    let Some(at) = contenders.iter().position(|c| c.name == name) else {
        session.check_alive()?;
        return Err(ZkError::lost_while_waiting(format!("{path}/{name}")));
    };
    contenders.truncate(at);
    Ok(contenders)
}

/// Waits until the node `watched` changes (or, without one, the lock's children do), or one session timeout passes.
async fn wait_for_change(
    session: &Shared,
    path: &str,
    watched: Option<&str>,
) -> Result<(), ZkError> {
    let watcher = match watched {
        Some(node) => {
            let (stat, watcher) = session
                .call("watch", session.client()?.check_and_watch_stat(node))
                .await?;
            if stat.is_none() {
                // Gone already: look again at once.
                return Ok(());
            }
            watcher
        }
        None => {
            session
                .call("watch", session.client()?.list_and_watch_children(path))
                .await?
                .1
        }
    };
    if let Ok(event) = tokio::time::timeout(session.ttl, watcher.changed()).await {
        if event.event_type == EventType::Session {
            session.check_alive()?;
        }
    }
    Ok(())
}
