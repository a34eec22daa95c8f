-- acquire: take the lock if it is free (or reserved for the caller), granting the next fence in the same atomic
-- step; otherwise join the queue of waiting clients (when the caller will wait).
--
-- KEYS[1]  lock key: the owner token with a millisecond expiry, or a reservation "dl1:rsv:<client id>"
-- KEYS[2]  fence key: the last fence granted for this lock
-- KEYS[3]  queue key: a list of waiting client ids, oldest first
-- ARGV[1]  the new owner token (starts with "dl1:")
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  how long a fence counter lives after it was seeded, in milliseconds
-- ARGV[4]  the caller's client id
-- ARGV[5]  "1" when the caller will wait (join the queue when busy), "0" for a single try
-- ARGV[6]  how long the queue key outlives the current holder's lease, in milliseconds
-- ARGV[7]  "1" when an earlier attempt of this wait may have queued the caller (leave the queue on success)
--
-- Returns  {1, fence}  granted
--          {0, pttl}   busy: held by a dlock owner, or reserved for another waiting client; pttl is the time left
--                      in ms (-1: no expiry)
--          {-1, 0}     the lock key holds a value dlock did not write
--          {-2, 0}     the fence key holds something that is not a number (nothing was granted)
--
-- Fences: INCR on the counter; a missing counter (first grant, restart without persistence, retention over) is
-- seeded with the server time in microseconds, so fences keep increasing across its loss as long as the server
-- clock does not step back further than the time since the counter was seeded.
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    local holder = redis.call('GET', KEYS[1])
    if holder == 'dl1:rsv:' .. ARGV[4] then
        -- A release woke us and kept the lock for us.
        redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    elseif holder and string.sub(holder, 1, 4) ~= 'dl1:' then
        return {-1, 0}
    else
        local pttl = redis.call('PTTL', KEYS[1])
        if ARGV[5] == '1' then
            if not redis.call('LPOS', KEYS[3], ARGV[4]) then
                redis.call('RPUSH', KEYS[3], ARGV[4])
            end
            redis.call('PEXPIRE', KEYS[3], math.max(pttl, 0) + tonumber(ARGV[6]))
        end
        return {0, pttl}
    end
end

if ARGV[7] == '1' then
    redis.call('LREM', KEYS[3], 0, ARGV[4])
end
local fence = redis.pcall('INCR', KEYS[2])
if type(fence) ~= 'number' then
    redis.call('DEL', KEYS[1])
    return {-2, 0}
end
if fence == 1 then
    local now = redis.call('TIME')
    fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
    redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', ARGV[3])
end
return {1, fence}
