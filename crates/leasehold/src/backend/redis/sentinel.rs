//! A primary that Redis Sentinel manages: found through the sentinels, and followed when they fail over.
//!
//! redis-rs's own sentinel support resolves the primary when it connects and never again: after a failover, an old
//! connection kept writing to the demoted primary for 11 s (FIELD-NOTES). Here the primary is followed:
//! - at connect, the sentinels are asked in turn (`SENTINEL GET-MASTER-ADDR-BY-NAME`), and the node they name is
//!   connected to and must answer `ROLE` with `master`;
//! - a follower task listens to `+switch-master` on a sentinel and moves the command connection (and the
//!   subscriber, through [`Followed::changed`]) to the new primary as soon as the sentinels announce it;
//! - a request that meets `READONLY` (it reached a demoted primary) or a broken connection makes the follower ask
//!   the sentinels at once, and it also asks every [`RECHECK_EVERY`], in case an announcement was missed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::ConnectionManagerConfig;
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisResult};
use tokio::sync::{watch, Notify};

use crate::backend::redis::conn::Conn;
use crate::error::InvalidArgument;

/// The tracing target of this file's events: the module path it had before the files moved into folders, so that
/// log filters keep working (`leasehold::sentinel=debug`).
const TARGET: &str = "leasehold::sentinel";

/// The scheme of a Sentinel URL, `redis+sentinel://host:port,host:port/service`; `rediss+sentinel://` for TLS.
pub(crate) const SENTINEL_SCHEME: &str = "redis+sentinel://";
pub(crate) const SENTINEL_TLS_SCHEME: &str = "rediss+sentinel://";

/// How often the follower asks the sentinels where the primary is, besides listening to their announcements.
const RECHECK_EVERY: Duration = Duration::from_secs(5);
/// The follower's wait before it tries the sentinels again after they all failed.
const RETRY_AFTER: Duration = Duration::from_millis(200);

/// The sentinels of one service, and how to reach its data nodes.
#[derive(Clone)]
pub(crate) struct Sentinel {
    pub(crate) sentinels: Vec<ConnectionInfo>,
    pub(crate) service: String,
    /// A data node's connection settings (credentials, database, TLS); its address is replaced by the primary's.
    pub(crate) data: ConnectionInfo,
}

impl Sentinel {
    /// Parses `redis+sentinel://[user[:password]@]s1:p1,s2:p2/service[/db]`: the credentials and database are the
    /// data nodes'; the sentinels are reached without credentials.
    pub(crate) fn parse(url: &str) -> Result<Sentinel, InvalidArgument> {
        let (tls, rest) = if let Some(rest) = url.strip_prefix(SENTINEL_TLS_SCHEME) {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix(SENTINEL_SCHEME) {
            (false, rest)
        } else {
            return Err(InvalidArgument::BadUrl(
                "not a redis+sentinel:// URL".to_owned(),
            ));
        };
        let scheme = if tls { "rediss://" } else { "redis://" };
        let (authority, path) = rest.split_once('/').ok_or_else(|| {
            InvalidArgument::BadUrl(
                "a redis+sentinel:// URL names its service after the hosts: …/service-name"
                    .to_owned(),
            )
        })?;
        let (credentials, hosts) = match authority.rfind('@') {
            Some(at) => (&authority[..=at], &authority[at + 1..]),
            None => ("", authority),
        };
        let (path, query) = match path.split_once('?') {
            Some((path, query)) => (path, format!("?{query}")),
            None => (path, String::new()),
        };
        let (service, db) = match path.split_once('/') {
            Some((service, db)) => (service, format!("/{db}")),
            None => (path, String::new()),
        };
        if service.is_empty() {
            return Err(InvalidArgument::BadUrl(
                "a redis+sentinel:// URL names its service after the hosts: …/service-name"
                    .to_owned(),
            ));
        }
        let mut sentinels = Vec::new();
        for host in hosts.split(',') {
            let host = host.trim();
            if host.is_empty() {
                return Err(InvalidArgument::BadUrl(
                    "a redis+sentinel:// URL lists an empty host (write host:port,host:port)"
                        .to_owned(),
                ));
            }
            let info = format!("{scheme}{host}{query}")
                .into_connection_info()
                .map_err(|e| InvalidArgument::BadUrl(format!("a sentinel: {e}")))?;
            sentinels.push(info);
        }
        // The data nodes' settings, at a placeholder address that resolving replaces.
        let data = format!("{scheme}{credentials}127.0.0.1:6379{db}{query}")
            .into_connection_info()
            .map_err(|e| InvalidArgument::BadUrl(format!("the data nodes' settings: {e}")))?;
        Ok(Sentinel {
            sentinels,
            service: service.to_owned(),
            data,
        })
    }

    /// Asks the sentinels with these credentials.
    pub(crate) fn authenticate(&mut self, username: Option<&str>, password: &str) {
        for sentinel in &mut self.sentinels {
            let mut settings = sentinel.redis_settings().clone().set_password(password);
            if let Some(username) = username {
                settings = settings.set_username(username);
            }
            *sentinel = sentinel.clone().set_redis_settings(settings);
        }
    }

    /// The data node at `host:port`, with the data nodes' settings.
    fn node(&self, host: String, port: u16) -> ConnectionInfo {
        let addr = match self.data.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host, port),
        };
        self.data.clone().set_addr(addr)
    }

    /// The primary as the first sentinel that answers names it.
    async fn ask(&self, timeout: Duration) -> RedisResult<(String, u16)> {
        let mut last = None;
        for sentinel in &self.sentinels {
            let asked = async {
                let client = redis::Client::open(sentinel.clone())?;
                let mut con = client.get_multiplexed_async_connection().await?;
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&self.service)
                    .query_async::<Option<(String, u16)>>(&mut con)
                    .await
            };
            match tokio::time::timeout(timeout, asked).await {
                Ok(Ok(Some(addr))) => return Ok(addr),
                Ok(Ok(None)) => {
                    last = Some(redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "the sentinels do not know the service",
                        self.service.clone(),
                    )))
                }
                Ok(Err(err)) => last = Some(err),
                Err(_) => last = Some(timed_out("a sentinel did not answer in time")),
            }
        }
        Err(last.unwrap_or_else(|| timed_out("no sentinel to ask")))
    }
}

fn timed_out(what: &'static str) -> redis::RedisError {
    std::io::Error::new(std::io::ErrorKind::TimedOut, what).into()
}

/// The current primary of a Sentinel-managed service: its address, a command connection to it, and a signal when
/// it changes.
pub(crate) struct Followed {
    spec: Sentinel,
    config: ConnectionManagerConfig,
    connect_timeout: Duration,
    current: RwLock<Primary>,
    /// Bumped whenever the primary changes.
    changed: watch::Sender<u64>,
    /// Asks the follower to check with the sentinels now.
    check: Notify,
    checking: AtomicBool,
}

#[derive(Clone)]
struct Primary {
    addr: (String, u16),
    client: redis::Client,
    conn: Conn,
}

impl Followed {
    /// Finds the primary, connects to it, checks its role, and starts following it (a task that holds it weakly).
    pub(crate) async fn connect(
        spec: Sentinel,
        config: ConnectionManagerConfig,
        connect_timeout: Duration,
    ) -> RedisResult<Arc<Followed>> {
        let primary = open(&spec, &config, connect_timeout).await?;
        let followed = Arc::new(Followed {
            spec,
            config,
            connect_timeout,
            current: RwLock::new(primary),
            changed: watch::channel(0).0,
            check: Notify::new(),
            checking: AtomicBool::new(false),
        });
        tokio::spawn(follow(Arc::downgrade(&followed)));
        Ok(followed)
    }

    /// The command connection to the current primary.
    pub(crate) fn conn(&self) -> Conn {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .conn
            .clone()
    }

    /// A client for the current primary (the subscriber and the final releases open their own connections).
    pub(crate) fn client(&self) -> redis::Client {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .client
            .clone()
    }

    /// Changes whenever the primary does.
    pub(crate) fn changed(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// A request's outcome: `READONLY` (it reached a demoted primary) or a broken connection makes the follower ask
    /// the sentinels now.
    pub(crate) fn observe<T>(&self, result: &RedisResult<T>) {
        if let Err(err) = result {
            let demoted = err.code() == Some("READONLY") || err.to_string().contains("READONLY");
            if demoted || err.is_connection_dropped() || err.is_connection_refusal() {
                self.check.notify_one();
            }
        }
    }

    /// Asks the sentinels where the primary is, and moves there when it moved.
    async fn recheck(&self) {
        if self.checking.swap(true, Ordering::AcqRel) {
            return;
        }
        let timeout = self.connect_timeout;
        match self.spec.ask(timeout).await {
            Ok(addr) if addr != self.current.read().unwrap_or_else(|e| e.into_inner()).addr => {
                match open_at(&self.spec, &self.config, timeout, addr.clone()).await {
                    Ok(primary) => {
                        tracing::warn!(target: TARGET, host = %addr.0, port = addr.1, "the sentinels moved the primary; following it");
                        *self.current.write().unwrap_or_else(|e| e.into_inner()) = primary;
                        self.changed.send_modify(|n| *n = n.wrapping_add(1));
                    }
                    Err(err) => {
                        tracing::debug!(target: TARGET, error = %err, "the new primary is not ready yet");
                    }
                }
            }
            Ok(_) => {}
            Err(err) => tracing::debug!(target: TARGET, error = %err, "no sentinel answered"),
        }
        self.checking.store(false, Ordering::Release);
    }
}

/// Resolves the primary and connects to it.
async fn open(
    spec: &Sentinel,
    config: &ConnectionManagerConfig,
    timeout: Duration,
) -> RedisResult<Primary> {
    let addr = spec.ask(timeout).await?;
    open_at(spec, config, timeout, addr).await
}

/// Connects to the node at `addr`, which must say it is a primary.
async fn open_at(
    spec: &Sentinel,
    config: &ConnectionManagerConfig,
    timeout: Duration,
    addr: (String, u16),
) -> RedisResult<Primary> {
    let client = redis::Client::open(spec.node(addr.0.clone(), addr.1))?;
    let opened = async {
        let conn = Conn::managed(client.clone(), config.clone()).await?;
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut conn.clone()).await?;
        let role = role
            .first()
            .cloned()
            .and_then(|r| redis::from_redis_value::<String>(r).ok());
        if role.as_deref() != Some("master") {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "the node the sentinels name is not a primary (yet)",
                format!("{}:{} says {role:?}", addr.0, addr.1),
            )));
        }
        Ok(conn)
    };
    let conn = tokio::time::timeout(timeout.saturating_mul(2), opened)
        .await
        .map_err(|_| timed_out("timed out connecting to the primary"))??;
    Ok(Primary { addr, client, conn })
}

/// The follower: listens to `+switch-master` on one sentinel at a time, and checks with the sentinels when told,
/// when an announcement comes, and every [`RECHECK_EVERY`]. Ends when the client is dropped.
async fn follow(followed: Weak<Followed>) {
    let mut next_sentinel = 0;
    loop {
        let Some(this) = followed.upgrade() else {
            return;
        };
        let sentinel = this.spec.sentinels[next_sentinel % this.spec.sentinels.len()].clone();
        next_sentinel += 1;
        let timeout = this.connect_timeout;
        drop(this);
        let pubsub = async {
            let mut pubsub = redis::Client::open(sentinel)?.get_async_pubsub().await?;
            pubsub.subscribe("+switch-master").await?;
            RedisResult::Ok(pubsub)
        };
        let mut messages = match tokio::time::timeout(timeout, pubsub).await {
            Ok(Ok(pubsub)) => Some(pubsub.into_on_message()),
            _ => None,
        };
        let mut recheck = tokio::time::interval(RECHECK_EVERY);
        loop {
            let Some(this) = followed.upgrade() else {
                return;
            };
            let message = async {
                match messages.as_mut() {
                    Some(messages) => messages.next().await,
                    None => {
                        tokio::time::sleep(RETRY_AFTER).await;
                        None
                    }
                }
            };
            tokio::select! {
                message = message => {
                    match message {
                        // "<service> <old ip> <old port> <new ip> <new port>"
                        Some(message) => {
                            let text: String = message.get_payload().unwrap_or_default();
                            if text.split(' ').next() == Some(this.spec.service.as_str()) {
                                this.recheck().await;
                            }
                        }
                        // The sentinel went away (or there was none): check, then listen to the next one.
                        None => {
                            this.recheck().await;
                            break;
                        }
                    }
                }
                () = this.check.notified() => this.recheck().await,
                _ = recheck.tick() => this.recheck().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sentinel_url_names_the_sentinels_the_service_and_the_data_nodes_settings() {
        let sentinel = Sentinel::parse("redis+sentinel://u:pw@s1:26379,s2:26380/orders/2").unwrap();
        assert_eq!(sentinel.sentinels.len(), 2);
        assert_eq!(sentinel.service, "orders");
        assert_eq!(sentinel.sentinels[0].redis_settings().password(), None);
        let node = sentinel.node("10.0.0.9".to_owned(), 7001);
        assert_eq!(node.redis_settings().password(), Some("pw"));
        assert_eq!(node.redis_settings().db(), 2);
        assert!(matches!(node.addr(), ConnectionAddr::Tcp(h, 7001) if h == "10.0.0.9"));
        let mut authenticated = sentinel.clone();
        authenticated.authenticate(Some("watcher"), "s3cret");
        assert_eq!(
            authenticated.sentinels[1].redis_settings().username(),
            Some("watcher")
        );
        assert_eq!(
            authenticated.sentinels[1].redis_settings().password(),
            Some("s3cret")
        );
        // The data nodes keep their own.
        assert_eq!(
            authenticated
                .node("h".to_owned(), 1)
                .redis_settings()
                .password(),
            Some("pw")
        );
        assert!(Sentinel::parse("redis+sentinel://s1:26379").is_err());
        assert!(Sentinel::parse("redis+sentinel://s1:26379/").is_err());
        assert!(Sentinel::parse("redis+sentinel://s1:1,,s2:2/x").is_err());
    }
}
