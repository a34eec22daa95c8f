-- set_acquire: for each lock of the call (a fair mutex, read-write lock or semaphore: see set.lua), grant a hold if
-- the lock admits it and nobody live waits ahead; otherwise, for a caller that will wait, enter (or refresh) its own
-- entry at the back of the lock's queue, so that the release that makes room grants it directly. Every call serves
-- the queue first: capacity freed by a lapsed lease goes to the oldest waiters, never to a newcomer. One call carries
-- the attempts of one client for many locks; each lock's outcome is its own. Idempotent per hold: run twice (a retried
-- request), an attempt answers the grant of the first run.
--
-- KEYS[4i-3]  lock key of attempt i (the set of holds)
-- KEYS[4i-2]  its fence key
-- KEYS[4i-1]  its queue key
-- KEYS[4i]    its waiters key
-- ARGV[1]     how long a fence counter lives after it was created, in milliseconds
-- ARGV[2]     the caller's client id (its wake-up channel is ARGV[3] .. id)
-- ARGV[3]     wake-up channel prefix (empty on Redis Cluster: see `notify` in grant.lua)
-- ARGV[7i-3]  attempt i's hold: "<tag> <new owner token>"
-- ARGV[7i-2]  its lease in milliseconds
-- ARGV[7i-1]  "0" for a single try; "1" or "2" for an attempt of a wait (enter or refresh the queue entry)
-- ARGV[7i]    its claim lease in milliseconds (for a grant a release hands over)
-- ARGV[7i+1]  the hold of the same wait's previous attempt, or "": a release may have granted it
-- ARGV[7i+2]  the wait's id (unique per waiting task), or ""
-- ARGV[7i+3]  the permit count, for a semaphore ("0" otherwise): the capacity the attempt stores when the semaphore
--             has no live hold; while it has one, an attempt carrying a count other than the stored capacity is
--             refused (code -5) and leaves the queue (see set.lua)
--
-- Returns  "now code_1 value_1 ms_1 ..." (one string, as acquire.lua): 1 granted (fence, ms left), 2 granted to
--          the previous hold (fence, ms left), 0 busy (ms until the first hold's lease ends, or -1 when none does but
--          the queue is not empty), -1 the key is not a set of holds, -2 the fence counter is not a number, -3 the
--          lock is held as another kind (a mutex name used as a semaphore, say; value: that kind, see `held_as` in
--          grant.lua), -5 the permit count disagrees with
--          the semaphore's stored capacity (value: the capacity; nothing held, no queue entry left). A retried
--          request answers the lock's latest fence, which is at least its own.
local now = clock_us()
local now_ms = tonumber(string.sub(now, 1, -4))
local reply = {now}

local function leave(queue, waiters, wid)
    if wid ~= '' then
        redis.call('LREM', queue, 0, wid)
        redis.call('HDEL', waiters, wid)
    end
end

local function busy(lock)
    local first = redis.call('ZRANGEBYSCORE', lock, now_ms, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if first[2] then
        return 0, tonumber(first[2]) - now_ms, 0
    end
    return 0, -1, 0
end

local function attempt(lock, fence_key, queue, waiters, hold, ttl, mode, claim, prev, wid, limit)
    for _, mine in ipairs({hold, prev}) do
        if mine ~= '' then
            local score = redis.pcall('ZSCORE', lock, mine)
            if type(score) == 'table' then
                local other = held_as(lock)
                if other then
                    return -3, other, 0
                end
                return -1, 0, 0
            end
            if score and tonumber(score) >= now_ms then
                -- This request ran before, or a release granted the previous attempt's hold.
                leave(queue, waiters, wid)
                local code = 1
                if mine ~= hold then
                    code = 2
                end
                touch(lock, redis.call('PTTL', lock))
                return code, redis.call('GET', fence_key) or '0', tonumber(score) - now_ms
            end
        end
    end
    local tag = string.match(hold, '^%S+')
    local first = first_hold(lock, now_ms)
    if first and family(string.match(first, '^%S+')) ~= family(tag) then
        return -3, string.byte(family(string.match(first, '^%S+'))), 0
    end
    purge(lock, now_ms)
    -- A waiter already queued is judged by the count its entry carries: the count it queued with, or the one
    -- set_permits.lua gave the queue since (its handle still carries the old one).
    -- A waiter the serving dropped for its count (see set.lua) hears of it now, whatever the capacity is since.
    local queued = mode ~= '0' and wid ~= '' and redis.call('HGET', waiters, wid)
    local dropped
    if queued then
        limit = string.match(queued, '^%d+ %d+ (%d+) ') or limit
        dropped = tonumber(string.match(queued, '^%d+ refused (%d+)$'))
    end
    -- A count that disagrees with the capacity is refused, before and after serving (serving may store another one).
    local function refused(stored)
        leave(queue, waiters, wid)
        serve(lock, fence_key, queue, waiters, ARGV[3], ARGV[1], now, now_ms, nil, 0)
        return -5, stored, 0
    end
    local stored = wrong_count(lock, tag, limit) or dropped
    if stored then
        return refused(stored)
    end
    local self_wid
    if mode ~= '0' then
        self_wid = wid
        local entry = (now_ms + LIVENESS_MS) .. ' ' .. claim .. ' ' .. limit .. ' ' .. ARGV[2] .. ' ' .. hold
        if redis.call('HSET', waiters, wid, entry) == 1 then
            redis.call('RPUSH', queue, wid)
        else
            -- A heartbeat of a queued waiter: its id, or another's, may be missing from the list.
            requeue_missing(queue, waiters, now_ms)
        end
    end
    local fence, ok = serve(lock, fence_key, queue, waiters, ARGV[3], ARGV[1], now, now_ms, self_wid, ttl)
    if not ok then
        return -2, 0, 0
    end
    if fence then
        return 1, fence, tonumber(ttl)
    end
    stored = wrong_count(lock, tag, limit)
    if stored then
        return refused(stored)
    end
    if mode == '0' then
        if redis.call('LLEN', queue) == 0 and admits(lock, now_ms, tag, limit) then
            fence = draw_fence(fence_key, now, ARGV[1])
            if not fence then
                return -2, 0, 0
            end
            store_hold(lock, hold, now_ms, ttl, limit)
            return 1, fence, tonumber(ttl)
        end
        return busy(lock)
    end
    local code, left, ms = busy(lock)
    local keep = math.max(left, 0) + QUEUE_RETENTION_MS
    redis.call('PEXPIRE', queue, keep)
    redis.call('PEXPIRE', waiters, keep)
    return code, left, ms
end

for i = 1, #KEYS / 4 do
    local k, a = 4 * i - 3, 7 * i - 3
    local code, value, ms = attempt(KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3],
        ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], ARGV[a + 6])
    reply[3 * i - 1] = code
    reply[3 * i] = value
    reply[3 * i + 1] = ms
end
return table.concat(reply, ' ')
