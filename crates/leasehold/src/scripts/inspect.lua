-- inspect: read a lock's state in one atomic step (for status displays; never changes anything).
--
-- KEYS[1]  lock key
-- KEYS[2]  fence key
-- KEYS[3]  queue key
--
-- Returns  {holder token or false, pttl of the lock key (-2 when absent), last fence or false, waiting clients}
local holder = redis.call('GET', KEYS[1])
return {holder, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]), redis.call('LLEN', KEYS[3])}
