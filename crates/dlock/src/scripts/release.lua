-- release: give the lock up only if we still own it, handing it to the oldest live waiting client. Idempotent per
-- token: a release that ran before (a retry after a lost reply) answers 1 again, without touching anything.
--
-- KEYS[1]  lock key
-- KEYS[2]  queue key (waiting client ids, oldest first)
-- KEYS[3]  waiters key (client id -> liveness deadline)
-- KEYS[4]  released key: the token of the last release, kept for ARGV[4] ms so that a retry can be recognised
-- ARGV[1]  owner token
-- ARGV[2]  wake-up channel prefix: client `id` listens on ARGV[2] .. id
-- ARGV[3]  reservation in milliseconds: how long the woken client has to claim the lock
-- ARGV[4]  how long the released key remembers this release, in milliseconds
--
-- Returns  1   released (the lock key deleted, or reserved for the woken client), now or by an earlier run
--          0   the key is gone (expired, force-released, or lost by Redis): nothing changed
--          -1  another owner holds the lock: nothing changed
local holder = redis.call('GET', KEYS[1])
if holder ~= ARGV[1] then
    if redis.call('GET', KEYS[4]) == ARGV[1] then
        return 1
    end
    if holder then
        return -1
    end
    return 0
end
redis.call('SET', KEYS[4], ARGV[1], 'PX', ARGV[4])
if not wake_next(KEYS[2], KEYS[3], KEYS[1], ARGV[2], ARGV[3]) then
    redis.call('DEL', KEYS[1])
end
return 1
