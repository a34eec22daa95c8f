//! Writes inside ZooKeeper that commit only while a grant holds: one `multi` whose first operation checks that the
//! grant's node exists. The node's name is unique to the grant, so it exists exactly while the grant is alive on
//! the server: a holder whose session expired, or whose node was force-released, has its writes refused by
//! ZooKeeper itself, whatever its own clock says. The strongest fence ZooKeeper offers, beside the `czxid`.

use zookeeper_client::{Acls, CheckWriteError, CreateMode};

use super::store::ZooKeeper;
use super::ZkError;
use crate::backend::session::{Hold, StoreError};
use crate::engine::lease::LossReason;
use crate::error::{Error, InvalidArgument};

/// One write of [`Guard::zookeeper_write`](crate::Guard::zookeeper_write). Paths are ZooKeeper paths, absolute (the
/// client's chroot, if its URL names one, is not added).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ZkWrite {
    /// Creates the persistent node `path` holding `data`; its parent must exist.
    Create {
        /// The node.
        path: String,
        /// Its data.
        data: Vec<u8>,
    },
    /// Replaces the data of the node `path`.
    SetData {
        /// The node.
        path: String,
        /// The new data.
        data: Vec<u8>,
    },
    /// Deletes the node `path`.
    Delete {
        /// The node.
        path: String,
    },
}

impl Hold<ZooKeeper> {
    /// Commits `writes` in one transaction that first checks the grant's node still exists (see the module docs).
    pub(crate) async fn write(&self, name: &str, writes: &[ZkWrite]) -> Result<(), Error> {
        let shared = &self.session.shared;
        let bad = |why: &'static str| {
            Error::from(InvalidArgument::BadUrl(format!(
                "a ZooKeeper write under lock {name:?}: {why}"
            )))
        };
        let client = shared.client().map_err(|_| Error::LeaseLost {
            name: name.to_owned(),
            reason: LossReason::Expired,
        })?;
        let mut writer = client
            .new_check_writer(&self.grant.node, None)
            .map_err(|e| {
                ZkError::ZooKeeper {
                    op: "guarded write",
                    source: e,
                }
                .into_error(&self.shown)
            })?;
        let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
        for write in writes {
            let added = match write {
                ZkWrite::Create { path, data } => writer.add_create(path, data, &persistent),
                ZkWrite::SetData { path, data } => writer.add_set_data(path, data, None),
                ZkWrite::Delete { path } => writer.add_delete(path, None),
            };
            added.map_err(|_| bad("a path ZooKeeper does not take"))?;
        }
        let lost = || Error::LeaseLost {
            name: name.to_owned(),
            reason: LossReason::Gone,
        };
        match tokio::time::timeout(shared.call_timeout(), writer.commit()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(CheckWriteError::CheckFailed { .. })) => Err(lost()),
            Ok(Err(CheckWriteError::OperationFailed { index, source })) => {
                Err(ZkError::Write { index, source }.into_error(&self.shown))
            }
            Ok(Err(CheckWriteError::RequestFailed { source })) => Err(ZkError::ZooKeeper {
                op: "guarded write",
                source,
            }
            .into_error(&self.shown)),
            Err(_) => Err(ZkError::Timeout {
                op: "guarded write (it may or may not have committed)",
                after: shared.call_timeout(),
            }
            .into_error(&self.shown)),
        }
    }
}
