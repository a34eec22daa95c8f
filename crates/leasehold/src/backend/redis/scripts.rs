//! The Lua scripts, one file each under `scripts/`. Every file opens with its KEYS, ARGV and return values.
//!
//! Scripts run atomically on the server, which is what makes "compare the owner, then delete" safe.
//! [`redis::Script`] sends `EVALSHA` and loads the script once on `NOSCRIPT` (after a restart, for example).
//! `grant.lua` (the server clock, the fence), `hand_off.lua` (a mutex release granting the next waiter) and `set.lua`
//! (the holds and queue of the queued kinds) are helper functions prepended to the scripts that use them, after the constants `LIVENESS_MS` and `QUEUE_RETENTION_MS`
//! (see [`source`]).

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

/// The helper files a script is built from, besides its own: `grant.lua` (the clock, the fence), `hand_off.lua` (a
/// mutex release granting the next waiting client), `set.lua` (the queued kinds' holds and queue).
const GRANT: &str = include_str!("scripts/grant.lua");
const HAND_OFF: &str = include_str!("scripts/hand_off.lua");
const SET: &str = include_str!("scripts/set.lua");

/// The text of a script as it is loaded: the constants below as Lua locals, the helpers it uses, then `body`. The
/// constants travel in the script text rather than as arguments: every argument costs the server an object per call.
fn text(helpers: &[&str], body: &str) -> String {
    let mut text = format!(
        "local LIVENESS_MS = {}\nlocal QUEUE_RETENTION_MS = {}\n",
        LIVENESS.as_millis(),
        QUEUE_RETENTION.as_millis(),
    );
    for helper in helpers {
        text.push_str(helper);
    }
    text.push_str(body);
    text
}

/// The full text of a script as leasehold loads it, by file name without `.lua` (`acquire`, `set_acquire`,
/// `release`, `leave`, `downgrade`, `set_permits`, `reenter`, `renew`, `force_release`, `inspect`, `proclaim`, `term`, `probe`, `fence_up`, `quorum_acquire`, `quorum_release`, `quorum_withdraw`). For tests that replay a script by hand; not a
/// stable interface.
#[doc(hidden)]
pub fn source(name: &str) -> Option<String> {
    let (helpers, body): (&[&str], &str) = match name {
        "acquire" => (&[GRANT], include_str!("scripts/acquire.lua")),
        "set_acquire" => (&[GRANT, SET], include_str!("scripts/set_acquire.lua")),
        "release" => (&[GRANT, HAND_OFF, SET], include_str!("scripts/release.lua")),
        "leave" => (&[GRANT, SET], include_str!("scripts/leave.lua")),
        "downgrade" => (&[GRANT, SET], include_str!("scripts/downgrade.lua")),
        "set_permits" => (&[GRANT, SET], include_str!("scripts/set_permits.lua")),
        "reenter" => (&[GRANT, SET], include_str!("scripts/reenter.lua")),
        "force_release" => (
            &[GRANT, HAND_OFF, SET],
            include_str!("scripts/force_release.lua"),
        ),
        "renew" => (&[], include_str!("scripts/renew.lua")),
        "inspect" => (&[], include_str!("scripts/inspect.lua")),
        "proclaim" => (&[], include_str!("scripts/proclaim.lua")),
        "term" => (&[], include_str!("scripts/term.lua")),
        "probe" => (&[], include_str!("scripts/probe.lua")),
        "fence_up" => (&[], include_str!("scripts/fence_up.lua")),
        "quorum_acquire" => (&[GRANT, SET], include_str!("scripts/quorum_acquire.lua")),
        "quorum_release" => (&[], include_str!("scripts/quorum_release.lua")),
        "quorum_withdraw" => (&[], include_str!("scripts/quorum_withdraw.lua")),
        _ => return None,
    };
    Some(text(helpers, body))
}

fn script(name: &str) -> Script {
    Script::new(&source(name).unwrap_or_default())
}

pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| script("acquire"));
pub(crate) static SET_ACQUIRE: LazyLock<Script> = LazyLock::new(|| script("set_acquire"));
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| script("release"));
pub(crate) static LEAVE: LazyLock<Script> = LazyLock::new(|| script("leave"));
pub(crate) static DOWNGRADE: LazyLock<Script> = LazyLock::new(|| script("downgrade"));
pub(crate) static SET_PERMITS: LazyLock<Script> = LazyLock::new(|| script("set_permits"));
pub(crate) static REENTER: LazyLock<Script> = LazyLock::new(|| script("reenter"));
pub(crate) static FORCE_RELEASE: LazyLock<Script> = LazyLock::new(|| script("force_release"));
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| script("renew"));
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| script("inspect"));
pub(crate) static PROCLAIM: LazyLock<Script> = LazyLock::new(|| script("proclaim"));
pub(crate) static TERM: LazyLock<Script> = LazyLock::new(|| script("term"));
pub(crate) static PROBE: LazyLock<Script> = LazyLock::new(|| script("probe"));
pub(crate) static FENCE_UP: LazyLock<Script> = LazyLock::new(|| script("fence_up"));
pub(crate) static QUORUM_ACQUIRE: LazyLock<Script> = LazyLock::new(|| script("quorum_acquire"));
pub(crate) static QUORUM_RELEASE: LazyLock<Script> = LazyLock::new(|| script("quorum_release"));
pub(crate) static QUORUM_WITHDRAW: LazyLock<Script> = LazyLock::new(|| script("quorum_withdraw"));

/// A call of `script` built straight into the `EVALSHA` command that carries it: keys first (as many as declared to
/// [`ScriptCall::new`]), then arguments. [`redis::ScriptInvocation`] keeps every key and argument in an allocation of
/// its own and copies them all into a command on each send; on the path of every lock (acquire, release) building here
/// instead, into two buffers sized once, saved the client about 4,300 of 52,000 instructions per cycle
/// (`scripts/profile-client.sh`). Loaded on `NOSCRIPT` (a restarted server) and sent again, as `ScriptInvocation` does.
pub(crate) struct ScriptCall {
    script: &'static Script,
    cmd: redis::Cmd,
    /// Keys still to come before the first argument.
    keys_left: usize,
}

impl ScriptCall {
    /// A call of `script` with `keys` keys.
    pub(crate) fn new(script: &'static Script, keys: usize) -> ScriptCall {
        // Room for the usual lock: a key name of a few dozen bytes, an argument or so per key (a token, a lease).
        let mut cmd = redis::Cmd::with_capacity(3 + 3 * keys, 64 + 96 * keys);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
        ScriptCall {
            script,
            cmd,
            keys_left: keys,
        }
    }

    /// Adds the next key.
    pub(crate) fn key(&mut self, key: impl redis::ToRedisArgs) -> &mut ScriptCall {
        debug_assert!(self.keys_left > 0, "more keys than declared");
        self.keys_left = self.keys_left.saturating_sub(1);
        self.cmd.arg(key);
        self
    }

    /// Adds the next argument, after every key.
    pub(crate) fn arg(&mut self, arg: impl redis::ToRedisArgs) -> &mut ScriptCall {
        debug_assert_eq!(self.keys_left, 0, "an argument before the last key");
        self.cmd.arg(arg);
        self
    }

    /// The `EVALSHA` command as built so far.
    pub(crate) fn cmd(&self) -> &redis::Cmd {
        &self.cmd
    }

    /// Runs the call on `conn`, loading the script first if the server does not have it.
    pub(crate) async fn invoke_async<T: redis::FromRedisValue + Send>(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
    ) -> redis::RedisResult<T> {
        match self.cmd.query_async(conn).await {
            Err(err) if is_no_script(&err) => {
                self.script.load_async(conn).await?;
                self.cmd.query_async(conn).await
            }
            result => result,
        }
    }

    /// [`ScriptCall::invoke_async`] on a blocking connection.
    pub(crate) fn invoke<T: redis::FromRedisValue>(
        &self,
        conn: &mut dyn redis::ConnectionLike,
    ) -> redis::RedisResult<T> {
        match self.cmd.query(conn) {
            Err(err) if is_no_script(&err) => {
                self.script.load(conn)?;
                self.cmd.query(conn)
            }
            result => result,
        }
    }
}

fn is_no_script(err: &redis::RedisError) -> bool {
    err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// A script's reply of integers. The scripts on every lock's path (`acquire`, `set_acquire`, `release`) answer one
/// string of decimal integers separated by spaces (`table.concat`) rather than an array of them: redis-rs parses an
/// array element by element through its general value parser, while one bulk string is parsed once and split here:
/// about 7,500 of the client's 56,600 instructions per acquire-release cycle (`scripts/profile-client.sh`). An array of integers is read too (the other scripts answer that way).
pub(crate) struct Numbers(pub(crate) Vec<i64>);

impl redis::FromRedisValue for Numbers {
    fn from_redis_value(value: redis::Value) -> Result<Numbers, redis::ParsingError> {
        let redis::Value::BulkString(bytes) = value else {
            return Vec::<i64>::from_redis_value(value).map(Numbers);
        };
        let mut numbers = Vec::with_capacity(bytes.len() / 4 + 1);
        if !bytes.is_empty() {
            for word in bytes.split(|&b| b == b' ') {
                match integer(word) {
                    Some(n) => numbers.push(n),
                    None => {
                        return Err(redis::ParsingError::from(format!(
                            "not a list of integers: {:?}",
                            String::from_utf8_lossy(&bytes)
                        )))
                    }
                }
            }
        }
        Ok(Numbers(numbers))
    }
}

/// A decimal integer with an optional minus sign, as Lua's `tostring` writes one (`None` for anything else, or one
/// out of range).
fn integer(word: &[u8]) -> Option<i64> {
    let (negative, digits) = match word {
        [b'-', digits @ ..] => (true, digits),
        digits => (false, digits),
    };
    if digits.is_empty() {
        return None;
    }
    let mut n: i64 = 0;
    for &digit in digits {
        if !digit.is_ascii_digit() {
            return None;
        }
        let digit = i64::from(digit - b'0');
        n = n.checked_mul(10)?;
        n = if negative {
            n.checked_sub(digit)?
        } else {
            n.checked_add(digit)?
        };
    }
    Some(n)
}

/// The `renew.lua` call for `leases`, each for its own lease length.
pub(crate) fn renew_invocation(
    leases: &[std::sync::Arc<crate::engine::lease::LeaseShared>],
) -> ScriptCall {
    let mut invocation = ScriptCall::new(&RENEW, leases.len());
    for lease in leases {
        invocation.key(&lease.keys.lock);
    }
    for lease in leases {
        invocation
            .arg(&lease.token)
            .arg(crate::engine::ttl::millis(lease.ttl));
    }
    invocation
}

/// How long a lock's queue of waiting clients outlives the holder's lease (every busy attempt refreshes it).
pub(crate) const QUEUE_RETENTION: Duration = Duration::from_secs(60);

/// A waiting client makes an attempt at least this often (its heartbeat), which renews its queue entry's liveness
/// and the token a release would hand the lock to. It also bounds how long a free lock can go unnoticed by its
/// waiters after a lost wake-up.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(1);

/// A queue entry counts as alive this long after its client's last attempt: three heartbeats, so one slow or lost
/// attempt does not drop a live waiter. A dead client is skipped by releases from then on.
pub(crate) const LIVENESS: Duration = Duration::from_secs(3);

/// The longest claim lease: a release hands the lock to a waiter for `min(its lease, CLAIM)`, and the new holder
/// extends it to its whole lease at once, off its critical path. A waiter that died within its liveness window (so
/// that the release still saw it live) thus holds the lock for at most this long, never for a whole lease. Two
/// heartbeats: a waiter's registered token is at most about one heartbeat old when it is granted, so the new holder
/// usually keeps about a heartbeat of validity and needs no round trip before it starts.
pub(crate) const CLAIM: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use redis::{FromRedisValue, Value};

    use super::Numbers;

    fn numbers(reply: &str) -> Result<Vec<i64>, redis::ParsingError> {
        Numbers::from_redis_value(Value::BulkString(reply.as_bytes().to_vec())).map(|n| n.0)
    }

    #[test]
    fn a_flat_reply_reads_as_its_integers() {
        assert_eq!(
            numbers("1 -2 0 9223372036854775807 -9223372036854775808").unwrap(),
            vec![1, -2, 0, i64::MAX, i64::MIN]
        );
        assert_eq!(numbers("").unwrap(), Vec::<i64>::new());
        let array = Value::Array(vec![Value::Int(3), Value::Int(-4)]);
        assert_eq!(Numbers::from_redis_value(array).unwrap().0, vec![3, -4]);
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "1 x",
            "1  2",
            " 1",
            "+1",
            "-",
            "1.5",
            "9223372036854775808",
            "-9223372036854775809",
        ] {
            assert!(
                numbers(bad).is_err(),
                "{bad:?} was read as {:?}",
                numbers(bad)
            );
        }
    }
}
