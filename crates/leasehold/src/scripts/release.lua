-- release: give the lock up only if we still own it, handing it to the oldest live waiting client. Idempotent per
-- token: a release that ran before (a retry after a lost reply) answers 1 again, without touching anything, for as
-- long as the lease it released would have lasted and until the lock's next release.
--
-- KEYS[1]  lock key
-- KEYS[2]  queue key (waiting client ids, oldest first)
-- KEYS[3]  waiters key (client id -> liveness deadline)
-- KEYS[4]  released key: the token of the last release, for the rest of its lease, so that a retry is recognised
-- ARGV[1]  owner token
-- ARGV[2]  wake-up channel prefix: client `id` listens on ARGV[2] .. id
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
-- One command frees the lock and remembers the release: the released key takes the token and the rest of its lease.
redis.call('RENAME', KEYS[1], KEYS[4])
wake_next(KEYS[2], KEYS[3], KEYS[1], ARGV[2])
return 1
