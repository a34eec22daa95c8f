//! Connecting to etcd, and what travels with every call: the `hasleader` requirement and an etcd user's token,
//! authenticated again once when etcd says the token expired.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use futures_util::stream::{self, Stream};
use tokio::sync::mpsc;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};

use super::pb::etcdserverpb::auth_client::AuthClient;
use super::pb::etcdserverpb::AuthenticateRequest;
use super::Error;

#[cfg(feature = "tls")]
pub use tonic::transport::{Certificate, ClientTlsConfig as TlsOptions, Identity};

/// The metadata key of an etcd user's token.
const TOKEN: &str = "token";
/// The metadata that makes a member without a leader refuse a call at once (`rpctypes.MetadataRequireLeaderKey`).
const REQUIRE_LEADER: (&str, &str) = ("hasleader", "true");
/// What etcd answers a call whose token expired or is unknown (`rpctypes.ErrInvalidAuthToken`); the `Lock` service,
/// built on etcd's in-process client, loses the `Unauthenticated` code and keeps only this text.
const INVALID_AUTH_TOKEN: &str = "etcdserver: invalid auth token";

/// Room for messages queued on an outgoing stream before a send waits.
const QUEUE: usize = 16;

/// The request that opens a bidirectional stream, `first`'s message first, and the sender of the messages after it:
/// the stream's outgoing half ends when the sender is dropped.
pub(super) fn stream_request<M: Send + 'static>(
    first: Request<M>,
) -> (
    mpsc::Sender<M>,
    Request<impl Stream<Item = M> + Send + 'static>,
) {
    let (sender, receiver) = mpsc::channel(QUEUE);
    let request = first.map(|first| {
        // Room for it: the channel is new.
        let _ = sender.try_send(first);
        stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|message| (message, receiver))
        })
    });
    (sender, request)
}

/// How to reach the members: deadlines, HTTP/2 keep-alive, credentials, TLS. Everything defaults to off.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    user: Option<(String, String)>,
    keep_alive: Option<(Duration, Duration)>,
    keep_alive_while_idle: bool,
    timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
    #[cfg(feature = "tls")]
    tls: Option<TlsOptions>,
    require_leader: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl ConnectOptions {
    /// No deadlines, no keep-alive pings, no credentials.
    pub fn new() -> Self {
        ConnectOptions {
            user: None,
            keep_alive: None,
            keep_alive_while_idle: true,
            timeout: None,
            connect_timeout: None,
            #[cfg(feature = "tls")]
            tls: None,
            require_leader: false,
        }
    }

    /// Authenticates as etcd user `name` on connect; every call then carries the token.
    pub fn with_user(mut self, name: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((name.into(), password.into()));
        self
    }

    /// The TLS settings of `https://` endpoints.
    #[cfg(feature = "tls")]
    pub fn with_tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    /// HTTP/2 pings every `interval`, the connection dropped when one is not answered within `timeout`.
    pub fn with_keep_alive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.keep_alive = Some((interval, timeout));
        self
    }

    /// Whether the pings go on while no call is in flight. Defaults to true (with [`with_keep_alive`](Self::with_keep_alive)).
    pub fn with_keep_alive_while_idle(mut self, enabled: bool) -> Self {
        self.keep_alive_while_idle = enabled;
        self
    }

    /// The deadline of each call (until its answer, or a stream's first answer).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The deadline of each connection attempt.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// Whether a member with no leader refuses calls at once (and cancels watches) instead of serving them.
    pub fn with_require_leader(mut self, require_leader: bool) -> Self {
        self.require_leader = require_leader;
        self
    }
}

/// A client of one or more etcd members (calls balanced over them). Cheap to clone: clones share the connections
/// and the token.
#[derive(Clone)]
pub struct Client {
    channel: Channel,
    auth: Arc<Auth>,
}

/// The credentials and the token a client's calls carry.
struct Auth {
    require_leader: bool,
    user: Option<(String, String)>,
    token: RwLock<Option<AsciiMetadataValue>>,
    /// One authentication at a time: calls that all find the token expired authenticate once.
    refresh: tokio::sync::Mutex<()>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("user", &self.auth.user.as_ref().map(|(name, _)| name))
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client of `endpoints` (`host:port`, `http://host:port` or `https://host:port`). Connections are made at
    /// the first call, so a member that is down now does not fail this; with credentials, it authenticates at once,
    /// and so needs a member to answer.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgs`] for no endpoint, or `https://` without the `tls` feature; [`Error::TransportError`]
    /// for an endpoint that is not a URI or TLS settings tonic refuses; the error of `Authenticate`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing outlives the future but an unused token.
    pub async fn connect<E: AsRef<str>, S: AsRef<[E]>>(
        endpoints: S,
        options: Option<ConnectOptions>,
    ) -> Result<Client, Error> {
        let options = options.unwrap_or_default();
        let endpoints = endpoints
            .as_ref()
            .iter()
            .map(|url| endpoint(url.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()?;
        if endpoints.is_empty() {
            return Err(Error::InvalidArgs("no endpoint".to_owned()));
        }
        let client = Client {
            channel: Channel::balance_list(endpoints.into_iter()),
            auth: Arc::new(Auth {
                require_leader: options.require_leader,
                user: options.user,
                token: RwLock::new(None),
                refresh: tokio::sync::Mutex::new(()),
            }),
        };
        client.authenticate().await?;
        Ok(client)
    }

    /// The channel the generated clients are built on.
    pub(super) fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// Sends one call (`send` sends `message`, made a request, on the channel) and returns its answer; when etcd
    /// says the token is not valid (it forgot it), authenticates again, unless another call already did, and sends
    /// it once more.
    pub(super) async fn call<M, T, F, Fut>(&self, message: M, send: F) -> Result<T, Error>
    where
        M: Clone,
        F: Fn(Channel, Request<M>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let sent_with = self.token();
        let answer = match send(self.channel(), self.request(message.clone(), &sent_with)).await {
            Err(status) if self.auth.user.is_some() && is_invalid_auth_token(&status) => {
                self.authenticate_unless_renewed(sent_with).await?;
                let token = self.token();
                send(self.channel(), self.request(message, &token)).await
            }
            answer => answer,
        };
        Ok(answer?.into_inner())
    }

    /// `message` as a request carrying the token and the leader requirement.
    fn request<M>(&self, message: M, token: &Option<AsciiMetadataValue>) -> Request<M> {
        let mut request = Request::new(message);
        if let Some(token) = token {
            request.metadata_mut().insert(TOKEN, token.clone());
        }
        if self.auth.require_leader {
            let (key, value) = REQUIRE_LEADER;
            request
                .metadata_mut()
                .insert(key, AsciiMetadataValue::from_static(value));
        }
        request
    }

    fn token(&self) -> Option<AsciiMetadataValue> {
        self.auth
            .token
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Authenticates as the client's user (if it has one) and keeps the token.
    async fn authenticate(&self) -> Result<(), Error> {
        let Some((name, password)) = &self.auth.user else {
            return Ok(());
        };
        let request = self.request(
            AuthenticateRequest {
                name: name.clone(),
                password: password.clone(),
            },
            &None,
        );
        let answer = AuthClient::new(self.channel())
            .authenticate(request)
            .await?
            .into_inner();
        let token = AsciiMetadataValue::try_from(answer.token)?;
        *self
            .auth
            .token
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(token);
        Ok(())
    }

    /// [`authenticate`](Self::authenticate), unless the token is no longer `stale` (a concurrent call renewed it).
    async fn authenticate_unless_renewed(
        &self,
        stale: Option<AsciiMetadataValue>,
    ) -> Result<(), Error> {
        let _one_at_a_time = self.auth.refresh.lock().await;
        if self.token() != stale {
            return Ok(());
        }
        self.authenticate().await
    }
}

/// The tonic endpoint of one member, with the options' deadlines, keep-alive and TLS.
fn endpoint(url: &str, options: &ConnectOptions) -> Result<Endpoint, Error> {
    let endpoint = if url.starts_with("https://") {
        #[cfg(not(feature = "tls"))]
        return Err(Error::InvalidArgs(
            "https:// endpoints need leasehold's `tls` feature".to_owned(),
        ));
        #[cfg(feature = "tls")]
        Endpoint::from_shared(url.to_owned())?
            .tls_config(options.tls.clone().unwrap_or_default())?
    } else if url.starts_with("http://") {
        Endpoint::from_shared(url.to_owned())?
    } else {
        Endpoint::from_shared(format!("http://{url}"))?
    };
    let mut endpoint = endpoint;
    if let Some((interval, timeout)) = options.keep_alive {
        endpoint = endpoint
            .keep_alive_while_idle(options.keep_alive_while_idle)
            .http2_keep_alive_interval(interval)
            .keep_alive_timeout(timeout);
    }
    if let Some(timeout) = options.timeout {
        endpoint = endpoint.timeout(timeout);
    }
    if let Some(timeout) = options.connect_timeout {
        endpoint = endpoint.connect_timeout(timeout);
    }
    Ok(endpoint)
}

/// Whether etcd refused the call for its token: `Unauthenticated`, or `Unknown` with etcd's text (from services
/// built on its in-process client, as `Lock`).
fn is_invalid_auth_token(status: &Status) -> bool {
    match status.code() {
        Code::Unauthenticated => true,
        Code::Unknown => status.message() == INVALID_AUTH_TOKEN,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expired_token_is_told_from_other_refusals() {
        assert!(is_invalid_auth_token(&Status::unauthenticated(
            INVALID_AUTH_TOKEN
        )));
        assert!(is_invalid_auth_token(&Status::unknown(INVALID_AUTH_TOKEN)));
        assert!(!is_invalid_auth_token(&Status::unknown(
            "etcdserver: request timed out"
        )));
        assert!(!is_invalid_auth_token(&Status::permission_denied(
            "etcdserver: permission denied"
        )));
    }
}
