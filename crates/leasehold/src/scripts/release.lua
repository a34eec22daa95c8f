-- release: give the lock up only if we still own it, and hand it to the oldest live waiting client (hand_off.lua).
-- Idempotent per token: a release that ran before (a retry after a lost reply) answers 1 again, without touching
-- anything, for as long as the lease it released would have lasted and until the lock's next release.
--
-- KEYS[1]  lock key
-- KEYS[2]  queue key (waiting client ids, oldest first)
-- KEYS[3]  waiters key (client id -> "<alive until> <claim ms> <token>")
-- KEYS[4]  released key: the token of the last release, for the rest of its lease, so that a retry is recognised
-- KEYS[5]  fence key (a hand-off draws the next owner's fence)
-- ARGV[1]  owner token
-- ARGV[2]  wake-up channel prefix: client `id` listens on ARGV[2] .. id
-- ARGV[3]  how long a fence counter lives after it was created, in milliseconds
--
-- Returns  1   released (and handed to the next waiting client, if one is live), now or by an earlier run
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
hand_off(KEYS[1], KEYS[5], KEYS[2], KEYS[3], ARGV[2], ARGV[3])
return 1
