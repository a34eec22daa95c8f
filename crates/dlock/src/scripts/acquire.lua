-- acquire: take the lock if it is free and not reserved for another waiter, granting the next fence in the same
-- atomic step; otherwise join the queue of waiting clients (when the caller will wait).
--
-- KEYS[1]  lock key: a string holding the owner token, with a millisecond expiry
-- KEYS[2]  fence key: the last fence granted for this lock
-- KEYS[3]  queue key: a list of waiting client ids, oldest first
-- KEYS[4]  reservation key: the client id the last release woke, with a short expiry
-- ARGV[1]  the new owner token (starts with "dl1:")
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  how long the fence key outlives its last grant, in milliseconds
-- ARGV[4]  the caller's client id
-- ARGV[5]  "1" when the caller will wait (join the queue when busy), "0" for a single try
-- ARGV[6]  how long the queue key outlives the current holder's lease, in milliseconds
--
-- Returns  {1, fence}  granted
--          {0, pttl}   busy: held by a dlock owner (pttl: its remaining lease in ms, -1 without expiry), or
--                      reserved for another waiter (pttl: what is left of the reservation)
--          {-1, 0}     the lock key holds a value dlock did not write
--          {-2, 0}     the fence key holds a value that is not a number
--
-- The fence is max(last fence + 1, server time in microseconds). The time floor keeps fences increasing when the
-- counter is lost (a restart without persistence, the key's retention ran out), as long as the server clock does
-- not step back further than the time since the last grant.
local function wait_in_line(pttl)
    if ARGV[5] == '1' then
        if not redis.call('LPOS', KEYS[3], ARGV[4]) then
            redis.call('RPUSH', KEYS[3], ARGV[4])
        end
        redis.call('PEXPIRE', KEYS[3], math.max(pttl, 0) + tonumber(ARGV[6]))
    end
    return {0, pttl}
end

local holder = redis.call('GET', KEYS[1])
if holder then
    if string.sub(holder, 1, 4) ~= 'dl1:' then
        return {-1, 0}
    end
    return wait_in_line(redis.call('PTTL', KEYS[1]))
end

-- A release hands the lock to the oldest waiting client for a moment, so a releaser that loops cannot barge in
-- ahead of processes that have waited longer.
local reserved = redis.call('GET', KEYS[4])
if reserved and reserved ~= ARGV[4] then
    return wait_in_line(redis.call('PTTL', KEYS[4]))
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

if reserved then
    redis.call('DEL', KEYS[4])
end
redis.call('LREM', KEYS[3], 0, ARGV[4])
redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', ARGV[3])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, fence}
