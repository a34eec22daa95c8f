-- acquire: for each lock of the call, take it if it is free, drawing the next fence in the same atomic step
-- (grant.lua); otherwise, for a caller that will wait, register that attempt's token so that a release can hand the
-- lock over to it directly (hand_off.lua). One call carries the attempts of one client for many locks (coalesced
-- requests); each lock's outcome is its own. Idempotent per token: run twice with the same token (a retried
-- request), an attempt answers the grant of the first run, with the time left on it.
--
-- KEYS[4i-3]  lock key of attempt i: the owner token with a millisecond expiry
-- KEYS[4i-2]  its fence key: the last fence granted for that lock
-- KEYS[4i-1]  its queue key: a list of waiting client ids, oldest first
-- KEYS[4i]    its waiters key: a hash of waiting client id -> "<alive until, server ms> <claim ms> <token>"
-- ARGV[1]     how long a fence counter lives after it was created, in milliseconds
-- ARGV[2]     the caller's client id
-- ARGV[5i-2]  attempt i's new owner token (starts with "dl1:")
-- ARGV[5i-1]  its lease in milliseconds
-- ARGV[5i]    "0" for a single try; "1" for the first attempt of a wait (join the queue when busy); "2" for a later
--             attempt of a wait (the caller may be queued already: leave the queue on success)
-- ARGV[5i+1]  its claim lease in milliseconds: how long a hand-off to this token lasts before its holder extends it
-- ARGV[5i+2]  the token of the same wait's previous attempt, or "": a release may have handed the lock to it
--
-- Constants (prepended): LIVENESS_MS, how long a waiter counts as live without another attempt; QUEUE_RETENTION_MS,
-- how long the queue outlives the current holder's lease.
--
-- Returns  "now code_1 value_1 ms_1 code_2 value_2 ms_2 ...", one string of decimal integers separated by spaces (a
--          client parses one string much faster than an array: see `Numbers` in scripts.rs), `now` being the server
--          time in microseconds when the script ran, and per attempt:
--          1, fence, ms    granted to its token, with `ms` left on the lease: the whole lease for a new grant, the
--                          time left when the lock already held this token (a re-sent request)
--          2, fence, ms    a release had handed the lock to the previous token; `ms` left on it
--          0, pttl, 0      busy: held by another owner; pttl is its time left in ms (-1: no expiry)
--          -1, 0, 0        the lock key holds something leasehold did not write (nothing changed)
--          -3, kind, 0     the lock key holds a leasehold lock of another kind (`held_as` in grant.lua; nothing
--                          changed)
--          -2, 0, 0        the fence key holds something that is not a number (nothing was granted)
local now = clock_us()
local reply = {now}

local function attempt(lock, fence_key, queue, waiters, token, ttl, mode, claim, prev)
    if redis.call('SET', lock, token, 'NX', 'PX', ttl) then
        if mode == '2' then
            redis.call('LREM', queue, 0, ARGV[2])
            redis.call('HDEL', waiters, ARGV[2])
        end
        local fence = draw_fence(fence_key, now, ARGV[1])
        if not fence then
            redis.call('DEL', lock)
            return -2, 0, 0
        end
        return 1, fence, ttl
    end
    local holder = redis.pcall('GET', lock)
    if type(holder) ~= 'string' then
        local other = held_as(lock)
        if other then
            return -3, other, 0
        end
        return -1, 0, 0
    end
    if holder == token or (prev ~= '' and holder == prev) then
        -- This request ran before (a retry after a lost reply), or a release handed the lock to this wait's
        -- previous attempt: the grant stands, with the fence it drew and the time left on it.
        if mode ~= '0' then
            redis.call('LREM', queue, 0, ARGV[2])
            redis.call('HDEL', waiters, ARGV[2])
        end
        local code = 1
        if holder ~= token then
            code = 2
        end
        local pttl = redis.call('PTTL', lock)
        touch(lock, pttl)
        return code, redis.call('GET', fence_key) or '0', pttl
    end
    if string.sub(holder, 1, 4) ~= 'dl1:' then
        return -1, 0, 0
    end
    local pttl = redis.call('PTTL', lock)
    if mode ~= '0' then
        -- One queue entry per client; every attempt renews its liveness and replaces the token a release will grant.
        local alive_until = string.format('%d', tonumber(string.sub(now, 1, -4)) + LIVENESS_MS)
        if redis.call('HSET', waiters, ARGV[2], alive_until .. ' ' .. claim .. ' ' .. token) == 1 then
            redis.call('RPUSH', queue, ARGV[2])
        end
        local keep = math.max(pttl, 0) + QUEUE_RETENTION_MS
        redis.call('PEXPIRE', queue, keep)
        redis.call('PEXPIRE', waiters, keep)
    end
    return 0, pttl, 0
end

for i = 1, #KEYS / 4 do
    local k, a = 4 * i - 3, 5 * i - 2
    local code, value, ms = attempt(KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3],
        ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
    reply[3 * i - 1] = code
    reply[3 * i] = value
    reply[3 * i + 1] = ms
end
return table.concat(reply, ' ')
