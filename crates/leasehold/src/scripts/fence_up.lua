-- fence_up: the write-back of a quorum grant's fence (quorum.rs). Raises this node's fence counter to the fence the
-- quorum chose, only while this node still holds the caller's token, and never lowers it.
--
-- KEYS[1]  lock key
-- KEYS[2]  fence counter
-- ARGV[1]  the caller's token
-- ARGV[2]  the fence (a decimal string)
-- ARGV[3]  fence retention, ms (the counter's expiry when this creates it)
--
-- Returns 1 when the counter is now at least the fence (written, or already there), 0 when the node no longer holds
-- the token (nothing written), -1 when the counter holds something that is not a fence (left as it is).
--
-- Decimal strings without leading zeros compare as numbers by length, then bytes: no conversion, no float rounding.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
local fence = ARGV[2]
local last = redis.call('GET', KEYS[2])
if last then
    if not string.find(last, '^%d+$') then
        return -1
    end
    if #last > #fence or (#last == #fence and last >= fence) then
        return 1
    end
    redis.call('SET', KEYS[2], fence, 'KEEPTTL')
else
    redis.call('SET', KEYS[2], fence, 'PX', ARGV[3])
end
return 1
