//! The bench's etcd (`--store etcd://host:port[,host:port…]`): the plain recipe a Go user gets, which is the floor
//! on etcd, the raw round trip, and what is read from the members themselves over their `/metrics` page.
//!
//! The floor is etcd's own server-side lock, the `Lock`/`Unlock` RPC of its v3lock API (what leasehold's own etcd
//! client's `lock`/`unlock` call, and Go's `v3lockpb` clients): `Lock(name, lease)` puts a key under `name/` with the
//! caller's lease and answers once it is the oldest there; `Unlock(key)` deletes it. One lease per process, granted
//! before the measured window and kept alive by a task of its own.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context as _};
use leasehold::__etcd::rpc::{Client, ConnectOptions, LockOptions};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::task::JoinHandle;

/// The scheme of etcd URLs.
const SCHEME: &str = "etcd://";

/// The floor's lock names live under this prefix, apart from leasehold's (`leasehold/…`).
const FLOOR_PREFIX: &str = "leasehold-bench-floor";

/// The floor's lease, in whole seconds (etcd's unit); kept alive every third of it.
const FLOOR_TTL_S: i64 = 10;

/// The deadline of each request the bench makes itself (the floor's, the readings of `/metrics`).
const TIMEOUT: Duration = Duration::from_secs(5);

/// The members of the etcd cluster of `--store`.
#[derive(Clone, Debug)]
pub struct Etcd {
    /// `host:port` of each member the URL names.
    members: Vec<String>,
}

impl Etcd {
    /// The members of an `etcd://` URL; `None` for any other URL.
    pub fn parse(url: &str) -> Option<Etcd> {
        let hosts = url.strip_prefix(SCHEME)?;
        let hosts = hosts.strip_suffix('/').unwrap_or(hosts);
        Some(Etcd {
            members: hosts.split(',').map(str::to_owned).collect(),
        })
    }

    /// How many members the URL names (whose CPU time the server columns sum).
    pub fn members(&self) -> usize {
        self.members.len()
    }

    /// A client of etcd's own API, to every member.
    pub async fn client(&self) -> anyhow::Result<Client> {
        let endpoints: Vec<String> = self
            .members
            .iter()
            .map(|member| format!("http://{member}"))
            .collect();
        let options = ConnectOptions::new()
            .with_connect_timeout(TIMEOUT)
            .with_timeout(TIMEOUT);
        Client::connect(endpoints, Some(options))
            .await
            .context("connecting to etcd for the floor")
    }

    /// The floor: a client, and a lease kept alive until the floor is dropped.
    pub async fn floor(&self) -> anyhow::Result<Floor> {
        let mut client = self.client().await?;
        let lease = client
            .lease_grant(FLOOR_TTL_S, None)
            .await
            .context("granting the floor's lease")?
            .id();
        let (mut keeper, mut answers) = client.lease_keep_alive(lease).await?;
        let every = Duration::from_secs(FLOOR_TTL_S.unsigned_abs()) / 3;
        let keeper = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if keeper.keep_alive().await.is_err()
                    || !matches!(answers.message().await, Ok(Some(_)))
                {
                    return;
                }
            }
        });
        Ok(Floor {
            client,
            lease,
            keeper,
        })
    }

    /// One raw round trip: a linearizable read of one key (through the leader, as every lock request goes).
    pub async fn round_trip(client: &mut Client) -> anyhow::Result<()> {
        client.get(format!("{FLOOR_PREFIX}/rtt"), None).await?;
        Ok(())
    }

    /// Each member's CPU time so far (`process_cpu_seconds_total`, user + system), by member.
    pub async fn cpu_seconds(&self) -> anyhow::Result<BTreeMap<String, f64>> {
        let mut seconds = BTreeMap::new();
        for member in &self.members {
            let page = metrics(member).await?;
            let cpu = metric(&page, "process_cpu_seconds_total")
                .with_context(|| format!("no process_cpu_seconds_total on {member}/metrics"))?;
            seconds.insert(member.clone(), cpu);
        }
        Ok(seconds)
    }

    /// The lease renewals the members have counted so far (`etcd_debugging_lease_renewed_total`: keep-alives, as
    /// the leader sees them), summed over the members.
    pub async fn lease_renewals(&self) -> anyhow::Result<u64> {
        let mut total = 0.0;
        for member in &self.members {
            let page = metrics(member).await?;
            total += metric(&page, "etcd_debugging_lease_renewed_total").unwrap_or(0.0);
        }
        Ok(total as u64)
    }
}

/// etcd's server-side lock under one lease of this process.
pub struct Floor {
    client: Client,
    lease: i64,
    keeper: JoinHandle<()>,
}

impl Floor {
    /// Waits in etcd until the lock `name` is granted (under the floor's prefix); returns the key that holds it.
    pub async fn lock(&self, name: &str) -> anyhow::Result<Vec<u8>> {
        let options = LockOptions::new().with_lease(self.lease);
        let granted = self
            .client
            .clone()
            .lock(format!("{FLOOR_PREFIX}/{name}"), Some(options))
            .await?;
        Ok(granted.key().to_vec())
    }

    /// Gives the lock held by `key` back.
    pub async fn unlock(&self, key: Vec<u8>) -> anyhow::Result<()> {
        self.client.clone().unlock(key).await?;
        Ok(())
    }
}

impl Drop for Floor {
    /// Stops the keep-alives; the lease (and any key a cancelled `lock` left) expires within its TTL.
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// The `/metrics` page of a member (served on its client port), by plain HTTP/1.0.
async fn metrics(member: &str) -> anyhow::Result<String> {
    let read = async {
        let mut stream = tokio::net::TcpStream::connect(member).await?;
        stream
            .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {member}\r\n\r\n").as_bytes())
            .await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        anyhow::Ok(response)
    };
    let response = tokio::time::timeout(TIMEOUT, read)
        .await
        .with_context(|| format!("{member}/metrics did not answer within {TIMEOUT:?}"))?
        .with_context(|| format!("reading {member}/metrics"))?;
    let Some((head, body)) = response.split_once("\r\n\r\n") else {
        bail!("{member}/metrics: not an HTTP response");
    };
    if head.split(' ').nth(1) != Some("200") {
        bail!(
            "{member}/metrics: {}",
            head.lines().next().unwrap_or_default()
        );
    }
    Ok(body.to_owned())
}

/// The value of the unlabelled metric `name` on a Prometheus text page.
fn metric(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_read_by_their_whole_name() {
        let page =
            "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n\
                    # TYPE process_cpu_seconds_total counter\n\
                    process_cpu_seconds_total 2.7\n\
                    process_cpu_seconds_total_other 9\n\
                    etcd_debugging_lease_renewed_total 23\n";
        assert_eq!(metric(page, "process_cpu_seconds_total"), Some(2.7));
        assert_eq!(
            metric(page, "etcd_debugging_lease_renewed_total"),
            Some(23.0)
        );
        assert_eq!(metric(page, "process_cpu"), None);
    }

    #[test]
    fn the_url_names_the_members() {
        let etcd = Etcd::parse("etcd://10.0.0.1:2379,10.0.0.2:2379/").unwrap();
        assert_eq!(etcd.members, ["10.0.0.1:2379", "10.0.0.2:2379"]);
        assert_eq!(etcd.members(), 2);
        assert!(Etcd::parse("redis://127.0.0.1:6379").is_none());
    }
}
