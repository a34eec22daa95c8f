//! The key layout and the kinds: which key a waiter writes, and when a waiter is admitted, given the keys ahead of
//! it in create-revision order.

use std::fmt;

use super::EtcdError;
#[cfg(test)]
use crate::backend::admission::Admission as Rule;
pub use crate::backend::admission::Kind;

/// The longest lock path accepted, in bytes.
pub const MAX_PATH_LEN: usize = 1024;

/// Marks a key as leasehold's, in this layout's version.
const MARK: &str = "lh1";

/// The tag of a kind in a key, which other clients read to apply the rule.
struct Tag(Kind);

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Kind::Exclusive => f.write_str("x"),
            Kind::Shared => f.write_str("s"),
            Kind::Permits(n) => write!(f, "p{n}"),
        }
    }
}

/// The prefix every waiter of lock `path` writes under: `path/`, as `etcdctl lock path` (Go's `concurrency.Mutex`)
/// does.
pub(crate) fn prefix(path: &str) -> Result<String, EtcdError> {
    if path.is_empty() || path.ends_with('/') || path.len() > MAX_PATH_LEN {
        return Err(EtcdError::InvalidPath(path.to_owned()));
    }
    Ok(format!("{path}/"))
}

/// The waiter key of one grant: its [`waiter_stem`], then the grant id in hex: `<path>/<lease id
/// hex>/lh1.<tag>.<grant id hex>`.
pub(crate) fn waiter_key(stem: &str, grant: u64) -> String {
    format!("{stem}{grant:016x}")
}

/// The waiter keys of one lock, lease and kind without their grant id (see [`FreeKeys`]): `<path>/<lease id
/// hex>/lh1.<tag>.`.
pub(crate) fn waiter_stem(prefix: &str, lease: i64, kind: Kind) -> String {
    format!("{prefix}{lease:x}/{MARK}.{}.", Tag(kind))
}

/// Waiter keys a session wrote and then deleted with its own release, for its next acquisitions of the same lock as
/// the same kind. etcd keeps a deleted key in its index until the next compaction, and every range of a lock's
/// prefix (each enqueue's) visits it: a client that wrote a new key per acquisition made each acquisition of a lock
/// slower than the last until a compaction (`uncontended-1` 0.75 → 0.41 × etcd's `Lock` over four runs on one member,
/// docs/BENCHMARKS.md), where `etcdctl lock` reuses one key per session. A key is kept only when nothing but that
/// release can have deleted it, and nothing can write it again: its enqueue was answered on its first try (no
/// earlier try can land later) and the release's compare (lease and create revision) succeeded. A reused key gets a
/// new create revision, so the ownership compare of any older grant of the same key fails, and waiters of other
/// clients see its delete, then a key behind them. At most [`FreeKeys::MAX`] are kept.
#[derive(Default)]
pub(crate) struct FreeKeys {
    /// By the key without its grant id (lock, lease and kind), the keys free to write again.
    by_stem: std::collections::HashMap<String, Vec<String>>,
    count: usize,
}

impl FreeKeys {
    /// The most keys kept: a client that takes more locks at once than this writes new keys for the rest.
    pub(crate) const MAX: usize = 1024;

    /// A free key of the same lock, lease and kind as `stem` names, if one is kept.
    pub(crate) fn take(&mut self, stem: &str) -> Option<String> {
        let keys = self.by_stem.get_mut(stem)?;
        let key = keys.pop();
        if keys.is_empty() {
            self.by_stem.remove(stem);
        }
        self.count -= usize::from(key.is_some());
        key
    }

    /// Keeps `key` (one of [`waiter_key`]'s, known deleted) for the next acquisition that would write its stem.
    pub(crate) fn put(&mut self, key: String) {
        let Some(stem) = stem(&key) else { return };
        if self.count >= Self::MAX {
            // Forget one lock's keys: any, as the pool is only a saving.
            let Some(any) = self.by_stem.keys().next().cloned() else {
                return;
            };
            self.count -= self.by_stem.remove(&any).map_or(0, |keys| keys.len());
        }
        self.by_stem.entry(stem.to_owned()).or_default().push(key);
        self.count += 1;
    }
}

/// The key without its grant id (its [`waiter_stem`]).
fn stem(key: &str) -> Option<&str> {
    key.len()
        .checked_sub(16)
        .and_then(|at| key.get(..at))
        .filter(|stem| stem.ends_with('.'))
}

/// The kind of the key `key` under `prefix`, as every client reads it: leasehold's own tag when it is one of
/// leasehold's keys of exactly this lock, [`Kind::Exclusive`] otherwise. Keys leasehold did not write (`etcdctl
/// lock`'s `NAME/<lease>`, or anything else) count as exclusive: whoever wrote them expects to be alone once first.
pub(crate) fn key_kind(prefix: &str, key: &[u8]) -> Kind {
    let parsed = || -> Option<Kind> {
        let rest = std::str::from_utf8(key).ok()?.strip_prefix(prefix)?;
        let (lease, leaf) = rest.split_once('/')?;
        if lease.is_empty() || !lease.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut parts = leaf.split('.');
        let (mark, tag, grant) = (parts.next()?, parts.next()?, parts.next()?);
        if mark != MARK || grant.len() != 16 || parts.next().is_some() {
            return None;
        }
        match tag {
            "x" => Some(Kind::Exclusive),
            "s" => Some(Kind::Shared),
            _ => tag.strip_prefix('p')?.parse().ok().map(Kind::Permits),
        }
    };
    parsed().unwrap_or(Kind::Exclusive)
}

#[cfg(test)]
/// The answer of the admission rule, with the key to watch.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Admitted.
    Granted,
    /// Not yet: wait until this key ahead is deleted, then look again.
    WaitFor(Vec<u8>),
    /// Not yet: wait until any key under the prefix is deleted, then look again.
    WaitForAny,
    /// Refused: a permit key ahead has this other count.
    WrongPermits(std::num::NonZeroU32),
}

#[cfg(test)]
/// Applies `kind`'s rule ([`crate::backend::admission::admit`]) to the keys ahead of a waiter (`ahead`: every key
/// under `prefix` with a smaller create revision, oldest first).
pub(crate) fn admit(kind: Kind, prefix: &str, ahead: &[Vec<u8>]) -> Admission {
    let kinds: Vec<Kind> = ahead.iter().map(|key| key_kind(prefix, key)).collect();
    match crate::backend::admission::admit(kind, &kinds) {
        Rule::Granted => Admission::Granted,
        Rule::WaitFor(i) => Admission::WaitFor(ahead[i].clone()),
        Rule::WaitForAny => Admission::WaitForAny,
        Rule::WrongPermits(stored) => Admission::WrongPermits(stored),
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;

    fn keys(list: &[&str]) -> Vec<Vec<u8>> {
        list.iter().map(|k| k.as_bytes().to_vec()).collect()
    }

    fn key(prefix: &str, lease: i64, kind: Kind, grant: u64) -> String {
        waiter_key(&waiter_stem(prefix, lease, kind), grant)
    }

    fn permits(n: u32) -> Kind {
        Kind::Permits(NonZeroU32::new(n).unwrap())
    }

    #[test]
    fn keys_carry_the_lease_first_then_the_kind_and_the_grant() {
        let p = prefix("jobs/nightly").unwrap();
        assert_eq!(
            key(&p, 0x694d, Kind::Exclusive, 0xab),
            "jobs/nightly/694d/lh1.x.00000000000000ab"
        );
        assert_eq!(
            key(&p, 1, permits(3), 2),
            "jobs/nightly/1/lh1.p3.0000000000000002"
        );
        for bad in ["", "a/", &"x".repeat(MAX_PATH_LEN + 1)] {
            assert!(prefix(bad).is_err());
        }
    }

    #[test]
    fn free_keys_are_taken_by_the_same_lock_lease_and_kind_only() {
        let p = prefix("l").unwrap();
        let mut free = FreeKeys::default();
        let key = key(&p, 7, Kind::Shared, 0xab);
        free.put(key.clone());
        let stem_of = |kind, lease| waiter_stem(&p, lease, kind);
        assert_eq!(free.take(&stem_of(Kind::Exclusive, 7)), None);
        assert_eq!(free.take(&stem_of(Kind::Shared, 8)), None);
        assert_eq!(free.take(&stem_of(Kind::Shared, 7)), Some(key));
        assert_eq!(free.take(&stem_of(Kind::Shared, 7)), None);
        assert_eq!(free.count, 0);
    }

    #[test]
    fn free_keys_are_bounded() {
        let mut free = FreeKeys::default();
        for lock in 0..FreeKeys::MAX + 10 {
            free.put(key(&format!("l{lock}/"), 1, Kind::Exclusive, 1));
        }
        assert!(free.count <= FreeKeys::MAX);
        assert_eq!(
            free.count,
            free.by_stem.values().map(Vec::len).sum::<usize>()
        );
    }

    #[test]
    fn foreign_keys_count_as_writers() {
        let p = "l/";
        assert_eq!(
            key_kind(p, key(p, 7, Kind::Shared, 1).as_bytes()),
            Kind::Shared
        );
        assert_eq!(key_kind(p, key(p, 7, permits(2), 1).as_bytes()), permits(2));
        // etcdctl lock's key, a nested lock's key, garbage.
        for foreign in [
            "l/694d7a2b3c1e0f05",
            "l/sub/7/lh1.s.0000000000000001",
            "l/7/lh1.s.1",
            "l/7/lh2.s.0000000000000001",
        ] {
            assert_eq!(
                key_kind(p, foreign.as_bytes()),
                Kind::Exclusive,
                "{foreign}"
            );
        }
    }

    #[test]
    fn exclusive_waits_for_the_key_just_ahead() {
        assert_eq!(admit(Kind::Exclusive, "l/", &[]), Admission::Granted);
        let ahead = keys(&["l/1/lh1.s.0000000000000001", "l/2/lh1.s.0000000000000001"]);
        assert_eq!(
            admit(Kind::Exclusive, "l/", &ahead),
            Admission::WaitFor(ahead[1].clone())
        );
    }

    #[test]
    fn readers_wait_only_for_the_last_writer_ahead() {
        let readers = keys(&["l/1/lh1.s.0000000000000001", "l/2/lh1.s.0000000000000002"]);
        assert_eq!(admit(Kind::Shared, "l/", &readers), Admission::Granted);
        let mixed = keys(&[
            "l/1/lh1.x.0000000000000001",
            "l/694d7a2b3c1e0f05",
            "l/2/lh1.s.0000000000000002",
        ]);
        assert_eq!(
            admit(Kind::Shared, "l/", &mixed),
            Admission::WaitFor(mixed[1].clone())
        );
    }

    #[test]
    fn permits_admit_fewer_than_n_ahead_and_only_permits() {
        let one = keys(&["l/1/lh1.p2.0000000000000001"]);
        assert_eq!(admit(permits(2), "l/", &one), Admission::Granted);
        let two = keys(&["l/1/lh1.p2.0000000000000001", "l/2/lh1.p2.0000000000000002"]);
        assert_eq!(admit(permits(2), "l/", &two), Admission::WaitForAny);
        let writer = keys(&["l/1/lh1.x.0000000000000001"]);
        assert_eq!(admit(permits(2), "l/", &writer), Admission::WaitForAny);
    }
}
