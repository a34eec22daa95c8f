//! What a client checks about its server when it connects: that it may publish wake-ups (an ACL user without
//! channel permissions would silently degrade every wait and fail every release with waiters), and whether the
//! server may evict keys (which can hand a held lock to a second owner).

use std::fmt;

use redis::Value;

use crate::conn::Conn;
use crate::error::Error;
use crate::keys::LockKeys;
use crate::scripts::PROBE;
use crate::topology::Target;

/// Something about the server that weakens the [safety contract](crate#safety-contract), found when the client
/// connected. Each one is also logged with `tracing::warn!`; see [`Client::server_warnings`](crate::Client::server_warnings).
#[derive(Debug, Clone, PartialEq, Eq)]
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
                source: err,
            })
        }
        Err(err) => Err(Error::Redis(err)),
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
                source: err,
            })
        }
        Err(err) => Err(Error::Redis(err)),
    }
}

fn is_noperm(err: &redis::RedisError) -> bool {
    err.code() == Some("NOPERM") || err.to_string().contains("NOPERM")
}

/// Checks that every node the connection reaches can run `WAITAOF`: Redis 7.2 or later, with the append-only file
/// on (`INFO server`'s `redis_version`, `INFO persistence`'s `aof_enabled`).
///
/// # Errors
///
/// [`Error::Unsupported`] naming what is missing; [`Error::Redis`] when the server cannot be asked.
pub(crate) async fn check_waitaof(conn: &Conn) -> Result<(), Error> {
    let info: Value = redis::cmd("INFO")
        .arg("server")
        .arg("persistence")
        .query_async(&mut conn.clone())
        .await
        .map_err(Error::Redis)?;
    for text in node_texts(info) {
        let field = |name: &str| {
            text.lines()
                .filter_map(|line| line.split_once(':'))
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.trim().to_owned())
        };
        let version = field("redis_version").unwrap_or_default();
        let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        if (major, minor) < (7, 2) {
            return Err(Error::Unsupported {
                detail: format!(
                    "replicas_on_disk needs WAITAOF, which Redis {version} lacks (it came with 7.2)"
                ),
            });
        }
        if field("aof_enabled").as_deref() != Some("1") {
            return Err(Error::Unsupported {
                detail: "replicas_on_disk needs the append-only file (appendonly yes)".to_owned(),
            });
        }
    }
    Ok(())
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

/// Reads `INFO memory` and returns what weakens the contract. A server that refuses `INFO` (an ACL user without
/// it) is not checked.
pub(crate) async fn server_warnings(conn: &Conn) -> Vec<ServerWarning> {
    let info: redis::RedisResult<Value> = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut conn.clone())
        .await;
    let info = match info {
        Ok(info) => info,
        Err(err) => {
            tracing::debug!(error = %err, "INFO memory refused; the eviction policy is not checked");
            return Vec::new();
        }
    };
    // One server answers with its text; a cluster connection asks every node and answers with a map of texts.
    let mut warnings: Vec<ServerWarning> = Vec::new();
    for text in node_texts(info) {
        if let Some(warning) = eviction(&text) {
            if !warnings.contains(&warning) {
                warnings.push(warning);
            }
        }
    }
    for warning in &warnings {
        tracing::warn!("{warning}");
    }
    warnings
}

/// The eviction warning for a server whose `INFO memory` is `info`, if it may evict keys.
fn eviction(info: &str) -> Option<ServerWarning> {
    let field = |name: &str| {
        info.lines()
            .filter_map(|line| line.split_once(':'))
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.trim().to_owned())
    };
    let maxmemory = field("maxmemory")
        .and_then(|m| m.parse::<u64>().ok())
        .unwrap_or(0);
    let policy = field("maxmemory_policy").unwrap_or_default();
    (maxmemory > 0 && (policy.starts_with("allkeys-") || policy.starts_with("volatile-")))
        .then_some(ServerWarning::Eviction { policy, maxmemory })
}
