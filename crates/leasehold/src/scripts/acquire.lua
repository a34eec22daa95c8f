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
-- ARGV[5]  "0" for a single try; "1" for the first attempt of a wait (join the queue when busy); "2" for a later
--          attempt of a wait (the caller may be queued already: leave the queue on success)
--
-- Constants (prepended): LIVENESS_MS, how long a waiter counts as live without another attempt; QUEUE_RETENTION_MS,
-- how long the queue outlives the current holder's lease.
--
-- Returns  {1, fence, now}   granted (also when the lock already holds this token: a re-sent request); the fence
--                            and `now` are decimal strings
--          {0, pttl, now}    busy: held by a leasehold owner, or reserved for another waiting client; pttl is the time
--                            left in ms (-1: no expiry)
--          {-1, 0, now}      the lock key holds a value leasehold did not write
--          {-2, 0, now}      the fence key holds something that is not a number (nothing was granted)
--          `now` is the server time in microseconds when the script ran.
--
-- Fences: every grant's fence is max(last fence + 1, server time in µs). A counter that was lost (restart without
-- persistence, failover, retention over, deleted) or that came back stale (a restore from an older snapshot, a
-- replica promoted before it caught up) is overtaken by the clock, so fences keep increasing as long as the server
-- clock does not step back.
-- The hot path handles the clock and the fence as decimal strings: converting numbers (strtod, %.17g) costs more
-- than the rest of the grant. Decimal strings without leading zeros compare as numbers by length, then bytes.
local t = redis.call('TIME')
local now = t[1] .. string.sub('00000' .. t[2], -6)

local function below(a, b)
    return #a < #b or (#a == #b and a < b)
end

if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    local holder = redis.call('GET', KEYS[1])
    if holder == ARGV[1] then
        -- This request ran before (a retry after a lost reply): the grant stands, with the fence it drew.
        return {1, redis.call('GET', KEYS[2]) or '0', now}
    end
    if holder ~= 'dl1:rsv:' .. ARGV[4] then
        if holder and string.sub(holder, 1, 4) ~= 'dl1:' then
            return {-1, 0, now}
        end
        local pttl = redis.call('PTTL', KEYS[1])
        if ARGV[5] ~= '0' then
            -- One queue entry per client; every attempt renews its liveness.
            local alive_until = string.format('%d', math.floor(tonumber(now) / 1000) + LIVENESS_MS)
            if redis.call('HSET', KEYS[4], ARGV[4], alive_until) == 1 then
                redis.call('RPUSH', KEYS[3], ARGV[4])
            end
            local keep = math.max(pttl, 0) + QUEUE_RETENTION_MS
            redis.call('PEXPIRE', KEYS[3], keep)
            redis.call('PEXPIRE', KEYS[4], keep)
        end
        return {0, pttl, now}
    end
    -- A release woke us and kept the lock for us.
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end

-- Granted: leave the queue if we may be in it, and draw the fence.
if ARGV[5] == '2' then
    redis.call('LREM', KEYS[3], 0, ARGV[4])
    redis.call('HDEL', KEYS[4], ARGV[4])
end
local last = redis.pcall('SET', KEYS[2], now, 'KEEPTTL', 'GET')
local fence = now
if last then
    if type(last) ~= 'string' or not string.find(last, '^%d+$') then
        -- Another type, or a string that is not a fence: put a string back, grant nothing.
        if type(last) == 'string' then
            redis.call('SET', KEYS[2], last, 'KEEPTTL')
        end
        redis.call('DEL', KEYS[1])
        return {-2, 0, now}
    end
    if not below(last, now) then
        -- The counter is ahead of the clock (more than a grant per µs, or a clock that stepped back).
        fence = string.format('%d', tonumber(last) + 1)
        redis.call('SET', KEYS[2], fence, 'KEEPTTL')
    end
else
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return {1, fence, now}
