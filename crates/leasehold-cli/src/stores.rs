//! Which store a `--store` URL names, and what the command's options mean on the stores other than Redis: etcd
//! (`etcd://host:port[,host:port…]`, `etcds://` over TLS) and ZooKeeper (`zk://[user:pw@]host:port[,host:port…][/chroot]`).
//! Both keep every grant under a session of the command's client, so they refuse the same Redis settings, with the
//! same words; each has its own rule for `--ttl`.
//!
//! | option | on etcd | on ZooKeeper |
//! |---|---|---|
//! | `--store URL` | one URL names every member of the cluster; given several times it is refused (a quorum is made of independent Redis servers) | one URL names every server of the ensemble; likewise |
//! | `--ttl` | the session lease that the grant lives under (the library's `Builder::session_ttl`): whole seconds, at least 2s; 30s by default, as on Redis. A keep-alive goes out every third of it | the session timeout asked for (`Builder::session_ttl`): at least 1s, whole milliseconds, 30s by default. ZooKeeper clamps it to its own bounds (by default 2 to 20 ticks), and the session runs with the timeout it negotiated: a `sync` every eighth of that |
//! | `--wait`, `--nonblock`, `--quiet`, `--conflict-exit-code`, `--kill-after`, `--command` | as on Redis | as on Redis |
//! | `--fair`, `--shared`, `--exclusive` | as on Redis (every lock serves its waiters in order of arrival) | likewise |
//! | `--permits N` | one of N permits, N at most 2^32 − 1; no count is stored, so runs that give another N are not refused: each applies its own | likewise |
//! | `--prefix` | lock NAME lives under the etcd keys `PREFIX/NAME/`, so `etcdctl lock PREFIX/NAME` excludes it, whatever its kind | lock NAME is the node `/PREFIX/NAME` (under the URL's chroot), so kazoo's `Lock`, `ReadLock` and `WriteLock` on that path exclude it, whatever its kind (Curator's recipes do not: README's table) |
//! | `--replicas` | refused: a Redis setting (etcd commits a grant to a majority before it answers) | refused, likewise |
//! | `--tls-ca`, `--tls-cert`, `--tls-key` | for `etcds://` as for `rediss://`; refused with `etcd://` | refused: leasehold reaches ZooKeeper in the clear only |
//! | a nested run (`LEASEHOLD_NAME`, `LEASEHOLD_TOKEN`) | as on Redis | as on Redis |
//! | `leasehold permits` | refused: there is no stored count to change | refused, likewise |
//! | `leasehold demo` | refused: its stock and its fenced store are Redis scripts | refused, likewise |
//!
//! Every refusal exits 2 (usage) with one line, before a connection is attempted.
//!
//!
//! PostgreSQL (`postgres://`, `postgresql://`) and MySQL or MariaDB (`mysql://`, `mariadb://`) keep every grant under a
//! session of the command's client too (a session row of the library's lease tables), so they refuse the same Redis
//! settings with the same words: `--ttl` is the session's TTL (at least 1s, `30s` by default, a renewal every quarter
//! of it), `--permits` counts one permit per grant, `permits` and `demo` are refused, one URL names the server.
//! `--tls-ca`, `--tls-cert` and `--tls-key` go with a `postgres://` URL that says `sslmode=require`; MySQL is reached
//! without TLS.

use std::time::Duration;

use crate::args::{RunArgs, StoreArg};
use crate::duration::show;
use crate::exit::{self, fail};

/// The kind of store a URL names, by its scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// `redis://`, `rediss://`, `unix://`, `redis+cluster://`, `redis+sentinel://`…: anything not below.
    Redis,
    /// `etcd://`, or `etcds://` over TLS.
    Etcd,
    /// `zk://`.
    ZooKeeper,
    /// `postgres://` or `postgresql://`.
    Postgres,
    /// `mysql://` or `mariadb://`.
    MySql,
}

/// The most permits a semaphore has on etcd and on ZooKeeper (the count is a 32-bit number in each grant's key or
/// node name).
const MAX_SESSION_PERMITS: u64 = u32::MAX as u64;

/// The shortest ZooKeeper session timeout the library asks for (its `Builder::session_ttl` refuses less): below a
/// second its keeper's `sync`s, every eighth of it, would be a load of their own.
const MIN_ZK_TIMEOUT: Duration = Duration::from_secs(1);

/// The shortest session TTL of the SQL stores (the library's `Builder::session_ttl` refuses less): its keeper renews
/// every quarter of it, and each renewal is a write.
const MIN_SQL_TTL: Duration = Duration::from_secs(1);

/// The longest ZooKeeper session timeout asked for: the protocol carries it as a signed 32-bit count of milliseconds
/// (24.8 days); a round number below that.
const MAX_ZK_TIMEOUT: Duration = Duration::from_secs(24 * 24 * 3600);

impl Store {
    /// The store `url` names.
    pub fn of(url: &str) -> Store {
        if url.starts_with("etcd://") || url.starts_with("etcds://") {
            Store::Etcd
        } else if url.starts_with("zk://") {
            Store::ZooKeeper
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Store::Postgres
        } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
            Store::MySql
        } else {
            Store::Redis
        }
    }

    /// The store several URLs name: the first that is not Redis, else Redis.
    pub fn of_all(urls: &[String]) -> Store {
        urls.iter()
            .map(|url| Store::of(url))
            .find(|store| *store != Store::Redis)
            .unwrap_or(Store::Redis)
    }

    /// Whether every grant lives under a session of the client (etcd, ZooKeeper, PostgreSQL, MySQL) rather than a
    /// lease of its own.
    pub fn has_sessions(self) -> bool {
        self != Store::Redis
    }

    /// Whether the store can do `capability`, as the library's client of it would answer (`Client::supports`): the
    /// options that need it are refused before connecting by this, the library's own table. What the server decides
    /// (`ReplicasOnDisk` on Redis) counts as supported here, and the library refuses it when it connects.
    pub fn supports(self, capability: leasehold::Capability) -> bool {
        leasehold::store_supports(self.id(), capability).unwrap_or(true)
    }

    /// The store's name as the library's `Client::store_name` gives it, and the bench's JSON: `redis`, `etcd`,
    /// `zookeeper`, `postgres`, `mysql`.
    pub fn id(self) -> &'static str {
        match self {
            Store::Redis => "redis",
            Store::Etcd => "etcd",
            Store::ZooKeeper => "zookeeper",
            Store::Postgres => "postgres",
            Store::MySql => "mysql",
        }
    }

    /// The store's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Store::Redis => "Redis",
            Store::Etcd => "etcd",
            Store::ZooKeeper => "ZooKeeper",
            Store::Postgres => "PostgreSQL",
            Store::MySql => "MySQL/MariaDB",
        }
    }

    /// "a Redis", "an etcd", "a ZooKeeper", "a PostgreSQL", "a MySQL/MariaDB": before "URL", "store".
    pub fn with_article(self) -> &'static str {
        match self {
            Store::Redis => "a Redis",
            Store::Etcd => "an etcd",
            Store::ZooKeeper => "a ZooKeeper",
            Store::Postgres => "a PostgreSQL",
            Store::MySql => "a MySQL/MariaDB",
        }
    }

    /// How one URL names every server of the store (never said of Redis, where 3 URLs make a quorum).
    fn one_url(self) -> &'static str {
        match self {
            Store::Etcd => {
                "one etcd URL names every member of the cluster (etcd://h1:2379,h2:2379,h3:2379)"
            }
            Store::Postgres => {
                "one postgres:// URL names the server (postgres://user@host:5432/database)"
            }
            Store::MySql => "one mysql:// URL names the server (mysql://user@host:3306/database)",
            _ => "one zk:// URL names every server of the ensemble (zk://h1:2181,h2:2181,h3:2181)",
        }
    }
}

/// The store's name as messages say it, from the library's name for it (`Client::store_name`, the `store` of
/// `Error::Store`): `zookeeper` is said `ZooKeeper`, `postgres` `PostgreSQL`, `mysql` `MySQL/MariaDB`.
pub fn shown(library_name: &str) -> &str {
    match library_name {
        "zookeeper" => Store::ZooKeeper.name(),
        "postgres" => Store::Postgres.name(),
        "mysql" => Store::MySql.name(),
        other => other,
    }
}

/// A usage error when `urls` mix an etcd, ZooKeeper, PostgreSQL or MySQL URL with others: one such URL names every
/// server.
///
/// # Errors
///
/// Status 2, saying how one URL names them all.
pub fn check_one_url(urls: &[String]) -> anyhow::Result<Store> {
    let store = Store::of_all(urls);
    if store != Store::Redis && urls.len() > 1 {
        return Err(usage(format!(
            "--store given {} times with {} URL: {}; a quorum is made of independent Redis servers",
            urls.len(),
            store.with_article(),
            store.one_url()
        )));
    }
    Ok(store)
}

/// The store `target` names; a usage error when it is etcd, ZooKeeper, PostgreSQL or MySQL/MariaDB and also carries
/// what only Redis has.
///
/// # Errors
///
/// Status 2 for such a URL given with other `--store` URLs, `--replicas`, or TLS files (on etcd, unless
/// the URL is `etcds://`).
pub fn check_store(target: &StoreArg) -> anyhow::Result<Store> {
    let store = check_one_url(&target.urls)?;
    if !store.has_sessions() {
        return Ok(store);
    }
    if target.replicas != 0 && !store.supports(leasehold::Capability::ReplicaAcks) {
        let commits = match store {
            Store::Etcd => {
                "etcd commits every grant to a majority of its members before it answers"
            }
            Store::Postgres | Store::MySql => {
                "the database's own replication decides (synchronous replication keeps a grant through a failover)"
            }
            _ => "ZooKeeper commits every write to a majority of the ensemble before it answers",
        };
        return Err(usage(format!(
            "--replicas is a Redis setting (WAIT): {commits}; drop --replicas (and LEASEHOLD_REPLICAS) for {} \
             store",
            match store {
                Store::Etcd => "an etcd://",
                Store::Postgres => "a postgres://",
                Store::MySql => "a mysql://",
                _ => "a zk://",
            }
        )));
    }
    let tls = [
        (target.tls_ca.is_some(), "--tls-ca"),
        (target.tls_cert.is_some(), "--tls-cert"),
        (target.tls_key.is_some(), "--tls-key"),
    ];
    let over_tls = target.urls.iter().any(|url| {
        url.starts_with("etcds://")
            || (Store::of(url) == Store::Postgres && url.contains("sslmode=require"))
    });
    if let (Some((_, option)), false) = (tls.iter().find(|(given, _)| *given), over_tls) {
        let why = match store {
            Store::Etcd => {
                format!("etcd:// is reached without TLS; give etcds:// or drop {option}")
            }
            Store::Postgres => {
                format!("PostgreSQL is reached over TLS only with sslmode=require in the URL; add it or drop {option}")
            }
            Store::MySql => format!("leasehold reaches MySQL without TLS; drop {option}"),
            _ => format!(
                "leasehold reaches ZooKeeper without TLS (there is no zks://); drop {option}"
            ),
        };
        return Err(usage(format!(
            "{option} is for rediss://, etcds:// and postgres://…?sslmode=require URLs: {why}"
        )));
    }
    Ok(store)
}

/// Checks the options of `leasehold run` against a store with sessions: etcd, ZooKeeper, PostgreSQL or MySQL/MariaDB
/// (nothing to check on Redis).
///
/// # Errors
///
/// Status 2 for what [`check_store`] refuses, a `--ttl` the store's sessions cannot have, and more permits than
/// the store counts.
pub fn check_run(args: &RunArgs) -> anyhow::Result<()> {
    let store = check_store(&args.store)?;
    if !store.has_sessions() {
        return Ok(());
    }
    check_session_ttl(store, args.ttl)?;
    if let Some(permits) = args.permits.filter(|&n| n > MAX_SESSION_PERMITS) {
        return Err(usage(format!(
            "--permits {permits}: {} semaphore has at most {MAX_SESSION_PERMITS} permits",
            store.with_article()
        )));
    }
    Ok(())
}

/// A usage error unless `ttl` can be the session of `store`: on etcd a lease of whole seconds, at least 2s; on
/// ZooKeeper a timeout of whole milliseconds, at least 1s (which ZooKeeper then clamps to its own bounds); on the SQL
/// stores a TTL of at least 1s.
///
/// # Errors
///
/// Status 2, saying what the store takes.
pub fn check_session_ttl(store: Store, ttl: Duration) -> anyhow::Result<()> {
    match store {
        Store::Redis => Ok(()),
        Store::Postgres | Store::MySql if ttl < MIN_SQL_TTL => Err(usage(format!(
            "--ttl {}: on {} it is the session's TTL, at least {} (a renewal goes out every quarter of it)",
            show(ttl),
            store.name(),
            show(MIN_SQL_TTL)
        ))),
        Store::Postgres | Store::MySql => Ok(()),
        Store::Etcd if ttl < leasehold::MIN_SESSION_TTL || ttl.subsec_nanos() != 0 => {
            Err(usage(format!(
                "--ttl {}: on etcd the lease is the session's, which etcd grants in whole seconds of at least {} \
                 (give --ttl 2s, 10s, 1m…)",
                show(ttl),
                show(leasehold::MIN_SESSION_TTL)
            )))
        }
        Store::Etcd => Ok(()),
        Store::ZooKeeper
            if ttl < MIN_ZK_TIMEOUT
                || ttl > MAX_ZK_TIMEOUT
                || !ttl.subsec_nanos().is_multiple_of(1_000_000) =>
        {
            Err(usage(format!(
                "--ttl {}: on ZooKeeper it is the session timeout asked for, in whole milliseconds from {} to {} \
                 (ZooKeeper then clamps it to its own bounds, by default 2 to 20 ticks)",
                show(ttl),
                show(MIN_ZK_TIMEOUT),
                show(MAX_ZK_TIMEOUT)
            )))
        }
        Store::ZooKeeper => Ok(()),
    }
}

/// `leasehold permits` on etcd, ZooKeeper, PostgreSQL or MySQL/MariaDB: refused, there is no stored count.
///
/// # Errors
///
/// Status 2 on such a store, and for what [`check_store`] refuses.
pub fn check_permits(target: &StoreArg) -> anyhow::Result<()> {
    let store = check_store(target)?;
    if !store.supports(leasehold::Capability::StoredPermits) {
        return Err(usage(format!(
            "permits changes the count a Redis semaphore stores; {} stores none (each run's --permits is its own \
             count), so there is nothing to change: give the new count to the runs",
            store.name()
        )));
    }
    Ok(())
}

/// `leasehold demo` on another store than Redis: refused, its stock and fenced store live in Redis.
///
/// # Errors
///
/// Status 2 when `url` names etcd, ZooKeeper, PostgreSQL or MySQL.
pub fn check_demo(url: Option<&str>) -> anyhow::Result<()> {
    if url.is_some_and(|url| Store::of(url) != Store::Redis) {
        return Err(usage(
            "the demo runs on Redis (its stock and its fenced store are Redis scripts): drop --store (and \
             LEASEHOLD_STORE) for a private redis-server, or give a redis:// URL",
        ));
    }
    Ok(())
}

/// When a grant the command could not release goes by itself, for warnings: within its lease (`ttl`) on Redis, etcd,
/// PostgreSQL and MySQL/MariaDB; on ZooKeeper with the session, whose timeout ZooKeeper negotiated from `ttl`.
pub fn expiry(store: Store, ttl: Duration) -> String {
    match store {
        Store::ZooKeeper => format!(
            "it goes with the session, at the latest the session timeout ZooKeeper negotiated (--ttl {} asked) \
             after its last keep-alive",
            show(ttl)
        ),
        _ => format!("it expires within {}", show(ttl)),
    }
}

fn usage(message: impl Into<String>) -> anyhow::Error {
    fail(exit::USAGE, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusals_before_connecting_are_the_library_s_capabilities() {
        use leasehold::Capability;
        for store in [
            Store::Redis,
            Store::Etcd,
            Store::ZooKeeper,
            Store::Postgres,
            Store::MySql,
        ] {
            let url = match store {
                Store::Redis => "redis://127.0.0.1:1",
                Store::Etcd => "etcd://127.0.0.1:1",
                Store::ZooKeeper => "zk://127.0.0.1:1",
                Store::Postgres => "postgres://u@127.0.0.1:1/db",
                Store::MySql => "mysql://u@127.0.0.1:1/db",
            };
            let target = |replicas: u32| StoreArg {
                urls: vec![url.to_owned()],
                prefix: leasehold::DEFAULT_PREFIX.to_owned(),
                tls_ca: None,
                tls_cert: None,
                tls_key: None,
                replicas,
            };
            assert_eq!(
                check_permits(&target(0)).is_ok(),
                leasehold::store_supports(store.id(), Capability::StoredPermits).unwrap(),
                "{store:?}"
            );
            assert_eq!(
                check_store(&target(1)).is_ok(),
                leasehold::store_supports(store.id(), Capability::ReplicaAcks).unwrap(),
                "{store:?}"
            );
        }
    }

    #[test]
    fn the_scheme_picks_the_store() {
        assert_eq!(Store::of("etcd://h:2379"), Store::Etcd);
        assert_eq!(Store::of("etcds://h:2379"), Store::Etcd);
        assert_eq!(Store::of("zk://h:2181/apps"), Store::ZooKeeper);
        assert_eq!(Store::of("postgres://u@h/db"), Store::Postgres);
        assert_eq!(Store::of("postgresql://u@h/db"), Store::Postgres);
        assert_eq!(Store::of("mysql://u@h/db"), Store::MySql);
        assert_eq!(Store::of("mariadb://u@h/db"), Store::MySql);
        for redis in [
            "redis://h",
            "rediss://h",
            "unix:///r.sock",
            "redis+cluster://a,b",
            "zookeeper://h",
        ] {
            assert_eq!(Store::of(redis), Store::Redis, "{redis}");
        }
        let urls = ["redis://a".to_owned(), "zk://b".to_owned()];
        assert_eq!(Store::of_all(&urls), Store::ZooKeeper);
        assert_eq!(
            exit::code_of(&check_one_url(&urls).unwrap_err()),
            exit::USAGE
        );
        assert_eq!(shown("zookeeper"), "ZooKeeper");
        assert_eq!(shown("postgres"), "PostgreSQL");
        let two = ["postgres://a/db".to_owned(), "postgres://b/db".to_owned()];
        assert_eq!(
            exit::code_of(&check_one_url(&two).unwrap_err()),
            exit::USAGE
        );
        assert_eq!(shown("etcd"), "etcd");
    }

    #[test]
    fn etcd_session_leases_are_whole_seconds_of_at_least_two() {
        for ok in [2, 10, 30, 3600] {
            assert!(check_session_ttl(Store::Etcd, Duration::from_secs(ok)).is_ok());
        }
        for bad in [
            Duration::from_secs(1),
            Duration::from_millis(2500),
            Duration::from_millis(10),
        ] {
            let err = check_session_ttl(Store::Etcd, bad).unwrap_err();
            assert_eq!(exit::code_of(&err), exit::USAGE);
        }
    }

    #[test]
    fn sql_session_ttls_are_at_least_one_second() {
        for store in [Store::Postgres, Store::MySql] {
            assert!(store.has_sessions());
            assert!(check_session_ttl(store, Duration::from_millis(1500)).is_ok());
            let err = check_session_ttl(store, Duration::from_millis(999)).unwrap_err();
            assert_eq!(exit::code_of(&err), exit::USAGE);
        }
    }

    #[test]
    fn zookeeper_session_timeouts_are_whole_milliseconds_from_one_second() {
        for ok in [
            Duration::from_secs(1),
            Duration::from_millis(2500),
            Duration::from_secs(30),
            MAX_ZK_TIMEOUT,
        ] {
            assert!(check_session_ttl(Store::ZooKeeper, ok).is_ok(), "{ok:?}");
        }
        for bad in [
            Duration::from_millis(999),
            Duration::from_micros(1_500_500),
            MAX_ZK_TIMEOUT + Duration::from_millis(1),
        ] {
            let err = check_session_ttl(Store::ZooKeeper, bad).unwrap_err();
            assert_eq!(exit::code_of(&err), exit::USAGE, "{bad:?}");
        }
    }
}
