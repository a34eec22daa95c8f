-- leave: a wait of a queued kind (see set.lua) gives up: its queue entry goes at once, and the queue is served (the
-- entry may have been what blocked the ones behind it: a semaphore waiter asking for more permits than are free,
-- say). A hold a release granted the wait meanwhile is released by the client like any grant nobody takes.
-- Idempotent.
--
-- KEYS[1]  lock key (the set of holds)
-- KEYS[2]  queue key
-- KEYS[3]  waiters key
-- KEYS[4]  released key
-- KEYS[5]  fence key
-- ARGV[1]  wake-up channel prefix (empty on Redis Cluster: see `notify` in grant.lua)
-- ARGV[2]  how long a fence counter lives after it was created, in milliseconds
-- ARGV[3]  the wait's id
--
-- Returns  1 when the entry was there, 0 otherwise
local now = clock_us()
local now_ms = tonumber(string.sub(now, 1, -4))
local removed = redis.pcall('LREM', KEYS[2], 0, ARGV[3])
if type(removed) ~= 'number' then
    return 0
end
redis.call('HDEL', KEYS[3], ARGV[3])
if type(redis.pcall('ZCARD', KEYS[1])) == 'number' then
    purge(KEYS[1], now_ms)
    serve(KEYS[1], KEYS[5], KEYS[2], KEYS[3], ARGV[1], ARGV[2], now, now_ms, nil, 0)
end
return math.min(removed, 1)
