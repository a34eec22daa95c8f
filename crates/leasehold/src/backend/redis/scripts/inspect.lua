-- inspect: read a lock's state in one atomic step (for status displays; never changes anything).
--
-- KEYS[1]  lock key: a string (a mutex: the owner token) or a sorted set (a queued kind: see set.lua)
-- KEYS[2]  fence key
-- KEYS[3]  waiters key: a hash of waiting client or wait id -> "<alive until, server ms> <claim ms> ..." (the mutex's
--          format in acquire.lua, the queued kinds' in set.lua)
-- KEYS[4]  value key: "<fence> <value>", the value an election's leader proclaimed last (proclaim.lua)
--
-- Returns  {type, last fence or false, live waiters, capacity or false, value or false, hold_1, ms_1, ...}: the lock
--          key's type ("string", "zset", "none", or another type leasehold did not write), a semaphore's stored
--          capacity while it has a live hold (see set.lua), then every live hold with its time left in ms (-1: no
--          expiry): the owner token of a mutex, or "<tag> <token>" for a queued kind, oldest expiry first. A waiter
--          counts while its entry's liveness lasts: one that gave up or died stops counting after it, even while its
--          entry waits in the queue for a release to pop it (a semaphore waiter dropped for its count, whose entry is
--          "<alive until> refused <capacity>", never counts).
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local kind = redis.call('TYPE', KEYS[1]).ok
local reply = {kind, redis.call('GET', KEYS[2]) or false, 0, false, false}
local entries = redis.pcall('HGETALL', KEYS[3])
if type(entries) == 'table' and not entries.err then
    for i = 2, #entries, 2 do
        local alive = tonumber(string.match(entries[i], '^(%d+) %d+ '))
        if alive and alive >= now_ms then
            reply[3] = reply[3] + 1
        end
    end
end
if kind == 'string' then
    reply[5] = redis.call('GET', KEYS[4])
    reply[6] = redis.call('GET', KEYS[1])
    reply[7] = redis.call('PTTL', KEYS[1])
elseif kind == 'zset' then
    local holds = redis.call('ZRANGEBYSCORE', KEYS[1], now_ms, '+inf', 'WITHSCORES')
    local capacity = redis.call('ZSCORE', KEYS[1], 'permits')
    if capacity and #holds > 0 then
        reply[4] = -tonumber(capacity)
    end
    for i = 1, #holds, 2 do
        reply[#reply + 1] = holds[i]
        reply[#reply + 1] = tonumber(holds[i + 1]) - now_ms
    end
end
return reply
