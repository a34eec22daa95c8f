//! The Lua scripts, one file each under `scripts/`. Every file opens with its KEYS, ARGV and return values.
//!
//! Scripts run atomically on the server, which is what makes "compare the owner, then delete" safe.
//! [`redis::Script`] sends `EVALSHA` and loads the script once on `NOSCRIPT` (after a restart, for example).

use std::sync::LazyLock;

use redis::Script;

pub(crate) static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/acquire.lua")));
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/release.lua")));
pub(crate) static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/renew.lua")));
pub(crate) static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/inspect.lua")));
pub(crate) static FORCE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/force_release.lua")));

/// The most leases one renewal call carries. 10,000 held locks cost 20 calls per renewal round.
pub(crate) const RENEW_BATCH: usize = 500;
