-- quorum_release: one node's part of a quorum release (quorum.rs). Deletes a mutex if it still holds the caller's
-- token, or removes the caller's share from a read-write lock's holds, and announces the release to the quorum's
-- waiters in the same step (one round trip per node).
--
-- KEYS[1]  lock key
-- ARGV[1]  the caller's owner token, or its hold ("r <token>", "w <token>")
-- ARGV[2]  the channel on which releases are announced (the message is the lock key)
--
-- Returns  {released, listeners}: 1 and the count of subscribers the announcement reached when this released the
--          lock or the share; 0, 0 when it did not hold it (nothing changed).
if string.sub(ARGV[1], 1, 4) == 'dl1:' then
    if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
        return {0, 0}
    end
    redis.call('DEL', KEYS[1])
else
    local removed = redis.pcall('ZREM', KEYS[1], ARGV[1])
    if removed ~= 1 then
        return {0, 0}
    end
    if redis.call('ZCARD', KEYS[1]) == 0 then
        redis.call('DEL', KEYS[1])
    end
end
return {1, redis.call('PUBLISH', ARGV[2], KEYS[1])}
