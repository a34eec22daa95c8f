//! Connecting to Redis, with the errors mapped to exit statuses and passwords kept out of messages.

use std::time::Duration;

use crate::exit::{self, fail};

/// Connects a lock client to `url`. `ttl` (the lease the caller will take, if any) bounds the response timeout,
/// so that a slow reply leaves room for a retry before a short lease runs out.
///
/// # Errors
///
/// Status 2 for a malformed URL, 69 when Redis cannot be reached or refuses the credentials.
pub async fn client(url: &str, ttl: Option<Duration>) -> anyhow::Result<leasehold::Client> {
    check_not_empty(url)?;
    let mut builder = match leasehold::Client::builder(url) {
        Ok(builder) => builder,
        Err(leasehold::Error::InvalidArgument(leasehold::InvalidArgument::BadUrl(_))) => {
            return Err(fail(
                exit::USAGE,
                format!(
                    "{} is not a Redis URL (expected redis://host:port)",
                    redact(url)
                ),
            ))
        }
        Err(err) => return Err(err.into()),
    };
    if let Some(ttl) = ttl {
        let timeout = (ttl / 4).clamp(
            Duration::from_millis(100),
            leasehold::DEFAULT_RESPONSE_TIMEOUT,
        );
        builder = builder.response_timeout(timeout);
    }
    builder.connect().await.map_err(|err| match err {
        leasehold::Error::Redis(err) => fail(
            exit::UNAVAILABLE,
            format!("cannot reach Redis at {}: {}", redact(url), one_line(&err)),
        ),
        other => other.into(),
    })
}

/// A plain multiplexed connection (for the demo's store), with the same error mapping as [`client`].
///
/// # Errors
///
/// As [`client`].
pub async fn plain(url: &str) -> anyhow::Result<leasehold::redis::aio::MultiplexedConnection> {
    check_not_empty(url)?;
    let redis = leasehold::redis::Client::open(url).map_err(|_| {
        fail(
            exit::USAGE,
            format!(
                "{} is not a Redis URL (expected redis://host:port)",
                redact(url)
            ),
        )
    })?;
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

/// An empty URL (`--redis ""`, or an empty `LEASEHOLD_REDIS_URL`) is named as such, not printed as nothing.
fn check_not_empty(url: &str) -> anyhow::Result<()> {
    if url.trim().is_empty() {
        return Err(fail(
            exit::USAGE,
            "the Redis URL is empty (expected redis://host:port; see --redis and LEASEHOLD_REDIS_URL)",
        ));
    }
    Ok(())
}

fn one_line(err: &dyn std::fmt::Display) -> String {
    err.to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// `url` with its password (if any) replaced by `***`, for messages.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let hidden = match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***"),
                None => "***".to_owned(),
            };
            format!("{scheme}://{hidden}@{host}{path}")
        }
        None => url.to_owned(),
    }
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
        assert_eq!(redact("not a url"), "not a url");
    }
}
