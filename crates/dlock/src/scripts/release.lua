-- release: delete the lock only if we still own it, and wake one round of waiters.
--
-- KEYS[1]  lock key
-- ARGV[1]  owner token
-- ARGV[2]  the lock's wake-up channel
--
-- Returns  1   released (and a wake-up published)
--          0   the key is gone (expired or force-released): nothing changed
--          -1  another owner holds the lock: nothing changed
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', ARGV[2], '')
    return 1
end
if holder then
    return -1
end
return 0
