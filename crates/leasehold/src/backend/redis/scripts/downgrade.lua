-- downgrade: turn a live write hold of a read-write lock into a read hold with the same token and expiry, in one
-- step (no other writer can come in between), and serve the queue (readers waiting at its head join the new reader).
-- Idempotent: run again (a retried request), it finds the read hold and answers the same.
--
-- KEYS[1]  lock key (the set of holds)
-- KEYS[2]  fence key
-- KEYS[3]  queue key
-- KEYS[4]  waiters key
-- ARGV[1]  wake-up channel prefix (empty on Redis Cluster: see `notify` in grant.lua)
-- ARGV[2]  how long a fence counter lives after it was created, in milliseconds
-- ARGV[3]  the write hold ("w <token>")
-- ARGV[4]  the read hold it becomes ("r <token>")
--
-- Returns  {now, code, ms}: the server time in µs, 1 and the ms left on the hold when it is a read hold now, 0 when
--          neither hold is live (the lease ended), -2 when the key is not a set of holds
local now = clock_us()
local now_ms = tonumber(string.sub(now, 1, -4))
local score = redis.pcall('ZSCORE', KEYS[1], ARGV[3])
if type(score) == 'table' then
    return {now, -2, 0}
end
if score and tonumber(score) >= now_ms then
    redis.call('ZREM', KEYS[1], ARGV[3])
    redis.call('ZADD', KEYS[1], score, ARGV[4])
    purge(KEYS[1], now_ms)
    serve(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2], now, now_ms, nil, 0)
    return {now, 1, tonumber(score) - now_ms}
end
local read = redis.call('ZSCORE', KEYS[1], ARGV[4])
if read and tonumber(read) >= now_ms then
    return {now, 1, tonumber(read) - now_ms}
end
return {now, 0, 0}
