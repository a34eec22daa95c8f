-- set_permits: store a new capacity for a semaphore in use (see set.lua), and serve the queue at once (a raised
-- capacity admits waiters now; a lowered one never revokes a held permit, it only holds back new grants until the
-- holders drop below it). A semaphore with no live hold stores nothing: the next grant stores its own count. The waiters
-- queued when the count changes keep their place and are judged by the new count; new requests must carry it.
-- Idempotent.
--
-- KEYS[1]  lock key (the set of holds)
-- KEYS[2]  fence key
-- KEYS[3]  queue key
-- KEYS[4]  waiters key
-- ARGV[1]  wake-up channel prefix (empty on Redis Cluster: see `notify` in grant.lua)
-- ARGV[2]  how long a fence counter lives after it was created, in milliseconds
-- ARGV[3]  the new capacity
--
-- Returns  {code, previous}: 1 and the capacity stored before (0 when none was), 0, 0 when the semaphore has no live
--          hold (nothing stored), -1, 0 when the key is not a set of holds, -3, 0 when it holds a lock of another kind
local now = clock_us()
local now_ms = tonumber(string.sub(now, 1, -4))
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'none' then
    return {0, 0}
end
if kind ~= 'zset' then
    return {-1, 0}
end
purge(KEYS[1], now_ms)
local first = first_hold(KEYS[1], now_ms)
if not first then
    return {0, 0}
end
if family(string.match(first, '^%S+')) ~= 's' then
    return {-3, 0}
end
local previous = capacity(KEYS[1]) or 0
redis.call('ZADD', KEYS[1], -tonumber(ARGV[3]), CAPACITY)
-- The waiters queued now keep their place under the new count: their entries carry it from here on, and their own
-- attempts are judged by their entry's count, not by the count their handle carries (set_acquire.lua).
local entries = redis.call('HGETALL', KEYS[4])
for i = 1, #entries, 2 do
    local alive, claim, client, hold = string.match(entries[i + 1], '^(%d+) (%d+) %d+ (%S+) (s%d+ .+)$')
    if alive then
        redis.call('HSET', KEYS[4], entries[i], alive .. ' ' .. claim .. ' ' .. ARGV[3] .. ' ' .. client .. ' ' .. hold)
    end
end
serve(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2], now, now_ms, nil, 0)
return {1, previous}
