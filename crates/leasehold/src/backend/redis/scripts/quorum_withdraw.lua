-- quorum_withdraw: a waiting writer of a quorum read-write lock leaves (quorum.rs): its wait ended, granted or not.
-- Deletes its intent if the node still holds it, and announces that the lock may be taken (readers held back by
-- the intent wait for that), in one step.
--
-- KEYS[1]  the lock's writer intent
-- KEYS[2]  the lock key (the announcement's message)
-- ARGV[1]  the writer's wait id
-- ARGV[2]  the channel on which releases are announced
--
-- Returns 1 when the intent was the writer's and is gone, 0 otherwise (nothing changed).
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], KEYS[2])
return 1
