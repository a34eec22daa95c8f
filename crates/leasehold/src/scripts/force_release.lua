-- force_release: remove a lock whoever holds it (an operator's escape hatch), and hand it to the oldest live waiting
-- client (hand_off.lua).
--
-- KEYS[1]  lock key
-- KEYS[2]  queue key (waiting client ids, oldest first)
-- KEYS[3]  waiters key (client id -> "<alive until> <claim ms> <token>")
-- KEYS[4]  fence key
-- ARGV[1]  wake-up channel prefix: client `id` listens on ARGV[1] .. id
-- ARGV[2]  how long a fence counter lives after it was created, in milliseconds
--
-- Returns  the token that was removed, false when the lock was free, or the key's value untouched when it does not
--          start with "dl1:" (not a leasehold lock: the caller reports it)
local holder = redis.call('GET', KEYS[1])
if holder and string.sub(holder, 1, 4) == 'dl1:' then
    redis.call('DEL', KEYS[1])
    hand_off(KEYS[1], KEYS[4], KEYS[2], KEYS[3], ARGV[1], ARGV[2])
end
return holder
