-- term: an election's campaign, just granted the election's mutex, counts its term (Election::campaign).
--
-- KEYS[1]  lock key: a mutex's, holding the new leader's owner token
-- KEYS[2]  value key: "<fence> <value>\31<term>" after this, read by inspect.lua (see proclaim.lua)
-- KEYS[3]  term count: how many terms of this election were counted, read by observers
-- ARGV[1]  the grant's owner token, as the lock key holds it
-- ARGV[2]  the grant's fence
-- ARGV[3]  the value it publishes
-- ARGV[4]  how long the value key and the count live, ms (the fence counter's retention)
--
-- Returns  the term's number when the grant still held the lock (the same number again for a call sent twice: the
--          value key already names this fence with a number), 0 otherwise (nothing changed).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
local stored = redis.call('GET', KEYS[2])
if stored then
    local fence, term = string.match(stored, '^(%d+) .*\31(%d+)$')
    if fence == ARGV[2] then
        return tonumber(term)
    end
end
local term = redis.call('INCR', KEYS[3])
redis.call('PEXPIRE', KEYS[3], ARGV[4])
redis.call('SET', KEYS[2], ARGV[2] .. ' ' .. ARGV[3] .. '\31' .. term, 'PX', ARGV[4])
return term
