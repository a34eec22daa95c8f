-- quorum_release: one node's part of a quorum release (quorum.rs). Deletes the lock if it still holds the caller's
-- token, and announces the release to the quorum's waiters in the same step (one round trip per node).
--
-- KEYS[1]  lock key
-- ARGV[1]  the caller's owner token
-- ARGV[2]  the channel on which releases are announced (the message is the lock key)
--
-- Returns  {released, listeners}: 1 and the count of subscribers the announcement reached when this released the
--          lock; 0, 0 when the lock did not hold the token (nothing changed).
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
    return {0, 0}
end
redis.call('DEL', KEYS[1])
return {1, redis.call('PUBLISH', ARGV[2], KEYS[1])}
