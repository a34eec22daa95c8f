-- grant: shared by the scripts that grant a lock (prepended to each of them when it is loaded).
--
-- clock_us()  the server time in microseconds, as a decimal string.
-- draw_fence(fence_key, now, retention_ms)
--             draws the fence of a grant made at `now` (a clock_us() string): max(last fence + 1, now), written
--             back in the same step. A counter that was lost (restart without persistence, failover, retention over,
--             deleted) or that came back stale (a restore from an older snapshot, a replica promoted before it caught
--             up) is overtaken by the clock, so fences keep increasing as long as the server clock does not step
--             back. Returns the fence (a decimal string), or nil when the counter holds something that is not a
--             fence (then nothing is granted and the counter is left as it was).
--
-- The clock and the fence stay decimal strings: converting numbers (strtod, %.17g) costs more than the rest of a
-- grant. Decimal strings without leading zeros compare as numbers by length, then bytes.
local function clock_us()
    local t = redis.call('TIME')
    return t[1] .. string.sub('00000' .. t[2], -6)
end

local function draw_fence(fence_key, now, retention_ms)
    local last = redis.pcall('SET', fence_key, now, 'KEEPTTL', 'GET')
    if not last then
        redis.call('PEXPIRE', fence_key, retention_ms)
        return now
    end
    if type(last) ~= 'string' or not string.find(last, '^%d+$') then
        -- Another type (SET failed and changed nothing), or a string that is not a fence: put it back.
        if type(last) == 'string' then
            redis.call('SET', fence_key, last, 'KEEPTTL')
        end
        return nil
    end
    if #last < #now or (#last == #now and last < now) then
        return now
    end
    -- The counter is ahead of the clock (more than a grant per µs, or a clock that stepped back).
    local fence = string.format('%d', tonumber(last) + 1)
    redis.call('SET', fence_key, fence, 'KEEPTTL')
    return fence
end
