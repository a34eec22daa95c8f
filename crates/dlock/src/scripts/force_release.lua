-- force_release: delete a lock whoever holds it (an operator's escape hatch), and wake the waiters.
--
-- KEYS[1]  lock key
-- ARGV[1]  the lock's wake-up channel
--
-- Returns  the token that was removed, false when the lock was free, or the key's value untouched when it does
--          not start with "dl1:" (not a dlock lock: the caller reports it)
local holder = redis.call('GET', KEYS[1])
if holder and string.sub(holder, 1, 4) == 'dl1:' then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', ARGV[1], '')
end
return holder
