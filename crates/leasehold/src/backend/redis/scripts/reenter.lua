-- reenter: a nested hold of a reentrant mutex (see set.lua), taken by presenting the token of a live hold of the same
-- lock (its root grant, or another nested hold): granted at once whoever waits, since the presenter's group already
-- holds the lock. The nested hold has a lease of its own, so that a nested holder that dies (another process handed
-- the token) frees its level after that lease, and the group keeps the lock while any of its holds is live.
-- Idempotent: run again (a retried request), it answers the same grant.
--
-- KEYS[1]  lock key (the set of holds)
-- KEYS[2]  fence key
-- ARGV[1]  the nested hold: "n <new token>"
-- ARGV[2]  the presented token (of the root hold "e <token>" or a nested hold "n <token>")
-- ARGV[3]  the nested hold's lease in milliseconds
-- ARGV[4]  the most holds the lock may have at once (its maximum depth)
-- ARGV[5]  how long a fence counter lives after it was created, in milliseconds
--
-- Returns  {now, code, fence, ms}: 1 granted (the group's fence: the lock's last, drawn by the root grant; ms left),
--          0 the presented token holds nothing live here, -1 the key is not a set of holds, -3 the lock is not a
--          reentrant mutex, -4 the lock has its maximum number of holds already
local now = clock_us()
local now_ms = tonumber(string.sub(now, 1, -4))
local function live(member)
    local score = redis.pcall('ZSCORE', KEYS[1], member)
    if type(score) == 'table' then
        return nil, true
    end
    return score and tonumber(score) >= now_ms and tonumber(score), false
end
local mine, wrong = live(ARGV[1])
if wrong then
    return {now, -1, 0, 0}
end
if mine then
    return {now, 1, redis.call('GET', KEYS[2]) or '0', mine - now_ms}
end
local first = first_hold(KEYS[1], now_ms)
if first and family(string.match(first, '^%S+')) ~= 'e' then
    return {now, -3, 0, 0}
end
if not (live('e ' .. ARGV[2]) or live('n ' .. ARGV[2])) then
    return {now, 0, 0, 0}
end
purge(KEYS[1], now_ms)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then
    return {now, -4, 0, 0}
end
store_hold(KEYS[1], ARGV[1], now_ms, ARGV[3])
-- The root grant drew the lock's last fence, and nothing else could draw one while the group held the lock; a counter
-- that was lost meanwhile is drawn anew (higher than every earlier fence).
local fence = redis.call('GET', KEYS[2]) or draw_fence(KEYS[2], now, ARGV[5])
return {now, 1, fence or '0', tonumber(ARGV[3])}
