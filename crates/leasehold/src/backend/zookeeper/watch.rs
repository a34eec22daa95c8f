//! The watches of an acquisition and of its grant, set where they cost no round trip of their own.
//!
//! - **A grant's watch** tells its lease at once when someone else deletes the grant's node (`release --force`, `zkCli
//!   delete`). It starts from a watch the acquisition already set: the watch on the lock's children that the listing
//!   sent with the create set (a grant admitted at once), or the watch on its own node that its first wait set
//!   beside the watch on the node ahead (a grant after a wait). Only once that one fires for anything but the node's
//!   deletion (a contender arriving, a `set`, a session event) does the lease set a watch of its own on the node, and
//!   again after each such event ([`watch_node`]).
//! - **A watch not used** is kept until it fires ([`park`]) rather than dropped: `zookeeper_client` removes a dropped
//!   watcher's watch with a request of its own (`removeWatches`), where a watch left to fire costs one event.

use std::future::Future;
use std::pin::Pin;
use std::sync::Weak;

use zookeeper_client::{EventType, OneshotWatcher, Stat, WatchedEvent};

use super::session::Shared;
use super::ZkError;
use crate::engine::lease::{LeaseShared, LossReason};

/// The tracing target of this file's events.
const TARGET: &str = "leasehold::zookeeper";

/// A watch set on the grant's node or on its lock's children, waiting for its one event.
pub(crate) type Watch = Pin<Box<dyn Future<Output = WatchedEvent> + Send>>;

/// `watcher` as a [`Watch`].
pub(crate) fn watch(watcher: OneshotWatcher) -> Watch {
    Box::pin(watcher.changed())
}

/// The watcher of a `getData` with a watch, or `None` when the node does not exist. (A read of a node that is gone
/// leaves no watch with `getData`, where `exists` would leave one on the node's creation, which nobody makes: removing
/// it would take a request of its own, and leaving it would keep it for the session's life.)
pub(crate) fn watched(
    read: Result<(Vec<u8>, Stat, OneshotWatcher), ZkError>,
) -> Result<Option<OneshotWatcher>, ZkError> {
    match read {
        Ok((_, _, watcher)) => Ok(Some(watcher)),
        Err(ZkError::ZooKeeper {
            source: zookeeper_client::Error::NoNode,
            ..
        }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Keeps `watch` until it fires (see the module docs); without a runtime it is dropped.
pub(crate) fn park(watch: Watch) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(watch);
    }
}

/// Ends `lease` as [`LossReason::Gone`] when the grant's `node` is deleted by anyone but its own release (which ends
/// the lease first, so this changes nothing then). It starts from `first`, a watch the acquisition set (see the
/// module docs), when there is one. A ZooKeeper watch fires once, on any change: after any event but the node's
/// deletion (a child of the lock added or deleted, a `set` on the node, a session event) a watch is set on the node
/// itself, and a setup call that got no answer (a connection lost: the session lives on) is tried again, until the
/// lease ends or the session is lost (which ends the lease itself). The existence read after each keep-alive
/// (`session.rs`) catches whatever falls between. Holds the session only while it sets a watch up.
pub(crate) async fn watch_node(
    session: Weak<Shared>,
    node: String,
    lease: Weak<LeaseShared>,
    mut first: Option<Watch>,
) {
    loop {
        if lease.upgrade().is_none_or(|lease| lease.is_ended()) {
            if let Some(first) = first {
                park(first);
            }
            return;
        }
        let watch = match first.take() {
            Some(watch) => watch,
            None => {
                let Some(shared) = session.upgrade() else {
                    return;
                };
                let Ok(client) = shared.client() else {
                    return;
                };
                let read = shared
                    .call("watch the grant's node", client.get_and_watch_data(&node))
                    .await;
                let pause = shared.ttl / 16;
                drop((client, shared));
                match watched(read) {
                    Ok(Some(watcher)) => watch(watcher),
                    // Gone already.
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(target: TARGET, %node, error = %e, "setting the watch on a ZooKeeper lock node failed; trying again");
                        tokio::time::sleep(pause).await;
                        continue;
                    }
                }
            }
        };
        let event = watch.await;
        if event.event_type == EventType::NodeDeleted && event.path == node {
            break;
        }
        // Anything else: look at the node itself.
    }
    if let Some(lease) = lease.upgrade() {
        if lease.end(LossReason::Gone) {
            tracing::debug!(target: TARGET, %node, "ZooKeeper lock node deleted");
        }
    }
}
