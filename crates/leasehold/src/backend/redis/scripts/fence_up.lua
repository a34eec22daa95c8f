-- fence_up: the write-back of a quorum grant's fence (quorum.rs). Raises this node's fence counter to the fence the
-- quorum chose, only while this node still holds the caller's token, and never lowers it.
--
-- KEYS[1]  lock key
-- KEYS[2]  fence counter
-- ARGV[1]  the caller's token, or its share's hold in a read-write lock's set of holds ("r <token>", "w <token>")
-- ARGV[2]  the fence (a decimal string)
-- ARGV[3]  fence retention, ms (the counter lives that long after this raised it)
--
-- Returns 1 when the counter is now at least the fence (written, or already there), 0 when the node no longer holds
-- the token (nothing written), -1 when the counter holds something that is not a fence (left as it is).
--
-- Decimal strings without leading zeros compare as numbers by length, then bytes: no conversion, no float rounding.
local held
if string.sub(ARGV[1], 1, 4) == 'dl1:' then
    held = redis.pcall('GET', KEYS[1]) == ARGV[1]
else
    -- A share: held while its hold is in the set and its lease has not run out.
    local score = redis.pcall('ZSCORE', KEYS[1], ARGV[1])
    local t = redis.call('TIME')
    held = type(score) == 'string' and tonumber(score) >= tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
if not held then
    return 0
end
local fence = ARGV[2]
local last = redis.pcall('GET', KEYS[2])
if last then
    if type(last) ~= 'string' or not string.find(last, '^%d+$') then
        return -1
    end
    if #last > #fence or (#last == #fence and last >= fence) then
        return 1
    end
end
redis.call('SET', KEYS[2], fence, 'PX', ARGV[3])
return 1
