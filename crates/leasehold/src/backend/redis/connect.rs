//! Connecting a Redis client: the [`Builder`](crate::Builder)'s Redis settings checked, the endpoint resolved (TLS
//! applied, a cluster node behind a `redis://` URL recognised, Sentinel's primary followed), the command connection
//! opened, and what the server must allow checked before the first lock (see `checks.rs`).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManagerConfig;

use crate::backend::redis::batch::Coalescer;
use crate::backend::redis::checks::{check_keys, check_publish, server_facts};
use crate::backend::redis::conn::{Conn, ReplicaAcks};
use crate::backend::redis::orphans::Orphans;
use crate::backend::redis::sentinel::Followed;
use crate::backend::redis::store::RedisStore;
use crate::backend::redis::topology::{Cluster, Endpoint, Target};
use crate::backend::redis::wake::Wakeups;
use crate::capability::{refusal, Capability, StoreKind};
use crate::engine::keeper::Keeper;
use crate::error::{Error, InvalidArgument};
use crate::fence::new_token;

/// The tracing target of this file's events: the module they came from, so that log filters keep working
/// (`leasehold::client=info`).
const TARGET: &str = "leasehold::client";

/// What a [`Builder`](crate::Builder) gives a Redis client besides its endpoint: every Redis setting, as the caller
/// set it (checked by [`connect`]).
pub(crate) struct Settings {
    /// A connection of the caller's own ([`Builder::connection`](crate::Builder::connection)).
    pub(crate) conn: Option<Conn>,
    pub(crate) prefix: String,
    pub(crate) connection_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) fence_retention: Duration,
    pub(crate) replicas: u32,
    pub(crate) replica_timeout: Option<Duration>,
    pub(crate) on_disk: bool,
    pub(crate) sentinel_auth: Option<(Option<String>, String)>,
    #[cfg(feature = "tls")]
    pub(crate) tls: crate::backend::tls::TlsSettings,
}

/// Checks `settings` and connects to `target`: the Redis side of [`Builder::connect`](crate::Builder::connect), whose
/// errors it returns.
pub(crate) async fn connect(
    target: Endpoint,
    settings: Settings,
) -> Result<Arc<RedisStore>, Error> {
    if settings.fence_retention < Duration::from_secs(1) {
        return Err(InvalidArgument::BadDuration {
            what: "fence retention",
            value: settings.fence_retention,
            why: "must be at least 1s",
        }
        .into());
    }
    if settings.sentinel_auth.is_some() && !matches!(target, Endpoint::Sentinel(_)) {
        return Err(InvalidArgument::BadUrl(
            "sentinel credentials were given for a URL that is not redis+sentinel://".to_owned(),
        )
        .into());
    }
    let replicas = match (settings.replicas, settings.on_disk) {
        (0, false) => None,
        (count, on_disk) => {
            let timeout = settings
                .replica_timeout
                .unwrap_or(settings.response_timeout / 4);
            if timeout.is_zero() || timeout >= settings.response_timeout {
                return Err(InvalidArgument::BadDuration {
                    what: "replica timeout",
                    value: timeout,
                    why: "must be above zero and below the response timeout",
                }
                .into());
            }
            Some(ReplicaAcks {
                count,
                timeout,
                on_disk,
            })
        }
    };
    #[cfg(feature = "tls")]
    crate::backend::tls::ensure_crypto_provider();
    let endpoint = match target {
        #[cfg(feature = "tls")]
        Endpoint::Single(redis) => {
            Endpoint::Single(crate::backend::tls::apply(redis, &settings.tls)?)
        }
        #[cfg(not(feature = "tls"))]
        Endpoint::Single(redis) => Endpoint::Single(redis),
        Endpoint::Cluster(mut cluster) => {
            cluster.connection_timeout = settings.connection_timeout;
            cluster.response_timeout = settings.response_timeout;
            #[cfg(feature = "tls")]
            {
                cluster.certs = crate::backend::tls::checked(&settings.tls, cluster.uses_tls())?;
            }
            Endpoint::Cluster(cluster)
        }
        // Resolved (and followed) below, with the connection.
        Endpoint::Sentinel(mut sentinel) => {
            if let Some((username, password)) = &settings.sentinel_auth {
                sentinel.authenticate(username.as_deref(), password);
            }
            Endpoint::Sentinel(sentinel)
        }
    };
    // Connection failures name the server (password hidden) and, when leasehold can tell, what they mean.
    let url = endpoint.redacted_url();
    let uses_tls = url.starts_with("rediss");
    let failed = |err: Error| match err {
        Error::Redis(source) => Error::Connect {
            hint: crate::backend::redis::checks::connect_hint(&source, uses_tls),
            url: url.clone(),
            source,
        },
        other => other,
    };
    // Few retries per (re)connect: a request that fails triggers the next reconnect anyway, and the first connect
    // should report a refused or unreachable server at once, with its real cause.
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(settings.connection_timeout))
        .set_response_timeout(Some(settings.response_timeout))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_secs(1));
    let target = match endpoint {
        Endpoint::Single(redis) => Target::Single(redis),
        Endpoint::Cluster(cluster) => Target::Cluster(cluster),
        Endpoint::Sentinel(sentinel) => {
            let followed = Followed::connect(sentinel, config.clone(), settings.connection_timeout);
            Target::Followed(followed.await.map_err(|e| failed(e.into()))?)
        }
    };
    let within = settings.connection_timeout.saturating_mul(2);
    let (conn, target) = match (settings.conn, target) {
        (Some(conn), target) => (conn, target),
        (None, Target::Single(redis)) => {
            let db = redis.get_connection_info().redis_settings().db();
            let conn = match connect_single(&redis, config.clone(), within).await {
                Ok(conn) => conn,
                // The connection's SELECT was refused. Redis says "SELECT is not allowed in cluster mode"; Valkey
                // (whose cluster may have more databases) says "DB index is out of range", as a single server
                // does for a database it lacks: then database 0 tells whether this is a cluster node.
                Err(Error::Redis(err)) if db != 0 => {
                    if err.to_string().contains("cluster mode")
                        || selects_on_a_cluster_node(&redis, config, within).await
                    {
                        return Err(not_in_cluster(&url, db).into());
                    }
                    return Err(failed(Error::Redis(err)));
                }
                Err(err) => return Err(failed(err)),
            };
            // A `redis://` URL may name one node of a Redis Cluster (a managed cluster behind one endpoint, say):
            // then the cluster client takes over, with that node as its seed.
            if crate::backend::redis::checks::is_cluster_node(&conn)
                .await
                .map_err(failed)?
            {
                let info = redis.get_connection_info();
                if db != 0 {
                    return Err(not_in_cluster(&url, db).into());
                }
                tracing::info!(
                    target: TARGET,
                    "{url} is a Redis Cluster node; connecting to the cluster with it as the seed"
                );
                #[cfg_attr(not(feature = "tls"), allow(unused_mut))]
                let mut cluster = Cluster::from_seed(
                    info.clone(),
                    settings.connection_timeout,
                    settings.response_timeout,
                );
                #[cfg(feature = "tls")]
                {
                    cluster.certs =
                        crate::backend::tls::checked(&settings.tls, cluster.uses_tls())?;
                }
                let conn = connect_cluster(&cluster, within).await.map_err(failed)?;
                (conn, Target::Cluster(cluster))
            } else {
                (conn, Target::Single(redis))
            }
        }
        (None, Target::Cluster(cluster)) => {
            let conn = connect_cluster(&cluster, within).await.map_err(failed)?;
            (conn, Target::Cluster(cluster))
        }
        (None, Target::Followed(followed)) => (
            Conn::Followed(Arc::clone(&followed)),
            Target::Followed(followed),
        ),
    };
    // The checks below fail now, not at the first lock, when the server is unreachable or refuses us (the first
    // of them is the first request on the connection).
    // Identifies this client in lock queues; its wake-up channel is named after it.
    let client_id = new_token(None)?.split_off(crate::fence::TOKEN_PREFIX.len());
    check_publish(&conn, &target, &settings.prefix, &client_id)
        .await
        .map_err(failed)?;
    check_keys(&conn, &settings.prefix).await.map_err(failed)?;
    let (facts, refused) = server_facts(&conn).await;
    if replicas.is_some_and(|r| r.on_disk) {
        if let Some(refused) = refused {
            return Err(failed(refused));
        }
        // The refusal `Client::supports(Capability::ReplicasOnDisk)` would answer for.
        if let Err(why) = &facts.waitaof {
            return Err(refusal(
                Capability::ReplicasOnDisk,
                StoreKind::Redis,
                None,
                Some(why),
            ));
        }
    }
    let orphans = Orphans::new(
        target.clone(),
        settings.connection_timeout,
        settings.fence_retention,
    );
    let cluster = target.is_cluster();
    // The subscriber holds the client weakly: it releases grants that nobody here waits for any more.
    let inner = Arc::new_cyclic(|inner| RedisStore {
        wakeups: Wakeups::new(
            inner.clone(),
            target.clone(),
            &settings.prefix,
            client_id,
            settings.connection_timeout,
            settings.response_timeout,
        ),
        conn,
        target,
        replicas,
        // On one server a call may cover any locks; on a cluster it must stay within one slot.
        acquires: Coalescer::new(cluster),
        releases: Coalescer::new(cluster),
        set_acquires: Coalescer::new(cluster),
        waits: std::sync::atomic::AtomicU64::new(0),
        prefix: settings.prefix,
        fence_retention: settings.fence_retention,
        keeper: Arc::new(Keeper::new()),
        orphans,
        warnings: facts.warnings,
        waitaof: facts.waitaof,
    });
    Ok(inner)
}

/// A managed connection to one server, opened within `within`.
async fn connect_single(
    redis: &redis::Client,
    config: ConnectionManagerConfig,
    within: Duration,
) -> Result<Conn, Error> {
    match tokio::time::timeout(within, Conn::managed(redis.clone(), config)).await {
        Ok(conn) => Ok(conn?),
        Err(_) => Err(gave_up().into()),
    }
}

/// leasehold's own connection to `cluster`, opened within `within`.
async fn connect_cluster(cluster: &Cluster, within: Duration) -> Result<Conn, Error> {
    let client = cluster.client(None)?;
    match tokio::time::timeout(within, client.get_async_connection()).await {
        Ok(connection) => Ok(Conn::cluster(connection?, cluster.response_timeout)),
        Err(_) => Err(gave_up().into()),
    }
}

/// Whether the server `redis` names, reached on database 0, is a Redis Cluster node: after its database was refused.
async fn selects_on_a_cluster_node(
    redis: &redis::Client,
    config: ConnectionManagerConfig,
    within: Duration,
) -> bool {
    let info = redis.get_connection_info().clone();
    let settings = info.redis_settings().clone().set_db(0);
    let Ok(first) = redis::Client::open(info.set_redis_settings(settings)) else {
        return false;
    };
    match connect_single(&first, config, within).await {
        Ok(conn) => crate::backend::redis::checks::is_cluster_node(&conn)
            .await
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// The error for a database other than 0 in the URL of a cluster node.
fn not_in_cluster(url: &str, db: i64) -> InvalidArgument {
    InvalidArgument::BadUrl(format!(
        "{url} is a Redis Cluster node, and a cluster has database 0 only: drop /{db} from the URL"
    ))
}

fn gave_up() -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Io, "timed out connecting to redis"))
}
