//! The bench's ZooKeeper (`--store zk://[user:pw@]host:port[,host:port…][/chroot]`): the floor, the raw round trip,
//! and what is read from the servers themselves.
//!
//! The floor is the least a ZooKeeper lock does: create an ephemeral sequential node under the lock's path, and
//! delete it (two writes, each committed before ZooKeeper answers). Uncontended that is the whole cycle
//! (`zk-floor-1`, `-64`); on ONE name (`zk-floor-8p`) a node that is not the first must also wait, and the floor does
//! the textbook recipe's wait and nothing more: list the children, watch the node just ahead, list again once it
//! goes. One session per process, opened before the measured window.
//!
//! ZooKeeper reports no CPU time of its own (`mntr` has none), so the server's CPU time is read from `/proc` for a
//! server on this machine: the process that listens on the URL's port (see [`super::local`]). A server elsewhere shows
//! none. The requests a server received (`renew-10k`'s renewal calls) are `zk_packets_received` of its `mntr`, which
//! the server must allow (`4lw.commands.whitelist`).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use zookeeper_client::{Acls, Client, CreateMode};

use super::local::{self, Processes};

/// The scheme of ZooKeeper URLs.
const SCHEME: &str = "zk://";

/// ZooKeeper's client port, when a server is named without one.
const DEFAULT_PORT: u16 = 2181;

/// The floor's lock paths live under this node (under the URL's chroot), apart from leasehold's (`/leasehold/…`).
const FLOOR_ROOT: &str = "/leasehold-bench-floor";

/// The floor's session timeout (ZooKeeper clamps it to its bounds).
const FLOOR_SESSION: Duration = Duration::from_secs(10);

/// The deadline of each request the bench makes itself outside the measured loops (connecting, `mntr`).
const TIMEOUT: Duration = Duration::from_secs(5);

/// The servers of the ZooKeeper ensemble of `--store`, its chroot and its credentials.
#[derive(Clone, Debug)]
pub struct Zk {
    /// `host:port` of each server the URL names.
    servers: Vec<String>,
    /// The chroot, `""` for none; never ends with `/`.
    chroot: String,
    /// Digest credentials, `user:password`.
    digest: Option<String>,
}

impl Zk {
    /// The servers, chroot and credentials of a `zk://` URL; `None` for any other URL.
    pub fn parse(url: &str) -> Option<Zk> {
        let rest = url.strip_prefix(SCHEME)?;
        let (authority, chroot) = match rest.find('/') {
            Some(at) => (&rest[..at], rest[at..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let (digest, hosts) = match authority.rsplit_once('@') {
            Some((credentials, hosts)) => (Some(percent_decoded(credentials)), hosts),
            None => (None, authority),
        };
        let servers = hosts
            .split(',')
            .map(|host| match host.rsplit_once(':') {
                Some(_) => host.to_owned(),
                None => format!("{host}:{DEFAULT_PORT}"),
            })
            .collect();
        Some(Zk {
            servers,
            chroot: chroot.to_owned(),
            digest,
        })
    }

    /// How many servers the URL names (whose CPU time the server columns sum).
    pub fn servers(&self) -> usize {
        self.servers.len()
    }

    /// A session of ZooKeeper's own client (`zookeeper-client`), on the URL's servers and chroot.
    pub async fn client(&self) -> anyhow::Result<Client> {
        let mut connector = Client::connector()
            .with_session_timeout(FLOOR_SESSION)
            .with_connection_timeout(TIMEOUT);
        if let Some(digest) = &self.digest {
            connector = connector.with_auth("digest", digest.as_bytes());
        }
        let cluster = format!("{}{}", self.servers.join(","), self.chroot);
        tokio::time::timeout(TIMEOUT, connector.connect(&cluster))
            .await
            .context("connecting to ZooKeeper for the floor timed out")?
            .context("connecting to ZooKeeper for the floor")
    }

    /// The floor: a session of its own.
    pub async fn floor(&self) -> anyhow::Result<Floor> {
        Ok(Floor {
            client: self.client().await?,
        })
    }

    /// One raw round trip: a read of the root's `Stat` (answered by the server the session is connected to).
    pub async fn round_trip(client: &Client) -> anyhow::Result<()> {
        client.check_stat("/").await?;
        Ok(())
    }

    /// The CPU time so far (user + system) of each server process on this machine that listens on a port the URL
    /// names, by server; an error when there is none (a server elsewhere, or no permission to see it).
    pub async fn cpu_seconds(&self) -> anyhow::Result<BTreeMap<String, f64>> {
        local::cpu_seconds(&self.servers, Processes::One)
    }

    /// The requests the servers have received so far (`zk_packets_received` of their `mntr`), summed.
    pub async fn requests_received(&self) -> anyhow::Result<u64> {
        let mut total = 0;
        for server in &self.servers {
            let page = four_letter_word(server, "mntr").await?;
            total += page
                .lines()
                .find_map(|line| {
                    line.strip_prefix("zk_packets_received")?
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
                .with_context(|| {
                    format!(
                        "{server} answered mntr without zk_packets_received (allow mntr in its \
                         4lw.commands.whitelist): {}",
                        page.lines().next().unwrap_or_default()
                    )
                })?;
        }
        Ok(total)
    }
}

/// The floor: bare ephemeral sequential nodes of one session.
pub struct Floor {
    client: Client,
}

impl Floor {
    /// Creates an ephemeral sequential node under the lock `name` (its parents on first use); returns its path.
    pub async fn create(&self, name: &str) -> anyhow::Result<String> {
        let parent = format!("{FLOOR_ROOT}/{name}");
        let prefix = format!("{parent}/n-");
        let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let sequence = match self.client.create(&prefix, &[], &options).await {
            Ok((_, sequence)) => sequence,
            Err(zookeeper_client::Error::NoNode) => {
                let parents = CreateMode::Persistent.with_acls(Acls::anyone_all());
                self.client
                    .mkdir(&parent, &parents)
                    .await
                    .with_context(|| format!("creating the floor's node {parent}"))?;
                self.client.create(&prefix, &[], &options).await?.1
            }
            Err(e) => return Err(e.into()),
        };
        Ok(format!("{prefix}{sequence}"))
    }

    /// Creates a node as [`create`](Floor::create) does and waits until it is the first of its lock: lists the
    /// children, watches the node just ahead until it goes, lists again.
    pub async fn lock(&self, name: &str) -> anyhow::Result<String> {
        let node = self.create(name).await?;
        let (parent, own) = node.rsplit_once('/').context("a node without a parent")?;
        loop {
            let mut children = self.client.list_children(parent).await?;
            children.sort_unstable();
            let ahead = match children.binary_search_by(|child| child.as_str().cmp(own)) {
                Ok(0) => return Ok(node),
                Ok(at) => format!("{parent}/{}", children[at - 1]),
                Err(_) => bail!("the floor's node {node} is gone"),
            };
            let (stat, watcher) = self.client.check_and_watch_stat(&ahead).await?;
            // Nobody writes the floor's nodes: the one event on the node ahead is its deletion.
            if stat.is_some() {
                watcher.changed().await;
            }
        }
    }

    /// Deletes the node `path`.
    pub async fn delete(&self, path: String) -> anyhow::Result<()> {
        self.client.delete(&path, None).await?;
        Ok(())
    }
}

/// The answer of the server at `server` to the four-letter word `word`, up to the server closing the connection.
async fn four_letter_word(server: &str, word: &str) -> anyhow::Result<String> {
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(server).await?;
        stream.write_all(word.as_bytes()).await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        anyhow::Ok(answer)
    };
    tokio::time::timeout(TIMEOUT, ask)
        .await
        .with_context(|| format!("{server} did not answer {word} within {TIMEOUT:?}"))?
        .with_context(|| format!("asking {server} {word}"))
}

/// `text` with its `%XX` escapes decoded (a user name or password in a URL); an escape that is not one stays as it is.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| text.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_names_the_servers_the_chroot_and_the_credentials() {
        let zk = Zk::parse("zk://app:s%40cret@10.0.0.1:2182,10.0.0.2/apps/billing/").unwrap();
        assert_eq!(zk.servers, ["10.0.0.1:2182", "10.0.0.2:2181"]);
        assert_eq!(zk.servers(), 2);
        assert_eq!(zk.chroot, "/apps/billing");
        assert_eq!(zk.digest.as_deref(), Some("app:s@cret"));
        let plain = Zk::parse("zk://127.0.0.1:2181").unwrap();
        assert_eq!((plain.chroot.as_str(), plain.digest), ("", None));
        assert!(Zk::parse("etcd://127.0.0.1:2379").is_none());
    }
}
