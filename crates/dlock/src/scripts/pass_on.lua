-- pass_on: a client that was woken for a lock but no longer wants it hands its turn to the next waiting client.
--
-- KEYS[1]  lock key
-- KEYS[2]  queue key (waiting client ids, oldest first)
-- KEYS[3]  reservation key
-- ARGV[1]  the client id passing its turn on
-- ARGV[2]  wake-up channel prefix: client `id` listens on ARGV[2] .. id
-- ARGV[3]  reservation in milliseconds
--
-- Returns  1 when a client was woken, 0 otherwise (the lock is held, reserved for someone else, or nobody waits)
local reserved = redis.call('GET', KEYS[3])
if redis.call('EXISTS', KEYS[1]) == 1 or (reserved and reserved ~= ARGV[1]) then
    return 0
end
if reserved then
    redis.call('DEL', KEYS[3])
end
redis.call('LREM', KEYS[2], 0, ARGV[1])
if wake_next(KEYS[2], KEYS[3], ARGV[2], ARGV[3], KEYS[1]) then
    return 1
end
return 0
