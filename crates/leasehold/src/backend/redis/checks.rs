//! What a client checks about its server when it connects: that it may publish wake-ups (an ACL user without
//! channel permissions would silently degrade every wait and fail every release with waiters), and whether the
//! server may evict keys (which can hand a held lock to a second owner).

use std::fmt;

use redis::Value;

use crate::backend::redis::conn::Conn;
use crate::backend::redis::scripts::PROBE;
use crate::backend::redis::topology::Target;
use crate::engine::keys::LockKeys;
use crate::error::Error;

/// The tracing target of this file's events: the module path it had before the files moved into folders, so that
/// log filters keep working (`leasehold::checks=debug`).
const TARGET: &str = "leasehold::checks";

/// Something about the server that weakens the [safety contract](crate#safety-contract), found when the client
/// connected. Each one is also logged with `tracing::warn!`; see [`Client::server_warnings`](crate::Client::server_warnings).
///
/// With the `serde` feature it implements `Serialize` and `Deserialize`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum ServerWarning {
    /// `maxmemory` is set with a policy that evicts keys (`allkeys-*` or `volatile-*`): under memory pressure Redis
    /// may evict a held lock's key, and a second owner is then granted the lock while the first still holds it. Use
    /// `maxmemory-policy noeviction`, or a Redis that is not also a cache.
    Eviction {
        /// The server's `maxmemory-policy`.
        policy: String,
        /// The server's `maxmemory`, in bytes.
        maxmemory: u64,
    },
}

impl fmt::Display for ServerWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerWarning::Eviction { policy, maxmemory } => write!(
                f,
                "the server may evict keys (maxmemory {maxmemory} bytes, maxmemory-policy {policy}): a held lock \
                 can be evicted and granted to a second owner; use maxmemory-policy noeviction"
            ),
        }
    }
}

/// Checks that this client may publish wake-ups (harmless: nobody listens on the channel): `PUBLISH` on its own
/// channel `PREFIX:wake:<id>` on one server, `SPUBLISH` on a lock's sharded channel `PREFIX:{N}:wake:<id>` on a
/// cluster.
///
/// # Errors
///
/// [`Error::NotPermitted`] when the server refuses it (an ACL user without the channel pattern or the command),
/// naming what is missing; [`Error::Redis`] for anything else.
pub(crate) async fn check_publish(
    conn: &Conn,
    target: &Target,
    prefix: &str,
    client_id: &str,
) -> Result<(), Error> {
    let (command, channel, pattern) = if target.is_cluster() {
        let keys = LockKeys::new(prefix, "leasehold-connect-check")?;
        (
            "SPUBLISH",
            format!("{}:wake:{client_id}", keys.lock),
            format!("{prefix}:*"),
        )
    } else {
        (
            "PUBLISH",
            format!("{}{client_id}", target.channel_prefix(prefix)),
            format!("{prefix}:wake:*"),
        )
    };
    let reply: redis::RedisResult<Value> = redis::cmd(command)
        .arg(&channel)
        .arg("")
        .query_async(&mut conn.clone())
        .await;
    match reply {
        Ok(_) => Ok(()),
        Err(err) if is_noperm(&err) => {
            // Redis names what is missing: the command ("no permissions to run the 'publish' command") or the
            // channel ("… to access one of the channels used as arguments").
            let lower = command.to_ascii_lowercase();
            let detail = if err.to_string().contains(&format!("'{lower}' command")) {
                format!(
                    "this Redis user may not run {command}: grant the command \"+{lower}\" (the README lists the \
                     whole ACL rule)"
                )
            } else {
                format!(
                    "this Redis user may not publish on {channel:?}: grant the channel pattern \"&{pattern}\" (the \
                     README lists the whole ACL rule)"
                )
            };
            Err(Error::NotPermitted {
                detail,
                source: Some(err),
            })
        }
        Err(err) => Err(err.into()),
    }
}

/// Checks that this client may run leasehold's scripts on its lock keys, with the probe script (which runs nothing:
/// the server checks the permissions before it would).
///
/// # Errors
///
/// [`Error::NotPermitted`] when the server refuses it (an ACL user whose key pattern does not cover `PREFIX:*`, or
/// without `+evalsha`, `+script|load`, or a command the script runs), naming what is missing; [`Error::Redis`] for
/// anything else.
pub(crate) async fn check_keys(conn: &Conn, prefix: &str) -> Result<(), Error> {
    let keys = LockKeys::new(prefix, "leasehold-connect-check")?;
    let reply: redis::RedisResult<Value> =
        PROBE.key(&keys.lock).invoke_async(&mut conn.clone()).await;
    match reply {
        Ok(_) => Ok(()),
        Err(err) if is_noperm(&err) => {
            let text = err.to_string();
            let detail = if text.contains("'evalsha' command") {
                "this Redis user may not run EVALSHA: grant \"+evalsha\" (the README lists the whole ACL rule)"
                    .to_owned()
            } else if text.contains("'script") {
                "this Redis user may not load scripts: grant \"+script|load\" (the README lists the whole ACL rule)"
                    .to_owned()
            } else if text.contains(" key") {
                // Redis 7.0 says "one of the keys used as arguments", Valkey 9 "a key".
                format!(
                    "this Redis user may not access the lock keys under {prefix:?}: grant the key pattern \"~{prefix}:*\" \
                     (the README lists the whole ACL rule)"
                )
            } else {
                format!("this Redis user lacks a permission leasehold needs ({text}; the README lists the whole ACL rule)")
            };
            Err(Error::NotPermitted {
                detail,
                source: Some(err),
            })
        }
        Err(err) => Err(err.into()),
    }
}

/// Whether the server `conn` reaches (as one server) is a Redis Cluster node: `INFO cluster` says
/// `cluster_enabled:1`. A Redis user that may not run `INFO` is asked `CLUSTER SLOTS` instead (the README's cluster
/// rule grants it); one that may run neither is taken for one server, and meets [`Error::ClusterNode`] at its first
/// lock whose key another node serves.
///
/// # Errors
///
/// [`Error::Redis`] when the server cannot be asked.
pub(crate) async fn is_cluster_node(conn: &Conn) -> Result<bool, Error> {
    let info: redis::RedisResult<String> = redis::cmd("INFO")
        .arg("cluster")
        .query_async(&mut conn.clone())
        .await;
    match info {
        Ok(info) => return Ok(info.lines().any(|line| line.trim() == "cluster_enabled:1")),
        Err(err) if !is_noperm(&err) => return Err(err.into()),
        Err(_) => {}
    }
    let slots: redis::RedisResult<Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut conn.clone())
        .await;
    match slots {
        Ok(_) => Ok(true),
        Err(err) if is_noperm(&err) => {
            tracing::debug!(target: TARGET, "INFO and CLUSTER SLOTS refused; taking the server for a single one");
            Ok(false)
        }
        // "ERR This instance has cluster support disabled", or an older server without CLUSTER.
        Err(err) if err.code().is_some() => Ok(false),
        Err(err) => Err(err.into()),
    }
}

/// What a failed connection most likely means, when the error tells: another service on the port, a TLS server
/// reached without TLS, a client certificate that rustls refuses because it is not X.509 v3.
pub(crate) fn connect_hint(err: &redis::RedisError, uses_tls: bool) -> Option<String> {
    let text = error_text(err);
    if err.kind() == redis::ErrorKind::Parse {
        return Some(
            "the server there did not answer as Redis does: is another service (HTTP, say) on that port?"
                .to_owned(),
        );
    }
    if text.contains("UnsupportedCertVersion") {
        return Some(
            "a certificate is not X.509 v3, which TLS needs: make the client certificate v3, for example with \
             `openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 -extfile \
             <(printf 'basicConstraints=CA:FALSE\\nkeyUsage=digitalSignature\\nextendedKeyUsage=clientAuth') \
             -out client.crt`"
                .to_owned(),
        );
    }
    if text.contains("CertificateRequired") {
        return Some(
            "the server requires a client certificate (tls-auth-clients): give one and its key"
                .to_owned(),
        );
    }
    let reset = matches!(
        io_kind(err),
        Some(
            std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::UnexpectedEof
        )
    ) || err.is_connection_dropped();
    if reset && !uses_tls && !err.is_connection_refusal() {
        return Some(
            "the server closed the connection at the first exchange: if it expects TLS, use rediss://".to_owned(),
        );
    }
    None
}

/// The texts of `err` and every error under it, joined.
fn error_text(err: &redis::RedisError) -> String {
    let mut text = String::new();
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(cause) = next {
        text.push_str(&format!("{cause:?} {cause} "));
        next = cause.source();
    }
    text
}

/// The kind of the I/O error under `err`, if there is one.
fn io_kind(err: &redis::RedisError) -> Option<std::io::ErrorKind> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(cause) = next {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        next = cause.source();
    }
    None
}

pub(crate) fn is_noperm(err: &redis::RedisError) -> bool {
    err.code() == Some("NOPERM") || err.to_string().contains("NOPERM")
}

/// What the one `INFO` a client sends when it connects says about the server (every node of a cluster).
pub(crate) struct ServerFacts {
    /// What weakens the contract (each one also logged).
    pub(crate) warnings: Vec<ServerWarning>,
    /// Whether every node can run `WAITAOF` ([`Capability::ReplicasOnDisk`](crate::Capability::ReplicasOnDisk)): Redis
    /// 7.2 or later with the append-only file on. `Err` says why not.
    pub(crate) waitaof: Result<(), String>,
}

/// Reads `INFO` (its default sections, which hold `memory`, `server` and `persistence` on every version) once, for
/// [`ServerFacts`]. A server that refuses `INFO` (an ACL user without it) is not checked: no warning, no `WAITAOF`,
/// and the refusal is returned beside, for a client that needs `WAITAOF`.
pub(crate) async fn server_facts(conn: &Conn) -> (ServerFacts, Option<Error>) {
    let info: redis::RedisResult<Value> = redis::cmd("INFO").query_async(&mut conn.clone()).await;
    let info = match info {
        Ok(info) => info,
        Err(err) => {
            tracing::debug!(target: TARGET, error = %err, "INFO refused; the eviction policy and WAITAOF are not checked");
            let facts = ServerFacts {
                warnings: Vec::new(),
                waitaof: Err(format!(
                    "the server refused INFO, so WAITAOF could not be checked ({err})"
                )),
            };
            return (facts, Some(Error::from(err)));
        }
    };
    // One server answers with its text; a cluster connection asks every node and answers with a map of texts.
    let mut warnings: Vec<ServerWarning> = Vec::new();
    let mut waitaof = Ok(());
    for text in node_texts(info) {
        if let Some(warning) = eviction(&text) {
            if !warnings.contains(&warning) {
                warnings.push(warning);
            }
        }
        if waitaof.is_ok() {
            waitaof = can_waitaof(&text);
        }
    }
    for warning in &warnings {
        tracing::warn!(target: TARGET, "{warning}");
    }
    (ServerFacts { warnings, waitaof }, None)
}

/// Whether the server whose `INFO` is `info` can run `WAITAOF`: `redis_version` 7.2 or later and `aof_enabled`.
fn can_waitaof(info: &str) -> Result<(), String> {
    let version = field(info, "redis_version").unwrap_or_default();
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if (major, minor) < (7, 2) {
        return Err(format!(
            "it needs WAITAOF, which Redis {version} lacks (it came with 7.2)"
        ));
    }
    if field(info, "aof_enabled").as_deref() != Some("1") {
        return Err("it needs the append-only file (appendonly yes)".to_owned());
    }
    Ok(())
}

/// The value of the field `name` in an `INFO` text.
fn field(info: &str, name: &str) -> Option<String> {
    info.lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.trim().to_owned())
}

/// The texts of an `INFO` reply: one server's, or every node's when a cluster connection asked them all.
fn node_texts(info: Value) -> Vec<String> {
    match info {
        Value::Map(nodes) => nodes
            .into_iter()
            .filter_map(|(_, text)| redis::from_redis_value(text).ok())
            .collect(),
        other => redis::from_redis_value(other).into_iter().collect(),
    }
}

/// The eviction warning for a server whose `INFO` is `info`, if it may evict keys.
fn eviction(info: &str) -> Option<ServerWarning> {
    let field = |name: &str| field(info, name);
    let maxmemory = field("maxmemory")
        .and_then(|m| m.parse::<u64>().ok())
        .unwrap_or(0);
    let policy = field("maxmemory_policy").unwrap_or_default();
    (maxmemory > 0 && (policy.starts_with("allkeys-") || policy.starts_with("volatile-")))
        .then_some(ServerWarning::Eviction { policy, maxmemory })
}
