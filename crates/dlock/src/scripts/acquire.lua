-- acquire: take the lock if it is free (or reserved for the caller), granting the next fence in the same atomic
-- step; otherwise join the queue of waiting clients (when the caller will wait). Idempotent per token: run twice
-- with the same token (a retried request), it answers the grant of the first run.
--
-- KEYS[1]  lock key: the owner token with a millisecond expiry, or a reservation "dl1:rsv:<client id>"
-- KEYS[2]  fence key: the last fence granted for this lock
-- KEYS[3]  queue key: a list of waiting client ids, oldest first
-- KEYS[4]  waiters key: a hash of waiting client id -> liveness deadline (server time, ms)
-- ARGV[1]  the new owner token (starts with "dl1:")
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  how long a fence counter lives after it was created, in milliseconds
-- ARGV[4]  the caller's client id
-- ARGV[5]  "1" when the caller will wait (join the queue when busy), "0" for a single try
-- ARGV[6]  how long the queue outlives the current holder's lease, in milliseconds
-- ARGV[7]  "1" when an earlier attempt of this wait may have queued the caller (leave the queue on success)
-- ARGV[8]  how long the caller counts as a live waiter without another attempt, in milliseconds
--
-- Returns  {1, fence, now}   granted (also when the lock already holds this token: a re-sent request)
--          {0, pttl, now}    busy: held by a dlock owner, or reserved for another waiting client; pttl is the time
--                            left in ms (-1: no expiry)
--          {-1, 0, now}      the lock key holds a value dlock did not write
--          {-2, 0, now}      the fence key holds something that is not a number (nothing was granted)
--          `now` is the server time in microseconds when the script ran.
--
-- Fences: every grant's fence is max(last fence + 1, server time in µs). A counter that was lost (restart without
-- persistence, failover, retention over, deleted) or that came back stale (a restore from an older snapshot, a
-- replica promoted before it caught up) is overtaken by the clock, so fences keep increasing as long as the server
-- clock does not step back.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local function grant()
    if ARGV[7] == '1' then
        redis.call('LREM', KEYS[3], 0, ARGV[4])
        redis.call('HDEL', KEYS[4], ARGV[4])
    end
    local last = redis.pcall('SET', KEYS[2], string.format('%d', now), 'KEEPTTL', 'GET')
    if type(last) == 'table' and last.err then
        redis.call('DEL', KEYS[1])
        return {-2, 0, now}
    end
    local fence = now
    if last then
        local n = tonumber(last)
        if not n then
            redis.call('SET', KEYS[2], last, 'KEEPTTL')
            redis.call('DEL', KEYS[1])
            return {-2, 0, now}
        end
        if n >= now then
            fence = n + 1
            redis.call('SET', KEYS[2], string.format('%d', fence), 'KEEPTTL')
        end
    else
        redis.call('PEXPIRE', KEYS[2], ARGV[3])
    end
    return {1, fence, now}
end

if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return grant()
end
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
    -- This request ran before (a retry after a lost reply): the grant stands, with the fence it drew.
    return {1, tonumber(redis.call('GET', KEYS[2])) or 0, now}
end
if holder == 'dl1:rsv:' .. ARGV[4] then
    -- A release woke us and kept the lock for us.
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return grant()
end
if holder and string.sub(holder, 1, 4) ~= 'dl1:' then
    return {-1, 0, now}
end
local pttl = redis.call('PTTL', KEYS[1])
if ARGV[5] == '1' then
    -- One queue entry per client; every attempt renews its liveness.
    if redis.call('HSET', KEYS[4], ARGV[4], math.floor(now / 1000) + tonumber(ARGV[8])) == 1 then
        redis.call('RPUSH', KEYS[3], ARGV[4])
    end
    local keep = math.max(pttl, 0) + tonumber(ARGV[6])
    redis.call('PEXPIRE', KEYS[3], keep)
    redis.call('PEXPIRE', KEYS[4], keep)
end
return {0, pttl, now}
