-- acquire: take the lock if it is free, drawing the next fence in the same atomic step (grant.lua); otherwise, for a
-- caller that will wait, register this attempt's token so that a release can hand the lock over to it directly
-- (hand_off.lua). Idempotent per token: run twice with the same token (a retried request), it answers the grant of
-- the first run, with the time left on it.
--
-- KEYS[1]  lock key: the owner token with a millisecond expiry
-- KEYS[2]  fence key: the last fence granted for this lock
-- KEYS[3]  queue key: a list of waiting client ids, oldest first
-- KEYS[4]  waiters key: a hash of waiting client id -> "<alive until, server ms> <claim ms> <token>"
-- ARGV[1]  the new owner token (starts with "dl1:")
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  how long a fence counter lives after it was created, in milliseconds
-- ARGV[4]  the caller's client id
-- ARGV[5]  "0" for a single try; "1" for the first attempt of a wait (join the queue when busy); "2" for a later
--          attempt of a wait (the caller may be queued already: leave the queue on success)
-- ARGV[6]  the claim lease in milliseconds: how long a hand-off to this token lasts before its holder extends it
-- ARGV[7]  the token of the same wait's previous attempt, or "": a release may have handed the lock to it
--
-- Constants (prepended): LIVENESS_MS, how long a waiter counts as live without another attempt; QUEUE_RETENTION_MS,
-- how long the queue outlives the current holder's lease.
--
-- Returns  {1, fence, now, ms}   granted to ARGV[1], with `ms` left on the lease: the whole lease for a new grant,
--                                the time left when the lock already held this token (a re-sent request)
--          {2, fence, now, ms}   a release had handed the lock to the previous token ARGV[7]; `ms` left on it
--          {0, pttl, now, 0}     busy: held by another owner; pttl is its time left in ms (-1: no expiry)
--          {-1, 0, now, 0}       the lock key holds a value leasehold did not write
--          {-2, 0, now, 0}       the fence key holds something that is not a number (nothing was granted)
--          The fence and `now` (the server time in microseconds when the script ran) are decimal strings.
local now = clock_us()

if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    if ARGV[5] == '2' then
        redis.call('LREM', KEYS[3], 0, ARGV[4])
        redis.call('HDEL', KEYS[4], ARGV[4])
    end
    local fence = draw_fence(KEYS[2], now, ARGV[3])
    if not fence then
        redis.call('DEL', KEYS[1])
        return {-2, 0, now, 0}
    end
    return {1, fence, now, ARGV[2]}
end

local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] or (ARGV[7] ~= '' and holder == ARGV[7]) then
    -- This request ran before (a retry after a lost reply), or a release handed the lock to this wait's previous
    -- attempt: the grant stands, with the fence it drew and the time left on it.
    if ARGV[5] ~= '0' then
        redis.call('LREM', KEYS[3], 0, ARGV[4])
        redis.call('HDEL', KEYS[4], ARGV[4])
    end
    local code = 1
    if holder ~= ARGV[1] then
        code = 2
    end
    return {code, redis.call('GET', KEYS[2]) or '0', now, redis.call('PTTL', KEYS[1])}
end
if string.sub(holder, 1, 4) ~= 'dl1:' then
    return {-1, 0, now, 0}
end
local pttl = redis.call('PTTL', KEYS[1])
if ARGV[5] ~= '0' then
    -- One queue entry per client; every attempt renews its liveness and replaces the token a release will grant.
    local entry = string.format('%d', tonumber(string.sub(now, 1, -4)) + LIVENESS_MS) .. ' ' .. ARGV[6] .. ' ' .. ARGV[1]
    if redis.call('HSET', KEYS[4], ARGV[4], entry) == 1 then
        redis.call('RPUSH', KEYS[3], ARGV[4])
    end
    local keep = math.max(pttl, 0) + QUEUE_RETENTION_MS
    redis.call('PEXPIRE', KEYS[3], keep)
    redis.call('PEXPIRE', KEYS[4], keep)
end
return {0, pttl, now, 0}
