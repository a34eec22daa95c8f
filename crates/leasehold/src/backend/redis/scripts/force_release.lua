-- force_release: remove a lock whoever holds it (an operator's escape hatch), and hand it on: to the oldest live
-- waiting client for a mutex (hand_off.lua), to the queue's head waiters for a queued kind (set.lua).
--
-- KEYS[1]  lock key
-- KEYS[2]  queue key
-- KEYS[3]  waiters key
-- KEYS[4]  fence key
-- ARGV[1]  wake-up channel prefix: client `id` listens on ARGV[1] .. id (empty on Redis Cluster: see
--           `notify` in grant.lua)
-- ARGV[2]  how long a fence counter lives after it was created, in milliseconds
--
-- Returns  the token that was removed (for a queued kind, the live hold that would have lapsed first), false when
--          the lock was free, or the key's value untouched when it does not start with "dl1:" (not a leasehold lock:
--          the caller reports it)
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'zset' then
    local now = clock_us()
    local now_ms = tonumber(string.sub(now, 1, -4))
    local first = first_hold(KEYS[1], now_ms)
    redis.call('DEL', KEYS[1])
    serve(KEYS[1], KEYS[4], KEYS[2], KEYS[3], ARGV[1], ARGV[2], now, now_ms, nil, 0)
    if first then
        return string.match(first, '^%S+ (.+)$')
    end
    return false
end
local holder = redis.call('GET', KEYS[1])
if holder and string.sub(holder, 1, 4) == 'dl1:' then
    redis.call('DEL', KEYS[1])
    hand_off(KEYS[1], KEYS[4], KEYS[2], KEYS[3], ARGV[1], ARGV[2])
end
return holder
