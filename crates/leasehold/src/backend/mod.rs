//! The stores a lock lives in, one folder each: `redis` (one server, a Redis Cluster, or the primary that Sentinel
//! names), `quorum` (a majority of independent Redis primaries, Redlock), `etcd` (feature `etcd`), `zookeeper`
//! (feature `zookeeper`) and `sql` (features `postgres` and `mysql`). Each depends on
//! the engine, never the other way round.
//!
//! This file and its siblings (`admission.rs`, `scheme.rs`, `tls.rs`, `url.rs`) hold what several stores share:
//! what a lock handle and a queued kind ask of a store ([`Handle`], [`Ask`]), the connection and fence defaults
//! (re-exported by the client), how many locks `held_locks` reads at once, Redis's glob. They sit below the store
//! folders and import none of them, nor `kinds/` or `client.rs`: the stores return grants, and the seam the kinds
//! reach a store through (one `match` per operation, making the guards) is above them, in `kinds/store.rs`.

use std::time::Duration;

/// Default time allowed to open a connection to Redis.
pub const DEFAULT_CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);
/// Default time allowed for one Redis reply.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Default time a lock's fence counter outlives its last grant.
pub const DEFAULT_FENCE_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// How many locks [`Client::held_locks`](crate::Client::held_locks) reads at once, on every store.
pub(crate) const HELD_LOCKS_CHUNK: usize = 100;

#[cfg(session_stores)]
pub(crate) mod admission;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod quorum;
pub(crate) mod redis;
pub(crate) mod scheme;
#[cfg(session_stores)]
pub(crate) mod session;
#[cfg(sql_stores)]
pub(crate) mod sql;
#[cfg(feature = "tls")]
pub(crate) mod tls;
#[cfg(session_stores)]
pub(crate) mod url;
#[cfg(feature = "zookeeper")]
pub(crate) mod zookeeper;

/// A lock's checked name: every kind and every store names a lock by it (etcd by its [`name`](LockKeys::name)); it
/// also carries Redis's key layout. It lives below the stores, in `engine/keys.rs`.
pub(crate) use crate::engine::keys::LockKeys;

/// What one acquisition of a queued kind asks for: its hold's tag (`x`, `r`, `w`, `s<k>`, `e`: see `set.lua`) and the
/// permit count it counts against (semaphores; 0 otherwise).
#[derive(Clone, Debug)]
pub(crate) struct Ask {
    pub(crate) tag: String,
    pub(crate) limit: u64,
}

/// What a lock handle asks of each grant, whatever its kind and store: the lease and how often the
/// keeper renews it (`None`: a fixed lease, never renewed), the holder's description, and whether a wait ends at the
/// first store error instead of riding it out.
#[derive(Clone, Copy)]
pub(crate) struct Handle<'a> {
    pub(crate) ttl: Duration,
    pub(crate) renew_every: Option<Duration>,
    pub(crate) description: Option<&'a str>,
    pub(crate) fail_fast: bool,
}

impl Handle<'_> {
    /// The lease a grant keeps, and how often it is renewed.
    pub(crate) fn lease(&self) -> (Duration, Option<Duration>) {
        (self.ttl, self.renew_every)
    }
}

/// Redis's glob (`SCAN MATCH`): `*` any run, `?` one byte, `[abc]`, `[a-z]`, `[^…]`, `\x` the byte `x`.
#[cfg(session_stores)]
pub(crate) fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|skip| glob_match(rest, &text[skip..])),
        Some((b'?', rest)) => !text.is_empty() && glob_match(rest, &text[1..]),
        Some((b'[', rest)) => {
            let Some((&c, tail)) = text.split_first() else {
                return false;
            };
            let (negated, mut class) = match rest.split_first() {
                Some((b'^', class)) => (true, class),
                _ => (false, rest),
            };
            let mut matched = false;
            loop {
                match class {
                    [] => return false,
                    [b']', after @ ..] => {
                        return matched != negated && glob_match(after, tail);
                    }
                    [b'\\', x, after @ ..] => {
                        matched |= *x == c;
                        class = after;
                    }
                    [lo, b'-', hi, after @ ..] if *hi != b']' => {
                        matched |= (*lo.min(hi)..=*lo.max(hi)).contains(&c);
                        class = after;
                    }
                    [x, after @ ..] => {
                        matched |= *x == c;
                        class = after;
                    }
                }
            }
        }
        Some((b'\\', [x, rest @ ..])) => text.first() == Some(x) && glob_match(rest, &text[1..]),
        Some((x, rest)) => text.first() == Some(x) && glob_match(rest, &text[1..]),
    }
}

#[cfg(all(test, session_stores))]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_redis_does() {
        let m = |p: &str, t: &str| glob_match(p.as_bytes(), t.as_bytes());
        assert!(m("*", "anything"));
        assert!(m("orders:*", "orders:42"));
        assert!(!m("orders:*", "order:42"));
        assert!(m("h?llo", "hello"));
        assert!(m("h[ae]llo", "hallo"));
        assert!(!m("h[^e]llo", "hello"));
        assert!(m("h[a-c]llo", "hbllo"));
        assert!(m("a\\*b", "a*b"));
        assert!(!m("a\\*b", "axb"));
        assert!(!m("h[ae", "ha"));
    }
}
