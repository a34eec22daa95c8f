//! Keys that hold something leasehold did not write: a Redis error or a script's refusal on such a key turned into
//! [`Error::NotALock`] saying what the key holds (its type, the start of a string), or [`Error::WrongKind`] when it
//! holds a lock of another kind.

use crate::backend::redis::conn::Conn;
use crate::engine::info::{HoldMode, LockKind};
use crate::error::Error;
use crate::fence::TOKEN_PREFIX;

/// Maps a `WRONGTYPE` reply (the key is a hash, list, …) to [`Error::NotALock`].
pub(crate) fn not_a_lock(err: redis::RedisError, key: &str) -> Error {
    let wrong_type = err.code() == Some("WRONGTYPE") || err.to_string().contains("WRONGTYPE");
    if wrong_type {
        Error::NotALock {
            key: key.to_owned(),
            detail: "it holds another Redis type, which leasehold did not write".to_owned(),
        }
    } else {
        err.into()
    }
}

pub(crate) fn foreign(key: &str, value: &str) -> Error {
    Error::NotALock {
        key: key.to_owned(),
        detail: format!(
            "it holds the string {}, which leasehold did not write",
            excerpt(value.as_bytes())
        ),
    }
}

/// A failed script call on the lock at `key`: [`Error::NotALock`] (saying what the key holds) for `WRONGTYPE`,
/// [`Error::Redis`] otherwise.
pub(crate) async fn script_error(conn: &Conn, key: &str, err: redis::RedisError) -> Error {
    explain_foreign(conn, key, not_a_lock(err, key)).await
}

/// `err` with a [`Error::NotALock`] about `key` made precise: the key's Redis type, and for a string the start of
/// its value (read now, on this error path only). Any other error, or a failed read, is returned as it is.
pub(crate) async fn explain_foreign(conn: &Conn, key: &str, err: Error) -> Error {
    let Error::NotALock { key: bad, .. } = &err else {
        return err;
    };
    if bad != key {
        return err;
    }
    let mut conn = conn.clone();
    let Ok(kind) = redis::cmd("TYPE")
        .arg(key)
        .query_async::<String>(&mut conn)
        .await
    else {
        return err;
    };
    let detail = match kind.as_str() {
        "string" => match redis::cmd("GETRANGE")
            .arg(key)
            .arg(0)
            .arg(EXCERPT_BYTES)
            .query_async::<Vec<u8>>(&mut conn)
            .await
        {
            Ok(value) if value.starts_with(TOKEN_PREFIX.as_bytes()) => {
                return wrong_kind(key, LockKind::Mutex);
            }
            Ok(value) => format!(
                "it holds the string {}, which leasehold did not write",
                excerpt(&value)
            ),
            Err(_) => return err,
        },
        // The first hold by score: from 0 up, past a semaphore's capacity member (a negative score, see set.lua).
        "zset" => match redis::cmd("ZRANGEBYSCORE")
            .arg(key)
            .arg(0)
            .arg("+inf")
            .arg("LIMIT")
            .arg(0)
            .arg(1)
            .query_async::<Vec<String>>(&mut conn)
            .await
        {
            Ok(first) if first.first().is_some_and(|h| h.contains(TOKEN_PREFIX)) => {
                return wrong_kind(key, HoldMode::of(&first[0]).kind());
            }
            Ok(_) => "it holds a Redis zset, which leasehold did not write".to_owned(),
            Err(_) => return err,
        },
        // Gone (or changed) between the failed call and this read: say what was seen.
        "none" => return err,
        other => format!("it holds a Redis {other}, which leasehold did not write"),
    };
    Error::NotALock {
        key: key.to_owned(),
        detail,
    }
}

/// A script's refusal of the lock key `key` because it holds a leasehold lock of another kind, `kind` (the byte the
/// script classified it as, in the same step: `held_as` in grant.lua): [`Error::WrongKind`]. Classified by the script,
/// not by a later read: a lock of the other kind released between the refusal and the read would read as gone, and was
/// reported as a key leasehold did not write (issue 33: a plain run beside `--shared` runs exited 65).
pub(crate) fn held_as(key: &str, kind: i64) -> Error {
    let found = match u8::try_from(kind).map(char::from) {
        Ok('m') => LockKind::Mutex,
        Ok('r') => LockKind::ReadWrite,
        Ok('s') => LockKind::Semaphore,
        Ok('e') => LockKind::Reentrant,
        _ => LockKind::Fair,
    };
    wrong_kind(key, found)
}

/// The error for the lock key `key` holding a lock of kind `found`.
fn wrong_kind(key: &str, found: LockKind) -> Error {
    let name = key
        .split_once(":{")
        .and_then(|(_, rest)| rest.strip_suffix('}'))
        .unwrap_or(key);
    Error::WrongKind {
        name: name.to_owned(),
        found,
    }
}

/// How much of a foreign string value an error shows.
const EXCERPT_BYTES: usize = 40;

/// The first [`EXCERPT_BYTES`] of `value`, quoted, with `…` when there is more (invalid UTF-8 shown lossily).
fn excerpt(value: &[u8]) -> String {
    let cut = value.len() > EXCERPT_BYTES;
    let text = String::from_utf8_lossy(&value[..value.len().min(EXCERPT_BYTES)]);
    let mut shown = format!("{text:?}");
    if cut {
        shown.push('…');
    }
    shown
}
