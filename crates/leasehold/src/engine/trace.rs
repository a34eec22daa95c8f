//! Tracing targets per lock kind, so that `RUST_LOG=leasehold::semaphore=debug` (or any subscriber's filter) shows
//! one kind's grants, waits, releases and losses without the others'.
//!
//! The kind of a grant is read from its hold as Redis stores it: a mutex's bare owner token, or the queued kinds'
//! `"<tag> <token>"` (set.lua). Events name the hold in words (`hold = "2 permits"`), not by its tag.

use std::borrow::Cow;

use crate::fence::TOKEN_PREFIX;

/// The lock kind whose target an event goes out under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `leasehold::mutex`
    Mutex,
    /// `leasehold::fair_mutex`
    Fair,
    /// `leasehold::rw_lock`
    RwLock,
    /// `leasehold::semaphore`
    Semaphore,
    /// `leasehold::reentrant_mutex`
    Reentrant,
}

/// The kind of the hold `hold` (an owner token or `"<tag> <token>"`), and what it holds in words.
pub(crate) fn of_hold(hold: &str) -> (Kind, Cow<'static, str>) {
    if hold.starts_with(TOKEN_PREFIX) {
        return (Kind::Mutex, "exclusive".into());
    }
    let tag = hold.split(' ').next().unwrap_or_default();
    of_tag(tag)
}

/// The kind of the hold `hold` alone: what choosing the target costs on every grant, with nothing allocated (the
/// words of [`of_hold`] are built only when an event is enabled).
pub(crate) fn kind_of_hold(hold: &str) -> Kind {
    match hold.as_bytes().first() {
        _ if hold.starts_with(TOKEN_PREFIX) => Kind::Mutex,
        Some(b'x') => Kind::Fair,
        Some(b'r' | b'w') => Kind::RwLock,
        Some(b's') => Kind::Semaphore,
        Some(b'e' | b'n') => Kind::Reentrant,
        _ => Kind::Mutex,
    }
}

/// What the hold `hold` holds, in words (for an event's `hold` field).
pub(crate) fn words(hold: &str) -> Cow<'static, str> {
    of_hold(hold).1
}

/// The kind of a queued hold's tag (`x`, `r`, `w`, `s<k>`, `e`, `n`), and what it holds in words.
pub(crate) fn of_tag(tag: &str) -> (Kind, Cow<'static, str>) {
    match tag {
        "x" => (Kind::Fair, "exclusive".into()),
        "r" => (Kind::RwLock, "read share".into()),
        "w" => (Kind::RwLock, "write lock".into()),
        "e" => (Kind::Reentrant, "root grant".into()),
        "n" => (Kind::Reentrant, "nested hold".into()),
        _ => match tag.strip_prefix('s').and_then(|k| k.parse::<u64>().ok()) {
            Some(1) => (Kind::Semaphore, "1 permit".into()),
            Some(k) => (Kind::Semaphore, format!("{k} permits").into()),
            None => (Kind::Mutex, tag.to_owned().into()),
        },
    }
}

/// A tracing event (`debug`, `info`, `warn`, …) under the target of the lock kind `$kind` ([`Kind`]).
macro_rules! kind_event {
    ($kind:expr, $level:ident, $($arg:tt)+) => {
        match $kind {
            $crate::engine::trace::Kind::Mutex => tracing::$level!(target: "leasehold::mutex", $($arg)+),
            $crate::engine::trace::Kind::Fair => tracing::$level!(target: "leasehold::fair_mutex", $($arg)+),
            $crate::engine::trace::Kind::RwLock => tracing::$level!(target: "leasehold::rw_lock", $($arg)+),
            $crate::engine::trace::Kind::Semaphore => tracing::$level!(target: "leasehold::semaphore", $($arg)+),
            $crate::engine::trace::Kind::Reentrant => tracing::$level!(target: "leasehold::reentrant_mutex", $($arg)+),
        }
    };
}

/// A debug span (the `acquire` span of a wait) under the target of the lock kind `$kind` ([`Kind`]).
macro_rules! kind_span {
    ($kind:expr, $($arg:tt)+) => {
        match $kind {
            $crate::engine::trace::Kind::Mutex => tracing::debug_span!(target: "leasehold::mutex", $($arg)+),
            $crate::engine::trace::Kind::Fair => tracing::debug_span!(target: "leasehold::fair_mutex", $($arg)+),
            $crate::engine::trace::Kind::RwLock => tracing::debug_span!(target: "leasehold::rw_lock", $($arg)+),
            $crate::engine::trace::Kind::Semaphore => tracing::debug_span!(target: "leasehold::semaphore", $($arg)+),
            $crate::engine::trace::Kind::Reentrant => {
                tracing::debug_span!(target: "leasehold::reentrant_mutex", $($arg)+)
            }
        }
    };
}

pub(crate) use {kind_event, kind_span};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_names_its_kind_and_what_it_holds() {
        let token = "dl1:0123456789abcdef0123456789abcdef";
        assert_eq!(of_hold(token), (Kind::Mutex, "exclusive".into()));
        assert_eq!(
            of_hold(&format!("x {token}")),
            (Kind::Fair, "exclusive".into())
        );
        assert_eq!(
            of_hold(&format!("r {token}")),
            (Kind::RwLock, "read share".into())
        );
        assert_eq!(
            of_hold(&format!("w {token}")),
            (Kind::RwLock, "write lock".into())
        );
        assert_eq!(
            of_hold(&format!("s1 {token}")),
            (Kind::Semaphore, "1 permit".into())
        );
        assert_eq!(
            of_hold(&format!("s12 {token}")),
            (Kind::Semaphore, "12 permits".into())
        );
        assert_eq!(
            of_hold(&format!("e {token}")),
            (Kind::Reentrant, "root grant".into())
        );
        assert_eq!(
            of_hold(&format!("n {token}")),
            (Kind::Reentrant, "nested hold".into())
        );
        for hold in [
            token.to_owned(),
            format!("x {token}"),
            format!("r {token}"),
            format!("w {token}"),
            format!("s12 {token}"),
            format!("e {token}"),
            format!("n {token}"),
        ] {
            assert_eq!(kind_of_hold(&hold), of_hold(&hold).0, "{hold}");
        }
    }
}
