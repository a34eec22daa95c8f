-- renew: extend many leases in one call, each only if its owner still holds it. Never re-creates a lapsed lock.
-- Each lease's outcome is its own: a key that someone replaced with another type fails that lease only.
-- Idempotent: running it twice extends twice, from the later run.
--
-- KEYS[i]        lock key of lease i
-- ARGV[2i - 1]   owner token of lease i, or its hold ("<tag> <token>") in the set of holds of a queued kind
-- ARGV[2i]       new lease of lease i, in milliseconds
--
-- Returns  {now, code_1, code_2, ...}: the server time in microseconds (a decimal string) when the script ran (it orders the replies
--          of requests that may have run in another order than they were sent), then one code per lease:
--          1   renewed
--          0   the key is gone
--          -1  another owner holds the lock
--          -2  the key holds something leasehold did not write (another type): that lease is lost, the key untouched
local t = redis.call('TIME')
local reply = {t[1] .. string.sub('00000' .. t[2], -6)}
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i, key in ipairs(KEYS) do
    local holder
    local hold, ttl = ARGV[2 * i - 1], ARGV[2 * i]
    if string.sub(hold, 1, 4) ~= 'dl1:' then
        -- A hold of a queued kind: extended only while it is live, never brought back once lapsed.
        local score = redis.pcall('ZSCORE', key, hold)
        if type(score) == 'table' then
            holder = score
        elseif score and tonumber(score) >= now_ms then
            redis.call('ZADD', key, 'XX', now_ms + ttl, hold)
            if redis.call('PTTL', key) < tonumber(ttl) then
                redis.call('PEXPIRE', key, ttl)
            end
            holder = hold
        else
            holder = false
        end
    else
        holder = redis.pcall('GET', key)
        if holder == hold then
            redis.call('PEXPIRE', key, ttl)
        end
    end
    if type(holder) == 'table' and holder.err then
        reply[i + 1] = -2
    elseif holder == hold then
        reply[i + 1] = 1
    elseif holder then
        reply[i + 1] = -1
    else
        reply[i + 1] = 0
    end
end
return reply
