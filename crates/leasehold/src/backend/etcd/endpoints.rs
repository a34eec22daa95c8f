//! Where requests go: one [`Client`] per member, a per-call deadline on every request, and retries on the next
//! member for requests that may be repeated.
//!
//! A request in flight to a member that was just killed or paused does not fail: the server answers "request timed
//! out, possibly due to previous leader failure" after about 7 s, and a stopped member never. So every call runs
//! under its own deadline, shorter than the session's lease, and a call that may be repeated moves on to the next
//! member when it passes. One client per member (instead of one balanced channel over all of them) is what
//! lets a retry choose *another* member.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::rpc::{self, Client, ConnectOptions};
use tonic::Code;

use super::EtcdError;
use crate::backend::url::percent_decoded;
pub(crate) use crate::backend::url::redacted;

/// The scheme of an etcd URL, and of one over TLS.
const SCHEME: &str = "etcd://";
const TLS_SCHEME: &str = "etcds://";

/// TLS material for `etcds://` members: a CA to trust instead of the system's store, and a client identity (both
/// PEM).
#[derive(Debug, Clone, Default)]
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
pub(crate) struct EtcdTls {
    pub(crate) ca: Option<Vec<u8>>,
    pub(crate) identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// The members of one cluster, and which of them requests go to first.
pub(crate) struct Endpoints {
    clients: Vec<(String, Client)>,
    /// Index of the member tried first; moves on after a failed try, so the next request avoids a dead member.
    current: AtomicUsize,
    call_timeout: Duration,
}

/// What an etcd URL names: every member's `host:port`, and the credentials of an etcd user when it gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) members: Vec<String>,
    pub(crate) user: Option<(String, String)>,
    /// `etcds://`: the members speak TLS.
    pub(crate) tls: bool,
}

/// Parses `etcd://[user:password@]h1:p1[,h2:p2…][/]`; the user name and password may be percent-encoded.
pub(crate) fn parse_url(url: &str) -> Result<Target, EtcdError> {
    let invalid = |why| EtcdError::InvalidUrl {
        url: redacted(url),
        why,
    };
    let (rest, tls) = match url.strip_prefix(SCHEME) {
        Some(rest) => (rest, false),
        None => (
            url.strip_prefix(TLS_SCHEME)
                .ok_or_else(|| invalid("it does not start with etcd:// or etcds://"))?,
            true,
        ),
    };
    let (user, hosts) = match rest.rsplit_once('@') {
        Some((credentials, hosts)) => {
            let (name, password) = credentials
                .split_once(':')
                .ok_or_else(|| invalid("credentials are user:password@"))?;
            let name =
                percent_decoded(name).ok_or_else(|| invalid("a bad %-escape in the user name"))?;
            let password = percent_decoded(password)
                .ok_or_else(|| invalid("a bad %-escape in the password"))?;
            if name.is_empty() {
                return Err(invalid("the user name is empty"));
            }
            (Some((name, password)), hosts)
        }
        None => (None, rest),
    };
    let hosts = hosts.strip_suffix('/').unwrap_or(hosts);
    let members: Vec<String> = hosts.split(',').map(str::to_owned).collect();
    for member in &members {
        let (host, port) = member
            .rsplit_once(':')
            .ok_or_else(|| invalid("every member needs host:port"))?;
        if host.is_empty() || port.parse::<u16>().is_err() || member.contains('/') {
            return Err(invalid("every member needs host:port"));
        }
    }
    Ok(Target { members, user, tls })
}

/// The TLS settings of every member of an `etcds://` URL: the given CA, or the system's trust store.
#[cfg(feature = "tls")]
fn tls_options(tls: &EtcdTls) -> rpc::TlsOptions {
    let options = rpc::TlsOptions::new();
    let options = match &tls.ca {
        Some(ca) => options.ca_certificate(rpc::Certificate::from_pem(ca)),
        None => options.with_native_roots(),
    };
    match &tls.identity {
        Some((cert, key)) => options.identity(rpc::Identity::from_pem(cert, key)),
        None => options,
    }
}

impl std::fmt::Debug for Endpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let members: Vec<&str> = self.clients.iter().map(|(e, _)| e.as_str()).collect();
        f.debug_struct("Endpoints")
            .field("members", &members)
            .field("current", &self.current)
            .field("call_timeout", &self.call_timeout)
            .finish()
    }
}

impl Endpoints {
    /// Clients for every member of `url`. Connections are made lazily, so a member that is down now does not fail
    /// this.
    pub(crate) async fn connect(
        url: &str,
        call_timeout: Duration,
        tls: &EtcdTls,
    ) -> Result<Endpoints, EtcdError> {
        let mut clients = Vec::new();
        let target = parse_url(url)?;
        let scheme = if target.tls { "https" } else { "http" };
        #[cfg(not(feature = "tls"))]
        if target.tls {
            let _ = tls;
            return Err(EtcdError::InvalidUrl {
                url: redacted(url),
                why: "etcds:// needs leasehold's `tls` feature",
            });
        }
        for endpoint in target.members {
            let mut options = ConnectOptions::new()
                .with_connect_timeout(call_timeout)
                .with_timeout(call_timeout)
                // A member cut off from the leader fails requests and cancels watches at once instead of serving
                // stale reads or silent watches; the retry then moves on.
                .with_require_leader(true)
                // HTTP/2 pings every call timeout, idle or not: a connection that died without a word (a cut path,
                // a frozen member) is dropped and the next call dials again, well within the session's lease.
                .with_keep_alive(call_timeout, call_timeout)
                .with_keep_alive_while_idle(true);
            // With credentials the client authenticates as it connects (and so needs the member to answer).
            if let Some((name, password)) = &target.user {
                options = options.with_user(name.as_str(), password.as_str());
            }
            #[cfg(feature = "tls")]
            if target.tls {
                options = options.with_tls(tls_options(tls));
            }
            let client = Client::connect([format!("{scheme}://{endpoint}")], Some(options))
                .await
                .map_err(|source| EtcdError::Etcd {
                    op: "connect",
                    source,
                })?;
            clients.push((endpoint, client));
        }
        Ok(Endpoints {
            clients,
            current: AtomicUsize::new(0),
            call_timeout,
        })
    }

    /// The deadline of one try of one request.
    pub(crate) fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    /// A client of every member, in order.
    pub(crate) fn clients(&self) -> Vec<Client> {
        self.clients.iter().map(|(_, c)| c.clone()).collect()
    }

    /// The client of the member tried first now, and its index (for [`failed`](Self::failed)).
    pub(crate) fn current(&self) -> (usize, Client) {
        let i = self.current.load(Ordering::Relaxed) % self.clients.len();
        (i, self.clients[i].1.clone())
    }

    /// Moves on from member `i` after a failed try (unless another request already did).
    pub(crate) fn failed(&self, i: usize) {
        let next = (i + 1) % self.clients.len();
        let _ = self
            .current
            .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Runs `request` under the per-call deadline, and again on the next member after a timeout or a transport-level
    /// failure, up to twice around the cluster.
    ///
    /// Only for requests that may be repeated after a try whose outcome is unknown: every request of the recipe is
    /// (reads, compare-guarded writes keyed by a grant id, a lease grant whose unused twin expires on its own).
    pub(crate) async fn call<T, F, Fut>(
        &self,
        op: &'static str,
        mut request: F,
    ) -> Result<T, EtcdError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, rpc::Error>>,
    {
        let tries = 2 * self.clients.len().max(1);
        let mut last = None;
        for _ in 0..tries {
            let (i, client) = self.current();
            match tokio::time::timeout(self.call_timeout, request(client)).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(e)) if !is_transient(&e) => {
                    return Err(EtcdError::Etcd { op, source: e });
                }
                Ok(Err(e)) => {
                    tracing::debug!(op, endpoint = %self.clients[i].0, error = %e, "etcd call failed, trying the next member");
                    last = Some(e);
                }
                Err(_elapsed) => {
                    tracing::debug!(op, endpoint = %self.clients[i].0, "etcd call timed out, trying the next member");
                    last = None;
                }
            }
            self.failed(i);
        }
        Err(match last {
            Some(source) => EtcdError::Etcd { op, source },
            None => EtcdError::Timeout {
                op,
                after: self.call_timeout,
            },
        })
    }
}

/// Whether a failed try may succeed on another member or a moment later: the connection broke, the member has no
/// leader, or the request timed out inside etcd (a leader change).
pub(crate) fn is_transient(e: &rpc::Error) -> bool {
    match e {
        rpc::Error::TransportError(_) | rpc::Error::IoError(_) => true,
        rpc::Error::GRpcStatus(status) => matches!(
            status.code(),
            Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Unknown
                | Code::Cancelled
                | Code::Aborted
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_every_member() {
        assert_eq!(
            parse_url("etcd://127.0.0.1:2379,10.0.0.2:2380")
                .unwrap()
                .members,
            ["127.0.0.1:2379", "10.0.0.2:2380"]
        );
        assert_eq!(parse_url("etcd://h:1/").unwrap().members, ["h:1"]);
        let with_user = parse_url("etcd://app:p%40ss:w@h:1,g:2").unwrap();
        assert_eq!(with_user.members, ["h:1", "g:2"]);
        assert_eq!(
            with_user.user,
            Some(("app".to_owned(), "p@ss:w".to_owned()))
        );
        assert_eq!(redacted("etcd://app:secret@h:1"), "etcd://app:***@h:1");
        assert_eq!(redacted("etcd://h:1"), "etcd://h:1");
        let bad = parse_url("etcd://app:secret@h").unwrap_err().to_string();
        assert!(!bad.contains("secret"), "{bad}");
        for bad in [
            "etcd://app@h:1",
            "etcd://:pw@h:1",
            "etcd://app:%zz@h:1",
            "redis://h:1",
            "etcd://",
            "etcd://h",
            "etcd://h:x",
            "etcd://h:1,",
            "etcd://h:1/p",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }
}
