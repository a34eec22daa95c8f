//! What the command's options mean on etcd (`--store etcd://host:port[,host:port…]`), checked before anything
//! connects, and etcd's errors and lock holders as the rest of the command shows them.
//!
//! | option | on etcd |
//! |---|---|
//! | `--store URL` | one URL names every member of the cluster; given several times it is refused (a quorum is made of independent Redis servers) |
//! | `--ttl` | the session lease that the grant lives under (the library's `Builder::session_ttl`): whole seconds, at least 2s; 30s by default, as on Redis. A keep-alive goes out every third of it |
//! | `--wait`, `--nonblock`, `--quiet`, `--conflict-exit-code`, `--kill-after`, `--command` | as on Redis |
//! | `--fair`, `--shared`, `--exclusive` | as on Redis (every etcd lock serves its waiters in order of arrival) |
//! | `--permits N` | one of N permits, N at most 2^32 − 1; etcd stores no count, so runs that give another N are not refused: each applies its own |
//! | `--prefix` | lock NAME lives under the etcd keys `PREFIX/NAME/`, so `etcdctl lock PREFIX/NAME` excludes it |
//! | `--replicas` | refused: a Redis setting (etcd commits a grant to a majority before it answers) |
//! | `--tls-ca`, `--tls-cert`, `--tls-key` | for `etcds://` as for `rediss://`: the CA to trust (else the system's), a client certificate; refused with `etcd://` |
//! | a nested run (`LEASEHOLD_NAME`, `LEASEHOLD_TOKEN`) | as on Redis |
//! | `leasehold permits` | refused: there is no stored count to change |
//! | `leasehold demo` | refused: its stock and its fenced store are Redis scripts |
//!
//! Every refusal exits 2 (usage) with one line, before a connection is attempted.

use std::time::Duration;

use crate::cli::{RunArgs, StoreArg};
use crate::exit::{self, fail};

/// The scheme of etcd URLs, and of etcd over TLS.
const SCHEME: &str = "etcd://";
const TLS_SCHEME: &str = "etcds://";

/// The most permits an etcd semaphore has (its count is a 32-bit number in the waiter key).
const MAX_PERMITS: u64 = u32::MAX as u64;

/// The shortest session lease, and its unit: etcd grants leases in whole seconds, and raises anything shorter than 2s
/// (with its default election timeout) to its minimum; the library's `Builder::session_ttl` refuses both.
const MIN_SESSION_TTL: Duration = leasehold::MIN_SESSION_TTL;

/// Whether `url` names an etcd cluster (`etcd://`, or `etcds://` over TLS).
pub fn is_etcd(url: &str) -> bool {
    url.starts_with(SCHEME) || url.starts_with(TLS_SCHEME)
}

/// Whether `store` names an etcd cluster; a usage error when it also carries what only Redis has.
///
/// # Errors
///
/// Status 2 for an etcd URL given with other `--store` URLs, `--replicas` or TLS files.
pub fn check_store(store: &StoreArg) -> anyhow::Result<bool> {
    if !store.urls.iter().any(|url| is_etcd(url)) {
        return Ok(false);
    }
    if store.urls.len() > 1 {
        return Err(usage(format!(
            "--store given {} times with an etcd URL: one etcd URL names every member of the cluster \
             (etcd://h1:2379,h2:2379,h3:2379); a quorum is made of independent Redis servers",
            store.urls.len()
        )));
    }
    if store.replicas != 0 {
        return Err(usage(
            "--replicas is a Redis setting (WAIT): etcd commits every grant to a majority of its members before it \
             answers; drop --replicas (and LEASEHOLD_REPLICAS) for an etcd:// store",
        ));
    }
    let tls = [
        (store.tls_ca.is_some(), "--tls-ca"),
        (store.tls_cert.is_some(), "--tls-cert"),
        (store.tls_key.is_some(), "--tls-key"),
    ];
    let over_tls = store.urls.iter().any(|url| url.starts_with(TLS_SCHEME));
    if let (Some((_, option)), false) = (tls.iter().find(|(given, _)| *given), over_tls) {
        return Err(usage(format!(
            "{option} is for rediss:// and etcds:// URLs: etcd:// is reached without TLS; give etcds:// or drop \
             {option}"
        )));
    }
    Ok(true)
}

/// Checks the options of `leasehold run` against an etcd store (nothing to check on Redis).
///
/// # Errors
///
/// Status 2 for what [`check_store`] refuses, a `--ttl` that is no etcd lease, and more permits than etcd counts.
pub fn check_run(args: &RunArgs) -> anyhow::Result<()> {
    if !check_store(&args.store)? {
        return Ok(());
    }
    check_session_ttl(args.ttl)?;
    if let Some(permits) = args.permits.filter(|&n| n > MAX_PERMITS) {
        return Err(usage(format!(
            "--permits {permits}: an etcd semaphore has at most {MAX_PERMITS} permits"
        )));
    }
    Ok(())
}

/// A usage error unless `ttl` can be an etcd session lease: whole seconds, at least 2s.
///
/// # Errors
///
/// Status 2, saying what etcd grants.
pub fn check_session_ttl(ttl: Duration) -> anyhow::Result<()> {
    if ttl < MIN_SESSION_TTL || ttl.subsec_nanos() != 0 {
        return Err(usage(format!(
            "--ttl {}: on etcd the lease is the session's, which etcd grants in whole seconds of at least {} \
             (give --ttl 2s, 10s, 1m…)",
            crate::duration::show(ttl),
            crate::duration::show(MIN_SESSION_TTL)
        )));
    }
    Ok(())
}

/// `leasehold permits` on etcd: refused, there is no stored count.
///
/// # Errors
///
/// Status 2 on an etcd store, and for what [`check_store`] refuses.
pub fn check_permits(store: &StoreArg) -> anyhow::Result<()> {
    if check_store(store)? {
        return Err(usage(
            "permits changes the count a Redis semaphore stores; etcd stores none (each run's --permits is its own \
             count), so there is nothing to change: give the new count to the runs",
        ));
    }
    Ok(())
}

/// `leasehold demo` on etcd: refused, its stock and fenced store live in Redis.
///
/// # Errors
///
/// Status 2 when `store` is an etcd URL.
pub fn check_demo(store: Option<&str>) -> anyhow::Result<()> {
    if store.is_some_and(is_etcd) {
        return Err(usage(
            "the demo runs on Redis (its stock and its fenced store are Redis scripts): drop --store (and \
             LEASEHOLD_STORE) for a private redis-server, or give a redis:// URL",
        ));
    }
    Ok(())
}

fn usage(message: impl Into<String>) -> anyhow::Error {
    fail(exit::USAGE, message)
}

/// The text of an error of etcd's client, on one line: a gRPC status as its message and the innermost cause under it
/// (`tcp connect error: Connection refused (os error 111)`), never the `Debug` dump its own text carries.
pub fn client_error_line(err: &etcd_client::Error) -> String {
    let etcd_client::Error::GRpcStatus(status) = err else {
        return err.to_string();
    };
    let mut text = match status.message() {
        "" => status.code().description().to_owned(),
        message => message.to_owned(),
    };
    let innermost = std::iter::successors(std::error::Error::source(status), |e| e.source()).last();
    if let Some(cause) = innermost {
        text.push_str(": ");
        text.push_str(&cause.to_string());
    }
    text
}

/// `info` with every holder's token and description as Redis gives them: etcd reports the token of a tagged hold
/// (a reader, a fair mutex's or a semaphore's holder) with its tag in front (`r dl1:…`), and so no description. A
/// no-op once the library reports them as on Redis.
pub fn holders_as_on_redis(mut info: leasehold::LockInfo) -> leasehold::LockInfo {
    for holder in info.holders.iter_mut().chain(info.holder.as_mut()) {
        if let Some((token, description)) = untagged(&holder.token) {
            if holder.description.is_none() {
                holder.description = description.map(str::to_owned);
            }
            holder.token = token.to_owned();
        }
    }
    info
}

/// A hold as `force_release` returns it, as its token (see [`holders_as_on_redis`]).
pub fn token_as_on_redis(hold: &str) -> &str {
    untagged(hold).map_or(hold, |(token, _)| token)
}

/// The token of a tagged hold (`r dl1:… description`) without its tag, and the description after it; `None` for an
/// untagged token.
fn untagged(hold: &str) -> Option<(&str, Option<&str>)> {
    if hold.starts_with(TOKEN_PREFIX) {
        return None;
    }
    let token = &hold[hold.find(&format!(" {TOKEN_PREFIX}"))? + 1..];
    let description = token
        .split_once(' ')
        .map(|(_, d)| d)
        .filter(|d| !d.is_empty());
    Some((token, description))
}

/// How every owner token starts.
const TOKEN_PREFIX: &str = "dl1:";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_holds_read_as_on_redis() {
        let token = "dl1:0123456789abcdef0123456789abcdef host=h pid=1";
        assert_eq!(untagged(token), None);
        assert_eq!(
            untagged(&format!("r {token}")),
            Some((token, Some("host=h pid=1")))
        );
        assert_eq!(
            untagged("s1 dl1:0123456789abcdef0123456789abcdef"),
            Some(("dl1:0123456789abcdef0123456789abcdef", None))
        );
        assert_eq!(untagged("leasehold/jobs/694d7a1b2c"), None);
    }

    #[test]
    fn session_leases_are_whole_seconds_of_at_least_two() {
        for ok in [2, 10, 30, 3600] {
            assert!(check_session_ttl(Duration::from_secs(ok)).is_ok());
        }
        for bad in [
            Duration::from_secs(1),
            Duration::from_millis(2500),
            Duration::from_millis(10),
        ] {
            let err = check_session_ttl(bad).unwrap_err();
            assert_eq!(exit::code_of(&err), exit::USAGE);
        }
    }
}
