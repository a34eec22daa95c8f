-- pass_on: a client that was woken for a lock but no longer wants it hands its turn to the next waiting client.
--
-- KEYS[1]  lock key
-- KEYS[2]  queue key (waiting client ids, oldest first)
-- KEYS[3]  waiters key (client id -> liveness deadline)
-- ARGV[1]  the client id passing its turn on
-- ARGV[2]  wake-up channel prefix: client `id` listens on ARGV[2] .. id
--
-- Returns  1 when a client was woken, 0 otherwise (the lock is held or reserved for another, or nobody waits)
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= 'dl1:rsv:' .. ARGV[1] then
    return 0
end
redis.call('LREM', KEYS[2], 0, ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
if wake_next(KEYS[2], KEYS[3], KEYS[1], ARGV[2]) then
    return 1
end
if holder then
    redis.call('DEL', KEYS[1])
end
return 0
