-- quorum_release: one node's part of a quorum release (quorum.rs). Deletes a mutex if it still holds the caller's
-- token, or removes the caller's share from a read-write lock's holds, and announces the release to the quorum's
-- waiters in the same step (one round trip per node).
--
-- When the node does not hold the token and the caller never heard how its vote went here (it timed out, or is still
-- on its way), the vote may yet run, later, from a connection the caller has since replaced: the token is then
-- voided, so that quorum_acquire.lua refuses it, for ARGV[3] ms.
--
-- KEYS[1]  lock key
-- KEYS[2]  the node's voided tokens of this lock: a sorted set, token -> until (server ms)
-- ARGV[1]  the caller's owner token, or its hold ("r <token>", "w <token>")
-- ARGV[2]  the channel on which releases are announced (the message is the lock key)
-- ARGV[3]  how long to void the token if it is not held here, ms ("0": do not)
--
-- Returns  {released, listeners}: 1 and the count of subscribers the announcement reached when this released the
--          lock or the share; 0, 0 when it did not hold it (nothing changed but the void).
local function void()
    local keep = tonumber(ARGV[3])
    if keep > 0 then
        local t = redis.call('TIME')
        local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
        redis.call('ZADD', KEYS[2], now_ms + keep, ARGV[1])
        if redis.call('PTTL', KEYS[2]) < keep then
            redis.call('PEXPIRE', KEYS[2], keep)
        end
    end
    return {0, 0}
end

if string.sub(ARGV[1], 1, 4) == 'dl1:' then
    if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
        return void()
    end
    redis.call('DEL', KEYS[1])
else
    local removed = redis.pcall('ZREM', KEYS[1], ARGV[1])
    if removed ~= 1 then
        return void()
    end
    if redis.call('ZCARD', KEYS[1]) == 0 then
        redis.call('DEL', KEYS[1])
    end
end
return {1, redis.call('PUBLISH', ARGV[2], KEYS[1])}
