//! etcd's server-side lock (the v3lock API), which leasehold's recipe never uses (it lacks the ownership check
//! after a wait on etcd 3.4, see the recipe's docs) but the bench measures as the floor.

use super::pb::v3lockpb::lock_client::LockClient;
use super::pb::v3lockpb::{LockRequest, UnlockRequest};
use super::{Client, Error};

pub use super::pb::v3lockpb::{LockResponse, UnlockResponse};

/// Options of [`Client::lock`].
#[derive(Debug, Default, Clone)]
pub struct LockOptions {
    lease: i64,
}

impl LockOptions {
    /// No lease (etcd refuses a lock without one).
    pub fn new() -> Self {
        Self::default()
    }

    /// The lease the lock's key lives under.
    pub fn with_lease(mut self, lease: i64) -> Self {
        self.lease = lease;
        self
    }
}

impl Client {
    /// Waits in etcd until lock `name` is granted: etcd puts a key under `name/` with the lease and answers once it
    /// is the oldest there.
    ///
    /// # Errors
    ///
    /// [`Error::GRpcStatus`]: etcd's refusal, or the connection's failure.
    ///
    /// # Cancel safety
    ///
    /// A key may stay under `name/` until the lease ends.
    pub async fn lock(
        &mut self,
        name: impl Into<Vec<u8>>,
        options: Option<LockOptions>,
    ) -> Result<LockResponse, Error> {
        let request = LockRequest {
            name: name.into(),
            lease: options.unwrap_or_default().lease,
        };
        self.call(request, |channel, request| async move {
            LockClient::new(channel).lock(request).await
        })
        .await
    }

    /// Deletes the key a [`lock`](Self::lock) answered with.
    ///
    /// # Errors
    ///
    /// [`Error::GRpcStatus`]: etcd's refusal, or the connection's failure.
    ///
    /// # Cancel safety
    ///
    /// The delete may or may not have happened.
    pub async fn unlock(&mut self, key: impl Into<Vec<u8>>) -> Result<UnlockResponse, Error> {
        let request = UnlockRequest { key: key.into() };
        self.call(request, |channel, request| async move {
            LockClient::new(channel).unlock(request).await
        })
        .await
    }
}

impl LockResponse {
    /// The key that holds the lock, for [`Client::unlock`].
    pub fn key(&self) -> &[u8] {
        &self.key
    }
}
