//! A lock's checked name (`LockKeys`), which every kind and every store names a lock by, the limits on names and
//! prefixes, and the key layout it carries for Redis. It lives in the engine, below every store, so that no store
//! reaches into another's folder for it.
//!
//! One lock named `N` under prefix `P` uses:
//!
//! | what | Redis name | type |
//! |---|---|---|
//! | the lock | `P:{N}` | string: the owner token with a millisecond expiry |
//! | its fencing counter | `P:{N}:fence` | string: the last fence granted |
//! | its waiting clients | `P:{N}:queue` | list of client ids, oldest first |
//! | their hand-off entries | `P:{N}:waiters` | hash: client id → `<liveness deadline, server ms> <claim ms> <token>` |
//! | the last release | `P:{N}:released` | string: the token of the last release, for the rest of its lease |
//!
//! The braces make `N` the hash tag, so every key of one lock maps to one Redis Cluster slot. Wake-ups go to
//! the waiting client's own channel, `P:wake:<client id>` (not a key).

use std::fmt;
use std::sync::Arc;

use redis::{RedisWrite, ToRedisArgs};

pub(crate) use crate::engine::ttl::millis;
use crate::error::InvalidArgument;

/// The longest lock name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 512;
/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "leasehold";
const MAX_PREFIX_LEN: usize = 64;

/// The Redis names one lock uses. Built once per [`Mutex`](crate::Mutex) handle and shared by its guards; one
/// string, since every lease of a held lock keeps one (10,000 held locks, 10,000 of these).
#[derive(Debug)]
pub(crate) struct LockKeys {
    /// `P:{N}`.
    pub(crate) lock: String,
    /// Where `N` starts in `lock`.
    name_start: usize,
}

impl LockKeys {
    pub(crate) fn new(prefix: &str, name: &str) -> Result<Arc<LockKeys>, InvalidArgument> {
        check_name(name)?;
        Ok(Arc::new(LockKeys {
            lock: format!("{prefix}:{{{name}}}"),
            name_start: prefix.len() + 2,
        }))
    }

    /// The keys of the lock whose lock key is `lock` (as a wake-up message names it), if it is one under `prefix`.
    pub(crate) fn of_key(prefix: &str, lock: &str) -> Option<Arc<LockKeys>> {
        let name = lock
            .strip_prefix(prefix)?
            .strip_prefix(":{")?
            .strip_suffix('}')?;
        LockKeys::new(prefix, name).ok()
    }

    /// The Redis Cluster hash slot of every key of the lock: CRC16 (XMODEM) of the hash tag, the text between the
    /// key's first `{` and the next `}`, modulo 16384.
    pub(crate) fn slot(&self) -> u16 {
        let tag = &self.lock.as_bytes()[self.name_start..];
        let tag = match tag.iter().position(|&b| b == b'}') {
            Some(end) if end > 0 => &tag[..end],
            // Names never start with `}` (refused); the whole key would be hashed then.
            _ => self.lock.as_bytes(),
        };
        crc16(tag) % 16384
    }

    /// The lock's name, `N`.
    pub(crate) fn name(&self) -> &str {
        &self.lock[self.name_start..self.lock.len() - 1]
    }

    /// `P:{N}:fence`.
    pub(crate) fn fence(&self) -> Suffixed<'_> {
        Suffixed(&self.lock, ":fence")
    }

    /// `P:{N}:value`: what an election's leader proclaimed last (`proclaim.lua`).
    pub(crate) fn value(&self) -> Suffixed<'_> {
        Suffixed(&self.lock, ":value")
    }

    /// `P:{N}:terms`: how many terms of an election were counted (`term.lua`).
    pub(crate) fn terms(&self) -> Suffixed<'_> {
        Suffixed(&self.lock, ":terms")
    }

    /// `P:{N}:queue`.
    pub(crate) fn queue(&self) -> Suffixed<'_> {
        Suffixed(&self.lock, ":queue")
    }

    /// `P:{N}:waiters`.
    pub(crate) fn waiters(&self) -> Suffixed<'_> {
        Suffixed(&self.lock, ":waiters")
    }

    /// `P:{N}:void`: on a quorum node, the tokens whose votes must not be granted any more (quorum_release.lua).
    pub(crate) fn void(&self) -> Suffixed<'_> {
        Suffixed(&self.lock, ":void")
    }

    /// `P:{N}:released`.
    pub(crate) fn released(&self) -> Suffixed<'_> {
        Suffixed(&self.lock, ":released")
    }
}

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), the checksum Redis Cluster hashes keys with.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// A key written as the lock key plus a suffix, without building the string first.
pub(crate) struct Suffixed<'a>(&'a str, &'static str);

impl fmt::Display for Suffixed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)?;
        f.write_str(self.1)
    }
}

impl ToRedisArgs for Suffixed<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut key = Vec::with_capacity(self.0.len() + self.1.len());
        key.extend_from_slice(self.0.as_bytes());
        key.extend_from_slice(self.1.as_bytes());
        out.write_arg(&key);
    }
}

/// The Redis keys of the lock called `name` under `prefix`: the lock key, its fence counter, its queue of waiting
/// clients, their liveness deadlines, and the memory of its last release. For cleaning up after a test or a demo, or for writing ACL key patterns; deleting them while the lock is
/// in use breaks its guarantees (the fence counter, at least, should be left alone).
///
/// # Errors
///
/// [`InvalidArgument`] for an empty, too long or otherwise refused name (see [`InvalidArgument::BadName`]), or a prefix
/// leasehold does not accept.
///
/// # Examples
///
/// ```
/// let keys = leasehold::lock_keys(leasehold::DEFAULT_PREFIX, "orders:42").unwrap();
/// assert_eq!(keys[..3], ["leasehold:{orders:42}", "leasehold:{orders:42}:fence", "leasehold:{orders:42}:queue"]);
/// assert_eq!(keys[3..], ["leasehold:{orders:42}:waiters", "leasehold:{orders:42}:released"]);
/// ```
pub fn lock_keys(prefix: &str, name: &str) -> Result<[String; 5], InvalidArgument> {
    check_prefix(prefix)?;
    let keys = LockKeys::new(prefix, name)?;
    Ok([
        keys.lock.clone(),
        keys.fence().to_string(),
        keys.queue().to_string(),
        keys.waiters().to_string(),
        keys.released().to_string(),
    ])
}

pub(crate) fn check_name(name: &str) -> Result<(), InvalidArgument> {
    if name.is_empty() {
        return Err(InvalidArgument::EmptyName);
    }
    // Redis Cluster hashes the text between the first `{` of a key and the next `}`. Our `{` comes right before
    // the name, so the tag is the name up to its first `}`: all of a lock's keys share it, unless that `}` comes
    // first and the tag is empty (then each whole key is hashed, each to its own slot).
    if name.starts_with('}') {
        return Err(InvalidArgument::BadName {
            name: name.chars().take(64).collect(),
            why: "it starts with '}', which would spread the lock's keys over several Redis Cluster slots",
        });
    }
    if name.len() > MAX_NAME_LEN {
        return Err(InvalidArgument::NameTooLong {
            len: name.len(),
            max: MAX_NAME_LEN,
        });
    }
    Ok(())
}

pub(crate) fn check_prefix(prefix: &str) -> Result<(), InvalidArgument> {
    if prefix.is_empty() || prefix.len() > MAX_PREFIX_LEN || prefix.contains(['{', '}']) {
        return Err(InvalidArgument::BadPrefix {
            prefix: prefix.to_owned(),
            rule: "non-empty, at most 64 bytes, no braces".to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_keys_of_a_lock_share_one_hash_tag() {
        let keys = LockKeys::new("leasehold", "orders:42").unwrap();
        assert_eq!(keys.lock, "leasehold:{orders:42}");
        assert_eq!(keys.fence().to_string(), "leasehold:{orders:42}:fence");
        assert_eq!(keys.queue().to_string(), "leasehold:{orders:42}:queue");
        assert_eq!(keys.waiters().to_string(), "leasehold:{orders:42}:waiters");
        assert_eq!(
            keys.released().to_string(),
            "leasehold:{orders:42}:released"
        );
        assert_eq!(keys.name(), "orders:42");
        assert_eq!(LockKeys::new("app", "{x}").unwrap().name(), "{x}");
    }

    #[test]
    fn the_cluster_slot_is_crc16_of_the_hash_tag() {
        // The check value of CRC16/XMODEM, and the slots Redis documents for these keys.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(LockKeys::new("p", "foo").unwrap().slot(), 12182);
        assert_eq!(LockKeys::new("p", "somekey").unwrap().slot(), 11058);
        assert_eq!(
            LockKeys::new("p", "a}b").unwrap().slot(),
            LockKeys::new("q", "a").unwrap().slot()
        );
    }

    #[test]
    fn names_and_prefixes_are_checked() {
        assert_eq!(check_name(""), Err(InvalidArgument::EmptyName));
        assert!(check_name(&"x".repeat(MAX_NAME_LEN)).is_ok());
        assert!(matches!(
            check_name(&"x".repeat(MAX_NAME_LEN + 1)),
            Err(InvalidArgument::NameTooLong { .. })
        ));
        assert!(matches!(
            check_name("}x"),
            Err(InvalidArgument::BadName { .. })
        ));
        assert!(matches!(
            check_name("}"),
            Err(InvalidArgument::BadName { .. })
        ));
        assert!(check_name("a}b").is_ok() && check_name("{x}").is_ok() && check_name("x{").is_ok());
        assert!(check_prefix("a{b").is_err());
        assert!(check_prefix("").is_err());
        assert!(check_prefix("app:locks").is_ok());
    }
}
