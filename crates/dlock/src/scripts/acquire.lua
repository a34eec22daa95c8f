-- acquire: take the lock if it is free, and grant the next fence in the same atomic step.
--
-- KEYS[1]  lock key: a string holding the owner token, with a millisecond expiry
-- KEYS[2]  fence key: the last fence granted for this lock
-- ARGV[1]  the new owner token (starts with "dl1:")
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  how long the fence key outlives its last grant, in milliseconds
--
-- Returns  {1, fence}  granted
--          {0, pttl}   held by a dlock owner; pttl is the remaining lease in ms (-1: no expiry)
--          {-1, 0}     the lock key holds a value dlock did not write
--          {-2, 0}     the fence key holds a value that is not a number
--
-- The fence is max(last fence + 1, server time in microseconds). The time floor keeps fences increasing when the
-- counter is lost (a restart without persistence, the key's retention ran out), as long as the server clock does
-- not step back further than the time since the last grant.
local holder = redis.call('GET', KEYS[1])
if holder then
    if string.sub(holder, 1, 4) ~= 'dl1:' then
        return {-1, 0}
    end
    return {0, redis.call('PTTL', KEYS[1])}
end

local last = redis.call('GET', KEYS[2])
local fence = 0
if last then
    fence = tonumber(last)
    if fence == nil then
        return {-2, 0}
    end
end
fence = fence + 1
local now = redis.call('TIME')
local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
if floor > fence then
    fence = floor
end

redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', ARGV[3])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, fence}
