-- proclaim: an election's leader publishes a new value (Leadership::proclaim), while its grant holds the lock.
--
-- KEYS[1]  lock key: a mutex's, holding the leader's owner token
-- KEYS[2]  value key: "<fence> <value>", read by inspect.lua, which takes it for the holder's value only when its
--          fence is the lock's last fence (a value left by an earlier term is never shown for a later one)
-- KEYS[3]  term count (term.lua): its life starts again with the value key's, so that a term outlives neither
-- KEYS[4]  fence counter: its life starts again too while the term holds (its last fence is the term's), since
--          inspect.lua's reader takes the value key only when its fence is the counter's
-- ARGV[1]  the grant's owner token, as the lock key holds it
-- ARGV[2]  "<fence> <value>\31<term>"
-- ARGV[3]  how long the value key lives, ms (the fence counter's retention: a term outlives no longer)
--
-- Returns  1 when the grant still held the lock and the value was stored, 0 otherwise (nothing changed).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
redis.call('PEXPIRE', KEYS[4], ARGV[3])
return 1
