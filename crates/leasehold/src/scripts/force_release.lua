-- force_release: remove a lock whoever holds it (an operator's escape hatch), and wake the oldest live waiting client.
--
-- KEYS[1]  lock key
-- KEYS[2]  queue key (waiting client ids, oldest first)
-- KEYS[3]  waiters key (client id -> liveness deadline)
-- ARGV[1]  wake-up channel prefix: client `id` listens on ARGV[1] .. id
--
-- Returns  the value that was removed (an owner token or a reservation), false when the lock was free, or the
--          key's value untouched when it does not start with "dl1:" (not a leasehold lock: the caller reports it)
local holder = redis.call('GET', KEYS[1])
if holder and string.sub(holder, 1, 4) == 'dl1:' then
    if not wake_next(KEYS[2], KEYS[3], KEYS[1], ARGV[1]) then
        redis.call('DEL', KEYS[1])
    end
end
return holder
