//! The Lease service: grant, revoke, time to live, and the keep-alive stream.

use tokio::sync::mpsc;
use tonic::Streaming;

use super::client::stream_request;
use super::pb::etcdserverpb::lease_client::LeaseClient;
use super::pb::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest, LeaseTimeToLiveRequest,
};
use super::{Client, Error};

pub use super::pb::etcdserverpb::{
    LeaseGrantResponse, LeaseKeepAliveResponse, LeaseRevokeResponse, LeaseTimeToLiveResponse,
};

impl Client {
    /// Grants a lease of `ttl` seconds (etcd may raise it to its minimum). `id` 0, or `None`, lets etcd choose the
    /// id.
    ///
    /// # Errors
    ///
    /// [`Error::GRpcStatus`]: etcd's refusal, or the connection's failure.
    ///
    /// # Cancel safety
    ///
    /// A lease may have been granted; unused, it expires after its TTL.
    pub async fn lease_grant(
        &mut self,
        ttl: i64,
        id: Option<i64>,
    ) -> Result<LeaseGrantResponse, Error> {
        let request = LeaseGrantRequest {
            ttl,
            id: id.unwrap_or(0),
        };
        self.call(request, |channel, request| async move {
            LeaseClient::new(channel).lease_grant(request).await
        })
        .await
    }

    /// Revokes lease `id`, which deletes every key under it.
    ///
    /// # Errors
    ///
    /// [`Error::GRpcStatus`], `NotFound` when the lease is already gone.
    ///
    /// # Cancel safety
    ///
    /// The revoke may or may not have happened.
    pub async fn lease_revoke(&mut self, id: i64) -> Result<LeaseRevokeResponse, Error> {
        self.call(LeaseRevokeRequest { id }, |channel, request| async move {
            LeaseClient::new(channel).lease_revoke(request).await
        })
        .await
    }

    /// How long lease `id` has left (a TTL of -1 when it is gone). The options are for the shape of
    /// `etcd-client`'s call: none is supported, and the keys are never asked for.
    ///
    /// # Errors
    ///
    /// [`Error::GRpcStatus`]: etcd's refusal, or the connection's failure.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn lease_time_to_live(
        &mut self,
        id: i64,
        _options: Option<()>,
    ) -> Result<LeaseTimeToLiveResponse, Error> {
        let request = LeaseTimeToLiveRequest { id, keys: false };
        self.call(request, |channel, request| async move {
            LeaseClient::new(channel).lease_time_to_live(request).await
        })
        .await
    }

    /// Opens a keep-alive stream for lease `id`, sends the first keep-alive and reads its answer.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseKeepAliveError`] when etcd answers that the lease is gone (TTL ≤ 0) or closes the stream at
    /// once; [`Error::GRpcStatus`] when the stream cannot be opened.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the stream is closed with the future.
    pub async fn lease_keep_alive(
        &mut self,
        id: i64,
    ) -> Result<(LeaseKeeper, LeaseKeepAliveStream), Error> {
        let (sender, mut answers) = self
            .call(LeaseKeepAliveRequest { id }, |channel, first| async move {
                let (sender, request) = stream_request(first);
                let answers = LeaseClient::new(channel).lease_keep_alive(request).await?;
                Ok(answers.map(|answers| (sender, answers)))
            })
            .await?;
        match answers.message().await? {
            Some(answer) if answer.ttl > 0 => {}
            Some(_) => return Err(Error::LeaseKeepAliveError("lease not found".to_owned())),
            None => {
                return Err(Error::LeaseKeepAliveError(
                    "the keep-alive stream ended at once".to_owned(),
                ))
            }
        }
        Ok((LeaseKeeper { id, sender }, LeaseKeepAliveStream { answers }))
    }
}

/// Sends the keep-alives of one lease on its stream.
#[derive(Debug)]
pub struct LeaseKeeper {
    id: i64,
    sender: mpsc::Sender<LeaseKeepAliveRequest>,
}

impl LeaseKeeper {
    /// The lease's id.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// Sends one keep-alive; its answer comes on the [`LeaseKeepAliveStream`].
    ///
    /// # Errors
    ///
    /// [`Error::LeaseKeepAliveError`] when the stream is closed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the keep-alive is sent or not.
    pub async fn keep_alive(&mut self) -> Result<(), Error> {
        self.sender
            .send(LeaseKeepAliveRequest { id: self.id })
            .await
            .map_err(|e| Error::LeaseKeepAliveError(e.to_string()))
    }
}

/// The answers to a lease's keep-alives.
#[derive(Debug)]
pub struct LeaseKeepAliveStream {
    answers: Streaming<LeaseKeepAliveResponse>,
}

impl LeaseKeepAliveStream {
    /// The next answer; `None` when the stream ended.
    ///
    /// # Errors
    ///
    /// [`Error::GRpcStatus`] when the stream broke.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn message(&mut self) -> Result<Option<LeaseKeepAliveResponse>, Error> {
        Ok(self.answers.message().await?)
    }
}

impl LeaseGrantResponse {
    /// The lease's id.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The TTL granted, in seconds.
    pub fn ttl(&self) -> i64 {
        self.ttl
    }

    /// etcd's error text; empty when the lease was granted.
    pub fn error(&self) -> &str {
        &self.error
    }
}

impl LeaseKeepAliveResponse {
    /// The lease's id.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The TTL renewed, in seconds; 0 or less when the lease is gone.
    pub fn ttl(&self) -> i64 {
        self.ttl
    }
}

impl LeaseTimeToLiveResponse {
    /// The seconds left; -1 when the lease is gone.
    pub fn ttl(&self) -> i64 {
        self.ttl
    }
}
