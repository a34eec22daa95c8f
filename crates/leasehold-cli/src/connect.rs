//! Connecting to the store (Redis; etcd for `etcd://` URLs, ZooKeeper for `zk://`, PostgreSQL for `postgres://`,
//! MySQL/MariaDB for `mysql://` and `mariadb://`), with the errors mapped to exit
//! statuses and passwords kept out of messages.

use std::path::Path;
use std::time::Duration;

use crate::args::StoreArg;
use crate::exit::{self, fail};

/// Connects a lock client to `url` with the default prefix and no TLS files (the demo and the bench).
///
/// # Errors
///
/// As [`locks`].
pub async fn client(url: &str, ttl: Option<Duration>) -> anyhow::Result<leasehold::Client> {
    let target = StoreArg {
        urls: vec![url.to_owned()],
        prefix: leasehold::DEFAULT_PREFIX.to_owned(),
        tls_ca: None,
        tls_cert: None,
        tls_key: None,
        replicas: 0,
    };
    locks(&target, ttl).await
}

/// Connects a lock client to the server, prefix and TLS files of `target`. On Redis `ttl` (the lease the caller will
/// take, if any) bounds the response timeout, so that a slow reply leaves room for a retry before a short lease runs
/// out; on etcd it is the session's lease, which every grant of the client lives under, and on ZooKeeper the session
/// timeout asked for, which ZooKeeper clamps to its bounds (the library's default without it).
///
/// # Errors
///
/// Status 2 for a malformed URL, a bad prefix, an unusable TLS file or a Redis option with another store's URL,
/// 69 when the
/// store cannot be reached (or the TLS handshake fails) or refuses the credentials.
pub async fn locks(target: &StoreArg, ttl: Option<Duration>) -> anyhow::Result<leasehold::Client> {
    open(target, ttl, false).await
}

/// Connects a client that only reads (`status`, `list`): on PostgreSQL and MySQL/MariaDB its user needs only `SELECT`
/// on the lease tables ([`leasehold::Builder::read_only`]).
///
/// # Errors
///
/// As [`locks`].
pub async fn reader(target: &StoreArg) -> anyhow::Result<leasehold::Client> {
    open(target, None, true).await
}

/// [`locks`], or [`reader`] when `read_only`.
async fn open(
    target: &StoreArg,
    ttl: Option<Duration>,
    read_only: bool,
) -> anyhow::Result<leasehold::Client> {
    let url = match target.urls.as_slice() {
        [url] => url.as_str(),
        _ => {
            return Err(fail(
                exit::USAGE,
                "this command takes one --store (a quorum of 3 or more is for run, status, list and release)",
            ))
        }
    };
    check_not_empty(url)?;
    let store = crate::stores::check_store(target)?;
    let mut builder = match leasehold::Client::builder(url) {
        Ok(builder) => builder,
        Err(leasehold::Error::InvalidArgument(leasehold::InvalidArgument::BadUrl(why))) => {
            return Err(not_a_url(url, &why))
        }
        Err(leasehold::Error::InvalidArgument(
            why @ leasehold::InvalidArgument::UnknownScheme { .. },
        )) => return Err(unknown_scheme(url, &why)),
        Err(err) => return Err(err.into()),
    };
    builder = builder.prefix(target.prefix.clone()).read_only(read_only);
    if let Some(ca) = &target.tls_ca {
        builder = builder.tls_ca_pem(read_pem(ca, "--tls-ca")?);
    }
    if let (Some(cert), Some(key)) = (&target.tls_cert, &target.tls_key) {
        builder = builder
            .tls_client_identity_pem(read_pem(cert, "--tls-cert")?, read_pem(key, "--tls-key")?);
    }
    if store.has_sessions() {
        if let Some(ttl) = ttl {
            builder = builder.session_ttl(ttl);
        }
        return builder.connect().await.map_err(not_connected);
    }
    builder = builder.replicas(target.replicas);
    if let Some(ttl) = ttl {
        let timeout = (ttl / 4).clamp(
            Duration::from_millis(100),
            leasehold::DEFAULT_RESPONSE_TIMEOUT,
        );
        builder = builder.response_timeout(timeout);
    }
    // A connection error names the URL (password hidden) itself, and exits 69 (see `exit::code_of`).
    Ok(builder.connect().await?)
}

/// How long a command may take, at its end, to close its client's session (see [`closing`]).
pub const CLOSE_BOUND: Duration = Duration::from_secs(2);

/// Runs `work` with `client`, then closes the client (at most [`CLOSE_BOUND`]): on etcd, ZooKeeper and the SQL stores
/// its session ends on the server at once (etcd's lease revoked, ZooKeeper's session closed, the SQL session row
/// deleted) instead of a TTL later, so that `status`, `list`, `release` and `permits` leave nothing behind. A close that
/// is not answered in time is left to the session's expiry, unsaid: nothing of these commands' own is in it.
pub async fn closing<T>(
    client: &leasehold::Client,
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    let result = work.await;
    client.close(CLOSE_BOUND).await;
    result
}

/// A quorum of the independent servers of `target` (`--store` given 3 or more times).
///
/// # Errors
///
/// Status 2 for 2 URLs, a malformed URL or a bad prefix.
pub async fn quorum(target: &StoreArg) -> anyhow::Result<leasehold::Quorum> {
    if target.urls.len() < leasehold::MIN_NODES {
        return Err(fail(
            exit::USAGE,
            format!(
                "--store given {} times: one server takes one --store, a quorum at least {}",
                target.urls.len(),
                leasehold::MIN_NODES
            ),
        ));
    }
    for url in &target.urls {
        check_not_empty(url)?;
    }
    leasehold::Quorum::connect_with(
        &target.urls,
        &target.prefix,
        leasehold::DEFAULT_NODE_TIMEOUT,
    )
    .await
    .map_err(|err| match err {
        leasehold::Error::InvalidArgument(why) => {
            fail(exit::USAGE, format!("a quorum --store URL: {why}"))
        }
        other => other.into(),
    })
}

/// The contents of a PEM file named by `option`; exit 2 with the reason when it cannot be read.
fn read_pem(path: &Path, option: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).map_err(|err| {
        fail(
            exit::USAGE,
            format!(
                "{option}: cannot read {}: {}",
                path.display(),
                one_line(&err)
            ),
        )
    })
}

fn not_a_url(url: &str, why: &str) -> anyhow::Error {
    let store = crate::stores::Store::of(url).with_article();
    fail(
        exit::USAGE,
        format!("{} is not {store} URL: {why}", redact(url)),
    )
}

/// A URL of no store leasehold knows: `URL: the scheme "…" is not one leasehold knows (did you mean …?); this build
/// takes …`, status 2. Not "not a Redis URL": the URL may have meant any store.
fn unknown_scheme(url: &str, why: &leasehold::InvalidArgument) -> anyhow::Error {
    fail(exit::USAGE, format!("{}: {why}", redact(url)))
}

/// A store that could not be connected to, said as a Redis connection error is: `cannot connect to etcd at URL:
/// cause` (or `ZooKeeper`), status 69. Other errors keep their own status.
fn not_connected(err: leasehold::Error) -> anyhow::Error {
    match err {
        leasehold::Error::Store { store, url, source } => fail(
            exit::UNAVAILABLE,
            format!(
                "cannot connect to {} at {}: {}",
                crate::stores::shown(store),
                redact(&url),
                one_line(source.as_ref())
            ),
        ),
        other => other.into(),
    }
}

/// A plain multiplexed connection (for the demo's store), with the same error mapping as [`client`].
///
/// # Errors
///
/// As [`client`].
pub async fn plain(url: &str) -> anyhow::Result<leasehold::redis::aio::MultiplexedConnection> {
    check_not_empty(url)?;
    match leasehold::Client::builder(url) {
        Err(leasehold::Error::InvalidArgument(leasehold::InvalidArgument::BadUrl(why))) => {
            return Err(not_a_url(url, &why))
        }
        Err(leasehold::Error::InvalidArgument(
            why @ leasehold::InvalidArgument::UnknownScheme { .. },
        )) => return Err(unknown_scheme(url, &why)),
        _ => {}
    }
    let redis =
        leasehold::redis::Client::open(url).map_err(|err| not_a_url(url, &err.to_string()))?;
    let config = leasehold::redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(leasehold::DEFAULT_CONNECTION_TIMEOUT))
        .set_response_timeout(Some(Duration::from_secs(5)));
    redis
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|err| {
            fail(
                exit::UNAVAILABLE,
                format!("cannot reach Redis at {}: {}", redact(url), one_line(&err)),
            )
        })
}

/// An empty URL (`--store ""`, or an empty `LEASEHOLD_STORE`) is named as such, not printed as nothing.
fn check_not_empty(url: &str) -> anyhow::Result<()> {
    if url.trim().is_empty() {
        return Err(fail(
            exit::USAGE,
            "the store URL is empty (expected redis://host:port, etcd://host:port, zk://host:port, \
             postgres://user@host/db or mysql://user@host/db; see --store and LEASEHOLD_STORE)",
        ));
    }
    Ok(())
}

fn one_line(err: &(dyn std::error::Error + 'static)) -> String {
    exit::error_line(err)
}

/// `url` with its secrets replaced by `***`, for messages: the password of the user part
/// (`redis://user:***@host`, `redis://:***@host`; in a Redis URL a user part without a colon is hidden whole, as some
/// Redis clients take it for a password, while any other URL shows its user name: `postgres://app@db`) and every query parameter named `pass` or `password` (`unix:///r.sock?db=1&pass=***`, the
/// form redis-rs reads for Unix sockets). Works on text that is not a valid URL too: that is when it is printed.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (userinfo, location) = split_userinfo(rest);
    let (path, query) = match location.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (location, None),
    };
    let mut out = format!("{scheme}://");
    if let Some(userinfo) = userinfo {
        match userinfo.split_once(':') {
            Some((user, _)) => out.push_str(&format!("{user}:***@")),
            None if is_redis_scheme(scheme) => out.push_str("***@"),
            None => out.push_str(&format!("{userinfo}@")),
        }
    }
    out.push_str(path);
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|param| match param.split_once('=') {
                Some((key, _)) if is_secret(key) => format!("{key}=***"),
                _ => param.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

/// The user part of what follows `scheme://` (without its `@`), and the rest. The user part ends at the last `@`
/// before the query, so that a password written with a raw `/` or `@` is still taken whole; when a raw `?` in the
/// password hides that `@`, an `@` after the `?` with no `=` before it counts too.
fn split_userinfo(rest: &str) -> (Option<&str>, &str) {
    let query = rest.find('?').unwrap_or(rest.len());
    let at = rest[..query].rfind('@').or_else(|| {
        let at = query + rest[query..].find('@')?;
        (!rest[query..at].contains('=')).then_some(at)
    });
    match at {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    }
}

/// Whether `scheme` is one of Redis's (`redis`, `rediss`, `redis+cluster`…, `unix`).
fn is_redis_scheme(scheme: &str) -> bool {
    let scheme = scheme.to_ascii_lowercase();
    scheme.starts_with("redis") || scheme == "unix"
}

fn is_secret(key: &str) -> bool {
    key.eq_ignore_ascii_case("pass") || key.eq_ignore_ascii_case("password")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden() {
        assert_eq!(
            redact("redis://127.0.0.1:6379/0"),
            "redis://127.0.0.1:6379/0"
        );
        assert_eq!(
            redact("redis://app:s3cret@redis.internal:6379/2"),
            "redis://app:***@redis.internal:6379/2"
        );
        assert_eq!(redact("redis://:s3cret@h"), "redis://:***@h");
        assert_eq!(redact("redis://s3cret@h:6379"), "redis://***@h:6379");
        assert_eq!(redact("postgress://app@db/x"), "postgress://app@db/x");
        assert_eq!(redact("mysql://app:pw@db/x"), "mysql://app:***@db/x");
        assert_eq!(
            redact("rediss://app:s3cret@redis.internal:6380/0?insecure"),
            "rediss://app:***@redis.internal:6380/0?insecure"
        );
        assert_eq!(redact("not a url"), "not a url");
        assert_eq!(redact(""), "");
    }

    #[test]
    fn passwords_written_raw_are_hidden_whole() {
        assert_eq!(
            redact("redis://app:ab/c+d@e@host:6379/1"),
            "redis://app:***@host:6379/1"
        );
        assert_eq!(redact("redis://:ab?cd@host"), "redis://:***@host");
        assert_eq!(redact("redis://:p a s s@host"), "redis://:***@host");
    }

    #[test]
    fn password_query_parameters_are_hidden() {
        assert_eq!(
            redact("unix:///tmp/r.sock?pass=secret"),
            "unix:///tmp/r.sock?pass=***"
        );
        assert_eq!(
            redact("redis+unix:///x?db=1&pass=s&user=u"),
            "redis+unix:///x?db=1&pass=***&user=u"
        );
        assert_eq!(
            redact("rediss://h:6380/?password=s3cret&protocol=resp3"),
            "rediss://h:6380/?password=***&protocol=resp3"
        );
        assert_eq!(
            redact("redis://u:p@h/2?PASS=a&Password=b&passes=c"),
            "redis://u:***@h/2?PASS=***&Password=***&passes=c"
        );
        assert_eq!(redact("unix:///tmp/r.sock?db=2"), "unix:///tmp/r.sock?db=2");
        assert_eq!(redact("unix:///tmp/r.sock?pass"), "unix:///tmp/r.sock?pass");
        for url in [
            "redis://u:hunter2@h?pass=hunter2",
            "unix:///tmp/r.sock?pass=hunter2&user=u",
            "redis+unix:///tmp/r.sock?password=hunter2",
            "rediss://:hunter2@h:6380",
            "redis://:hun?ter2@h",
        ] {
            assert!(!redact(url).contains("hunter2"), "{url} -> {}", redact(url));
        }
    }
}
