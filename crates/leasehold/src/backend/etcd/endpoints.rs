//! Where requests go: one `etcd-client` per member, a per-call deadline on every request, and retries on the next
//! member for requests that may be repeated.
//!
//! A request in flight to a member that was just killed or paused does not fail: the server answers "request timed
//! out, possibly due to previous leader failure" after about 7 s, and a stopped member never. So every call runs
//! under its own deadline, shorter than the session's lease, and a call that may be repeated moves on to the next
//! member when it passes. One client per member (instead of the crate's balanced channel over all of them) is what
//! lets a retry choose *another* member.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use tonic::Code;

use super::EtcdError;

/// The scheme of an etcd URL.
const SCHEME: &str = "etcd://";

/// The members of one cluster, and which of them requests go to first.
pub(crate) struct Endpoints {
    clients: Vec<(String, Client)>,
    /// Index of the member tried first; moves on after a failed try, so the next request avoids a dead member.
    current: AtomicUsize,
    call_timeout: Duration,
}

/// `host:port` of every member an `etcd://h1:p1,h2:p2` URL names.
pub(crate) fn parse_url(url: &str) -> Result<Vec<String>, EtcdError> {
    let invalid = |why| EtcdError::InvalidUrl {
        url: url.to_owned(),
        why,
    };
    let hosts = url
        .strip_prefix(SCHEME)
        .ok_or_else(|| invalid("it does not start with etcd://"))?;
    let hosts = hosts.strip_suffix('/').unwrap_or(hosts);
    let endpoints: Vec<String> = hosts.split(',').map(str::to_owned).collect();
    for endpoint in &endpoints {
        let (host, port) = endpoint
            .rsplit_once(':')
            .ok_or_else(|| invalid("every member needs host:port"))?;
        if host.is_empty() || port.parse::<u16>().is_err() || endpoint.contains('/') {
            return Err(invalid("every member needs host:port"));
        }
    }
    Ok(endpoints)
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
    pub(crate) async fn connect(url: &str, call_timeout: Duration) -> Result<Endpoints, EtcdError> {
        let mut clients = Vec::new();
        for endpoint in parse_url(url)? {
            let options = ConnectOptions::new()
                .with_connect_timeout(call_timeout)
                .with_timeout(call_timeout)
                // A member cut off from the leader fails requests and cancels watches at once instead of serving
                // stale reads or silent watches; the retry then moves on.
                .with_require_leader(true);
            let client = Client::connect([format!("http://{endpoint}")], Some(options))
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
        Fut: Future<Output = Result<T, etcd_client::Error>>,
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
pub(crate) fn is_transient(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(status) => matches!(
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
            parse_url("etcd://127.0.0.1:2379,10.0.0.2:2380").unwrap(),
            ["127.0.0.1:2379", "10.0.0.2:2380"]
        );
        assert_eq!(parse_url("etcd://h:1/").unwrap(), ["h:1"]);
        for bad in [
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
