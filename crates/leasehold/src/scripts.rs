//! The Lua scripts, one file each under `scripts/`. Every file opens with its KEYS, ARGV and return values.
//!
//! Scripts run atomically on the server, which is what makes "compare the owner, then delete" safe.
//! [`redis::Script`] sends `EVALSHA` and loads the script once on `NOSCRIPT` (after a restart, for example).
//! `wake_next.lua` is a helper function prepended to the scripts that wake a waiter, and every script starts with
//! the constants `RESERVATION_MS`, `LIVENESS_MS` and `QUEUE_RETENTION_MS` (see [`script`]).

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

/// Builds a script: the constants below as Lua locals, the wake-up helper when `wake` is set, then `body`. The
/// constants travel in the script text rather than as arguments: every argument costs the server an object per call.
fn script(wake: bool, body: &str) -> Script {
    let mut text = format!(
        "local RESERVATION_MS = {}\nlocal LIVENESS_MS = {}\nlocal QUEUE_RETENTION_MS = {}\n",
        RESERVATION.as_millis(),
        LIVENESS.as_millis(),
        QUEUE_RETENTION.as_millis(),
    );
    if wake {
        text.push_str(include_str!("scripts/wake_next.lua"));
    }
    text.push_str(body);
    Script::new(&text)
}

pub(crate) static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| script(false, include_str!("scripts/acquire.lua")));
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| script(true, include_str!("scripts/release.lua")));
pub(crate) static PASS_ON: LazyLock<Script> =
    LazyLock::new(|| script(true, include_str!("scripts/pass_on.lua")));
pub(crate) static FORCE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| script(true, include_str!("scripts/force_release.lua")));
pub(crate) static RENEW: LazyLock<Script> =
    LazyLock::new(|| script(false, include_str!("scripts/renew.lua")));
pub(crate) static INSPECT: LazyLock<Script> =
    LazyLock::new(|| script(false, include_str!("scripts/inspect.lua")));
pub(crate) static PROBE: LazyLock<Script> =
    LazyLock::new(|| script(false, include_str!("scripts/probe.lua")));

/// The most leases one renewal call carries. 10,000 held locks cost 20 calls per renewal round.
pub(crate) const RENEW_BATCH: usize = 500;

/// How long a woken waiter has to claim the lock before anyone else may take it. Long enough for a wake-up and one
/// round trip on a loaded host; short enough that a woken client that stalls costs others little.
pub(crate) const RESERVATION: Duration = Duration::from_millis(50);

/// How long a lock's queue of waiting clients outlives the holder's lease (every busy attempt refreshes it).
pub(crate) const QUEUE_RETENTION: Duration = Duration::from_secs(60);

/// A waiting client makes an attempt at least this often (its heartbeat), which renews its queue entry's liveness.
/// It also bounds how long a free lock can go unnoticed by its waiters after a lost wake-up or a reservation that
/// its client never claimed (a process that died, or paused, right after it was woken).
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(1);

/// A queue entry counts as alive this long after its client's last attempt: three heartbeats, so one slow or lost
/// attempt does not drop a live waiter. A dead client is skipped by releases from then on.
pub(crate) const LIVENESS: Duration = Duration::from_secs(3);
