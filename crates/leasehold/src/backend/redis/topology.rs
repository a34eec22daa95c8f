//! Where a client's locks live: one Redis server, or a Redis Cluster.
//!
//! Everything that differs between the two is decided here or by a `match` on [`Target`]:
//! - **where a key lives**: every key of one lock is in one slot (`P:{N}`, the name is the hash tag), so every
//!   script runs on the node that owns the lock; on a cluster, calls that carry several locks (coalesced acquires and
//!   releases, renewal batches) make one script call per slot, the calls of one node in one pipeline
//!   ([`crate::backend::redis::conn::Conn::invoke_by_node`]);
//! - **how a call is made**: through a connection manager to the one server, or through redis-rs's cluster
//!   connection, which follows `MOVED`/`ASK` and retries `TRYAGAIN`; either way each call is bounded by the client's
//!   own response timeout ([`crate::backend::redis::conn`]);
//! - **how a waiter hears back**: a channel per client (`PUBLISH`) on one server; a sharded channel per lock and
//!   client in the lock's own slot (`SPUBLISH`) on a cluster ([`crate::backend::redis::wake`], `notify` in `grant.lua`).

use std::sync::Arc;
use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::{ConnectionInfo, IntoConnectionInfo, ProtocolVersion};

use crate::backend::redis::sentinel::{Followed, Sentinel, SENTINEL_SCHEME, SENTINEL_TLS_SCHEME};
use crate::error::InvalidArgument;

/// The scheme of a Redis Cluster URL, `redis+cluster://host:port,host:port`; `rediss+cluster://` for TLS.
pub(crate) const CLUSTER_SCHEME: &str = "redis+cluster://";
pub(crate) const CLUSTER_TLS_SCHEME: &str = "rediss+cluster://";

/// How many times the cluster client retries a request that met `TRYAGAIN`, `MOVED` to a node it cannot reach yet,
/// or a dropped connection, inside the client's response timeout.
const CLUSTER_RETRIES: u32 = 4;
/// The bounds of the cluster client's wait between retries, in ms: short, so that a `TRYAGAIN` during a slot
/// migration is retried within one response timeout (redis-rs waits seconds by default).
const CLUSTER_RETRY_MIN_MS: u64 = 10;
const CLUSTER_RETRY_MAX_MS: u64 = 200;

/// The servers a builder names, before connecting.
pub(crate) enum Endpoint {
    /// One server (a standalone Redis, or a primary you address directly).
    Single(redis::Client),
    /// A Redis Cluster, reached through these seed nodes (every node the caller named: a cluster client seeded with
    /// one node cannot start while that node is down).
    Cluster(Cluster),
    /// A primary that Redis Sentinel manages: which one is found when connecting.
    Sentinel(Sentinel),
}

/// The servers a connected client talks to.
#[derive(Clone)]
pub(crate) enum Target {
    /// One server.
    Single(redis::Client),
    /// A Redis Cluster.
    Cluster(Cluster),
    /// The primary the sentinels name now, followed across failovers.
    Followed(Arc<Followed>),
}

/// A Redis Cluster's seed nodes and the settings every connection to it uses.
#[derive(Clone)]
pub(crate) struct Cluster {
    pub(crate) seeds: Vec<ConnectionInfo>,
    pub(crate) connection_timeout: Duration,
    pub(crate) response_timeout: Duration,
    #[cfg(feature = "tls")]
    pub(crate) certs: Option<redis::TlsCertificates>,
}

impl Endpoint {
    /// Parses a URL: a cluster URL, a sentinel URL, or any URL redis-rs accepts for one server.
    pub(crate) fn parse(url: &str) -> Result<Endpoint, InvalidArgument> {
        let trimmed = url.trim();
        let tls = trimmed.starts_with(CLUSTER_TLS_SCHEME);
        if tls || trimmed.starts_with(CLUSTER_SCHEME) {
            return Ok(Endpoint::Cluster(Cluster::new(cluster_seeds(trimmed)?)?));
        }
        if trimmed.starts_with(SENTINEL_SCHEME) || trimmed.starts_with(SENTINEL_TLS_SCHEME) {
            if cfg!(not(feature = "tls")) && trimmed.starts_with(SENTINEL_TLS_SCHEME) {
                return Err(InvalidArgument::BadUrl(
                    "rediss+sentinel:// (TLS) needs leasehold's `tls` feature".to_owned(),
                ));
            }
            return Ok(Endpoint::Sentinel(Sentinel::parse(trimmed)?));
        }
        if cfg!(not(feature = "tls")) && trimmed.starts_with("rediss://") {
            return Err(InvalidArgument::BadUrl(
                "rediss:// (TLS) needs leasehold's `tls` feature".to_owned(),
            ));
        }
        // The URL is not repeated in the error: it may carry a password.
        redis::Client::open(url).map(Endpoint::Single).map_err(|e| {
            InvalidArgument::BadUrl(format!("{}; {ACCEPTED_URLS}", url_problem(trimmed, &e)))
        })
    }
}

/// The URL forms leasehold accepts, as its URL errors list them.
pub(crate) const ACCEPTED_URLS: &str = "accepted forms: redis://[user[:password]@]host[:port][/db], rediss://… (TLS), \
     unix:///path/to/socket, redis+cluster://host:port,host:port,…, redis+sentinel://host:port,host:port/service";

/// What is wrong with `url`, which redis-rs refused with `err`, in words that do not repeat the URL.
fn url_problem(url: &str, err: &redis::RedisError) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "it has no scheme (redis://, say)".to_owned();
    };
    let known = ["redis", "rediss", "unix", "redis+unix"];
    if !known.contains(&scheme.to_ascii_lowercase().as_str()) {
        return format!("the scheme {scheme:?} is not one leasehold knows");
    }
    if rest.trim().is_empty() {
        return "it names no server".to_owned();
    }
    // redis-rs says "Redis URL did not parse - InvalidClientConfig": the part before the kind is the useful one.
    let said = err.to_string();
    let said = said.split(" - ").next().unwrap_or(&said).to_owned();
    if said == "Redis URL did not parse" {
        "it does not parse as a URL (check the host, a numeric port, and that special characters in the password are \
         percent-encoded)"
            .to_owned()
    } else {
        format!("{} ({said})", "it does not parse")
    }
}

impl Endpoint {
    /// The URL these servers are reached at, as messages show it (password hidden, see [`redacted_url`]).
    pub(crate) fn redacted_url(&self) -> String {
        // `scheme://[user:***@]host:port,host:port…tail`: the credentials once, as the URL gives them.
        let joined = |scheme: &str, infos: &[ConnectionInfo], tail: &str| {
            let mut user = String::new();
            let mut hosts = Vec::new();
            for info in infos {
                let url = redacted_url(info);
                let rest = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
                match rest.rsplit_once('@') {
                    Some((credentials, host)) => {
                        user = format!("{credentials}@");
                        hosts.push(host.to_owned());
                    }
                    None => hosts.push(rest.to_owned()),
                }
            }
            format!("{scheme}://{user}{}{tail}", hosts.join(","))
        };
        match self {
            Endpoint::Single(redis) => redacted_url(redis.get_connection_info()),
            Endpoint::Cluster(cluster) => joined(
                if cluster
                    .seeds
                    .iter()
                    .any(|i| matches!(i.addr(), redis::ConnectionAddr::TcpTls { .. }))
                {
                    "rediss+cluster"
                } else {
                    "redis+cluster"
                },
                &cluster.seeds,
                "",
            ),
            Endpoint::Sentinel(sentinel) => {
                let tls = matches!(sentinel.data.addr(), redis::ConnectionAddr::TcpTls { .. });
                joined(
                    if tls {
                        "rediss+sentinel"
                    } else {
                        "redis+sentinel"
                    },
                    &sentinel.sentinels,
                    &format!("/{}", sentinel.service),
                )
            }
        }
    }
}

impl Target {
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Target::Cluster(_))
    }

    /// The prefix of the wake-up channels of a client whose keys are under `prefix` (the `ARGV` every script that
    /// grants takes; see `notify` in `grant.lua`):
    /// - one server: `P:wake:`; a client's channel is `P:wake:<id>`, and `PUBLISH`'s count proves a waiter gone;
    /// - Sentinel: `P:wake:=`; the trailing `=` tells the scripts not to trust the count, because a subscriber may
    ///   still sit on a demoted primary, which receives the new primary's messages through replication;
    /// - a cluster: empty; the channel is per lock, `P:{N}:wake:<id>`, in the lock's slot (`SPUBLISH`).
    pub(crate) fn channel_prefix(&self, prefix: &str) -> String {
        match self {
            Target::Cluster(_) => String::new(),
            Target::Followed(_) => format!("{prefix}:wake:="),
            Target::Single(_) => format!("{prefix}:wake:"),
        }
    }
}

impl Cluster {
    /// A cluster reached through `seeds`, each a one-server URL (`redis://host:port`, `rediss://…`).
    pub(crate) fn new<I, U>(seeds: I) -> Result<Cluster, InvalidArgument>
    where
        I: IntoIterator<Item = U>,
        U: AsRef<str>,
    {
        let mut infos = Vec::new();
        for seed in seeds {
            let seed = seed.as_ref().trim();
            if cfg!(not(feature = "tls")) && seed.starts_with("rediss://") {
                return Err(InvalidArgument::BadUrl(
                    "rediss:// (TLS) needs leasehold's `tls` feature".to_owned(),
                ));
            }
            let info = seed
                .into_connection_info()
                .map_err(|e| InvalidArgument::BadUrl(format!("a cluster seed: {e}")))?;
            if !matches!(
                info.addr(),
                redis::ConnectionAddr::Tcp(..) | redis::ConnectionAddr::TcpTls { .. }
            ) {
                return Err(InvalidArgument::BadUrl(
                    "a cluster seed must be a TCP address (host:port)".to_owned(),
                ));
            }
            infos.push(info);
        }
        if infos.is_empty() {
            return Err(InvalidArgument::BadUrl(
                "a cluster needs at least one seed node".to_owned(),
            ));
        }
        Ok(Cluster {
            seeds: infos,
            connection_timeout: crate::backend::DEFAULT_CONNECTION_TIMEOUT,
            response_timeout: crate::backend::DEFAULT_RESPONSE_TIMEOUT,
            #[cfg(feature = "tls")]
            certs: None,
        })
    }

    /// A cluster reached through one node, `seed` (a `redis://` URL that turned out to name a cluster node).
    pub(crate) fn from_seed(
        seed: ConnectionInfo,
        connection_timeout: Duration,
        response_timeout: Duration,
    ) -> Cluster {
        Cluster {
            seeds: vec![seed],
            connection_timeout,
            response_timeout,
            #[cfg(feature = "tls")]
            certs: None,
        }
    }

    /// A cluster client with this cluster's settings; with RESP3 and `push` as its push sender when given (sharded
    /// subscriptions need both).
    pub(crate) fn client(
        &self,
        push: Option<tokio::sync::mpsc::UnboundedSender<redis::PushInfo>>,
    ) -> redis::RedisResult<ClusterClient> {
        let mut builder = ClusterClientBuilder::new(self.seeds.clone())
            .connection_timeout(self.connection_timeout)
            .response_timeout(self.response_timeout)
            .overall_response_timeout(Some(self.response_timeout))
            .retries(CLUSTER_RETRIES)
            .min_retry_wait(CLUSTER_RETRY_MIN_MS)
            .max_retry_wait(CLUSTER_RETRY_MAX_MS);
        #[cfg(feature = "tls")]
        if let Some(certs) = &self.certs {
            builder = builder.certs(certs.clone());
        }
        if let Some(push) = push {
            builder = builder
                .use_protocol(ProtocolVersion::RESP3)
                .push_sender(push);
        }
        builder.build()
    }

    /// Whether the seeds use TLS.
    #[cfg(feature = "tls")]
    pub(crate) fn uses_tls(&self) -> bool {
        self.seeds
            .iter()
            .all(|info| matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }))
    }
}

/// The URL of the server `info` reaches, as messages show it: the password replaced by `***`
/// (`redis://app:***@10.0.0.1:6379/2`, `rediss://…`, `unix:///run/redis.sock`). Built from the parsed settings, never
/// from the text the caller gave, so that no form of password can slip through.
pub(crate) fn redacted_url(info: &ConnectionInfo) -> String {
    let (scheme, place) = match info.addr() {
        redis::ConnectionAddr::Tcp(host, port) => ("redis", format!("{}:{port}", bracketed(host))),
        redis::ConnectionAddr::TcpTls { host, port, .. } => {
            ("rediss", format!("{}:{port}", bracketed(host)))
        }
        redis::ConnectionAddr::Unix(path) => ("unix", path.display().to_string()),
        _ => ("redis", "?".to_owned()),
    };
    let settings = info.redis_settings();
    if scheme == "unix" {
        // The form redis-rs reads for sockets: `unix:///path?db=1&user=u&pass=p`.
        let mut query = Vec::new();
        if settings.db() != 0 {
            query.push(format!("db={}", settings.db()));
        }
        if let Some(user) = settings.username() {
            query.push(format!("user={user}"));
        }
        if settings.password().is_some() {
            query.push("pass=***".to_owned());
        }
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{}", query.join("&"))
        };
        return format!("unix://{place}{query}");
    }
    let user = match (settings.username(), settings.password()) {
        (Some(user), Some(_)) => format!("{user}:***@"),
        (None, Some(_)) => ":***@".to_owned(),
        (Some(user), None) => format!("{user}@"),
        (None, None) => String::new(),
    };
    let db = match settings.db() {
        0 => String::new(),
        db => format!("/{db}"),
    };
    format!("{scheme}://{user}{place}{db}")
}

/// The cluster URL (`redis+cluster://`, `rediss+cluster://`) with `info`'s server as its seed, password hidden.
pub(crate) fn cluster_url(info: &ConnectionInfo) -> String {
    let single = redacted_url(info);
    match single.split_once("://") {
        Some((scheme, rest)) => format!("{scheme}+cluster://{rest}"),
        None => single,
    }
}

/// An IPv6 address in brackets, as URLs write it.
fn bracketed(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

/// The seed URLs of a cluster URL: `redis+cluster://[user[:password]@]h1:p1,h2:p2[/db][?query]` becomes
/// `redis://[user[:password]@]h1:p1[/db][?query]`, … (`rediss://` for `rediss+cluster://`).
fn cluster_seeds(url: &str) -> Result<Vec<String>, InvalidArgument> {
    let (scheme, rest) = if let Some(rest) = url.strip_prefix(CLUSTER_TLS_SCHEME) {
        ("rediss://", rest)
    } else if let Some(rest) = url.strip_prefix(CLUSTER_SCHEME) {
        ("redis://", rest)
    } else {
        return Err(InvalidArgument::BadUrl(
            "not a redis+cluster:// URL".to_owned(),
        ));
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (credentials, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let mut seeds = Vec::new();
    for host in hosts.split(',') {
        let host = host.trim();
        if host.is_empty() {
            return Err(InvalidArgument::BadUrl(
                "a redis+cluster:// URL lists an empty host (write host:port,host:port)".to_owned(),
            ));
        }
        seeds.push(format!("{scheme}{credentials}{host}{tail}"));
    }
    Ok(seeds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_url_names_every_seed_with_the_shared_credentials() {
        assert_eq!(
            cluster_seeds("redis+cluster://u:p@a:1,b:2/0").unwrap(),
            ["redis://u:p@a:1/0", "redis://u:p@b:2/0"]
        );
        assert_eq!(
            cluster_seeds("rediss+cluster://a:1,b:2?insecure").unwrap(),
            ["rediss://a:1?insecure", "rediss://b:2?insecure"]
        );
        // A password may hold an `@`: the last one ends the credentials.
        assert_eq!(
            cluster_seeds("redis+cluster://:p@ss@h:7000").unwrap(),
            ["redis://:p@ss@h:7000"]
        );
        assert!(cluster_seeds("redis+cluster://a:1,,b:2").is_err());
        assert!(cluster_seeds("redis+cluster://").is_err());
    }

    #[test]
    fn cluster_urls_parse_into_seeds_and_others_into_one_server() {
        let Ok(Endpoint::Cluster(cluster)) =
            Endpoint::parse("redis+cluster://127.0.0.1:7000,h:7001")
        else {
            panic!("a cluster URL");
        };
        assert_eq!(cluster.seeds.len(), 2);
        assert!(matches!(
            Endpoint::parse("redis://127.0.0.1:6379"),
            Ok(Endpoint::Single(_))
        ));
        assert!(matches!(
            Endpoint::parse("redis+cluster://127.0.0.1"),
            Ok(Endpoint::Cluster(_))
        ));
        assert!(matches!(
            Endpoint::parse("redis+cluster://unix:/x"),
            Err(InvalidArgument::BadUrl(_))
        ));
    }

    #[test]
    fn urls_in_messages_never_show_a_password() {
        let shown = |url: &str| redacted_url(&url.into_connection_info().unwrap());
        assert_eq!(shown("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(
            shown("redis://app:hunter2@h:7000/2"),
            "redis://app:***@h:7000/2"
        );
        assert_eq!(shown("redis://:hunter2@h"), "redis://:***@h:6379");
        assert_eq!(shown("redis://app@h:1"), "redis://app@h:1");
        assert_eq!(
            shown("unix:///tmp/r.sock?db=1&pass=hunter2&user=u"),
            "unix:///tmp/r.sock?db=1&user=u&pass=***"
        );
        assert_eq!(shown("redis://[::1]:7000"), "redis://[::1]:7000");
        let info = "redis://app:hunter2@h:7000".into_connection_info().unwrap();
        assert_eq!(cluster_url(&info), "redis+cluster://app:***@h:7000");
        let Ok(endpoint) = Endpoint::parse("redis+cluster://u:hunter2@a:1,b:2") else {
            panic!("a cluster URL");
        };
        assert_eq!(endpoint.redacted_url(), "redis+cluster://u:***@a:1,b:2");
    }
}
