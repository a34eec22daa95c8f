-- set: shared by the scripts of the queued lock kinds (prepended after grant.lua): the fair mutex, the read-write
-- lock and the counting semaphore. Such a lock is a sorted set of holds instead of one owner token:
--
--   lock key   zset: hold -> the server time (ms) its lease ends; a hold is "<tag> <token>", the tag saying what it
--              holds: "x" (the fair mutex), "r" or "w" (a read or write share), "s<k>" (k permits), "e" (a
--              reentrant mutex's root grant) or "n" (a nested hold of it, see reenter.lua)
--   queue      list of wait ids, oldest first: every waiting task has its own entry (strict FIFO across processes)
--   waiters    hash: wait id -> "<alive until, server ms> <claim ms> <limit> <client id> <hold>", the hold that a
--              grant to this wait would store; <limit> is the semaphore's permit count as that waiter counts it
--
-- A semaphore's capacity (its permit count) lives in the lock key too, as the member "permits" with the score -C. It
-- cannot collide with a hold (a hold always has a space), and no range from the server's time up sees it (its score
-- is negative). It counts only while a live hold exists: `purge` drops it with the last live hold, so a release that
-- leaves no live hold removes it and the key vanishes as before, and a grant made when no live hold exists stores the
-- grantee's own count (`store_hold`). While it exists, admission counts against it alone, and a request carrying
-- another count is refused (set_acquire.lua). A queued waiter carrying another count is dropped when the queue is
-- served (`serve`): its id leaves the list and its entry becomes "<alive until> refused <capacity>", a marker that its
-- next heartbeat finds and answers with the refusal (it lapses with the waiter's liveness, and `requeue_missing`
-- never puts it back in the list). set_permits.lua changes the capacity. Lapsed holds are removed from score 0 up, never from -inf, so that the capacity stays.
--
-- A hold is live while its score is at least the server's time; lapsed holds are removed by the next script that
-- looks. Waiters are served in queue order, each as soon as it is admissible (`admits`), by every script that can
-- free capacity (a release, a leave) and by every acquire (capacity also frees up when a holder's lease runs out).
-- Every entry of the hash has its id in the list; a waiter's heartbeat puts back ids the list lost
-- (`requeue_missing`), and serving drops ids whose entry the hash lost.

-- The family of a tag: holds of different families never share a lock.
local function family(tag)
    local c = string.sub(tag, 1, 1)
    if c == 'w' then
        return 'r'
    elseif c == 'n' then
        return 'e'
    end
    return c
end

-- The first live hold (its member), or nil.
local function first_hold(lock, now_ms)
    return redis.call('ZRANGEBYSCORE', lock, now_ms, '+inf', 'LIMIT', 0, 1)[1]
end

-- The member that stores a semaphore's capacity (see above).
local CAPACITY = 'permits'

-- A semaphore's stored capacity (a number), or nil when none is stored. Meaningful after `purge`, which drops it
-- with the last live hold.
local function capacity(lock)
    local score = redis.call('ZSCORE', lock, CAPACITY)
    if score then
        return -tonumber(score)
    end
    return nil
end

-- The stored capacity when a hold tagged `tag` counting `limit` permits disagrees with it (a semaphore only), or nil.
local function wrong_count(lock, tag, limit)
    if string.sub(tag, 1, 1) ~= 's' then
        return nil
    end
    local stored = capacity(lock)
    if stored and stored ~= tonumber(limit) then
        return stored
    end
    return nil
end

-- Whether a hold tagged `tag` can be granted next to the live holds, `limit` being the permit count for a semaphore
-- (the stored capacity counts instead when there is one).
local function admits(lock, now_ms, tag, limit)
    local c = string.sub(tag, 1, 1)
    if c == 's' then
        local cap = capacity(lock) or tonumber(limit)
        local used = tonumber(string.sub(tag, 2))
        for _, hold in ipairs(redis.call('ZRANGEBYSCORE', lock, now_ms, '+inf')) do
            -- A hold of another kind (a name misused) counts as taking every permit.
            used = used + (tonumber(string.match(hold, '^s(%d+) ')) or cap)
        end
        return used <= cap
    end
    local first = first_hold(lock, now_ms)
    if not first then
        return true
    end
    -- Shares stack; everything else is exclusive. (A write hold is always alone, so the first one tells.)
    return c == 'r' and string.sub(first, 1, 2) == 'r '
end

-- Stores `hold` with a lease of `ms` from `now_ms`; the key lives at least as long as its longest hold. A semaphore's
-- hold stores `limit` as the capacity when none is stored (the first live hold: see above).
local function store_hold(lock, hold, now_ms, ms, limit)
    redis.call('ZADD', lock, now_ms + ms, hold)
    if string.sub(hold, 1, 1) == 's' then
        redis.call('ZADD', lock, 'NX', -tonumber(limit), CAPACITY)
    end
    if redis.call('PTTL', lock) < tonumber(ms) then
        redis.call('PEXPIRE', lock, ms)
    end
end

-- Drops the holds whose lease ended (from score 0: the capacity's score is negative), and the capacity with the last
-- live hold, so that no key outlives the lock and a semaphore with no live hold takes the next grantee's count.
local function purge(lock, now_ms)
    redis.call('ZREMRANGEBYSCORE', lock, 0, '(' .. now_ms)
    if not first_hold(lock, now_ms) then
        redis.call('ZREM', lock, CAPACITY)
    end
end

-- Puts back in the queue the waiters whose entry is in the waiters hash but whose id is missing from the list (the
-- list lost it: its key evicted, a hand edit, a partial restore): nothing would ever serve them, and each would wait
-- for good while its heartbeats kept its entry live. Entries and ids are written and removed together, so the list
-- has at least as many ids as the hash has entries unless one was lost: two counts tell, and the walk over both (O(n))
-- runs only when they show a loss. A live entry goes to the back: its place went with its id, and the back overtakes
-- no waiter still listed (those re-queued in one walk follow the hash's order). An entry whose liveness is over is
-- dropped instead: its waiter is gone, and nothing else would ever pop it.
local function requeue_missing(queue, waiters, now_ms)
    if redis.call('HLEN', waiters) <= redis.call('LLEN', queue) then
        return
    end
    local listed = {}
    for _, wid in ipairs(redis.call('LRANGE', queue, 0, -1)) do
        listed[wid] = true
    end
    local entries = redis.call('HGETALL', waiters)
    for i = 1, #entries, 2 do
        local wid = entries[i]
        if not listed[wid] then
            local alive = tonumber(string.match(entries[i + 1], '^(%d+) '))
            if string.find(entries[i + 1], '^%d+ refused ') then
                -- A dropped waiter's marker (see above): never listed, gone with its liveness.
                if not alive or alive < now_ms then
                    redis.call('HDEL', waiters, wid)
                end
            elseif alive and alive >= now_ms then
                redis.call('RPUSH', queue, wid)
            else
                redis.call('HDEL', waiters, wid)
            end
        end
    end
    -- A list that was lost entirely is a new key: it lives as long as the hash, as queue and hash always do.
    local keep = redis.call('PTTL', waiters)
    if keep > 0 and redis.call('PTTL', queue) == -1 then
        redis.call('PEXPIRE', queue, keep)
    end
end

-- Serves the queue: grants the oldest live waiters, in order, for as long as the head is admissible. Dead entries
-- (liveness over, or, on one server, nobody subscribed to their client's channel) and semaphore waiters whose count
-- disagrees with the stored capacity (their next heartbeat is refused) are dropped on the way; each entry
-- is popped once, so their number costs once in all. A waiter is granted a claim lease and told on its client's
-- channel (as in hand_off.lua); the waiter `self_wid` (the caller of an acquire, or nil) is granted `self_ttl` and
-- told by the reply instead. Returns the fence granted to `self_wid` (or nil), and false as the second value when
-- the fence counter is not a number (then nothing more is granted).
local function serve(lock, fence_key, queue, waiters, prefix, retention_ms, now, now_ms, self_wid, self_ttl)
    local mine
    while true do
        local wid = redis.call('LINDEX', queue, 0)
        if not wid then
            return mine, true
        end
        local entry = redis.call('HGET', waiters, wid)
        local alive, claim, limit, client, hold
        if entry then
            alive, claim, limit, client, hold = string.match(entry, '^(%d+) (%d+) (%d+) (%S+) (.+)$')
        end
        local refused
        if alive and tonumber(alive) >= now_ms then
            local tag = string.match(hold, '^%S+')
            refused = wrong_count(lock, tag, limit)
            if refused then
                alive = nil
            elseif not admits(lock, now_ms, tag, limit) then
                return mine, true
            end
        end
        redis.call('LPOP', queue)
        if refused and wid ~= self_wid then
            redis.call('HSET', waiters, wid, string.match(entry, '^%d+') .. ' refused ' .. string.format('%d', refused))
        else
            redis.call('HDEL', waiters, wid)
        end
        if alive and tonumber(alive) >= now_ms then
            local fence = draw_fence(fence_key, now, retention_ms)
            if not fence then
                return mine, false
            end
            if wid == self_wid then
                store_hold(lock, hold, now_ms, self_ttl, limit)
                mine = fence
            else
                local grant = 'g ' .. fence .. ' ' .. now .. ' ' .. claim .. ' ' .. hold .. '\n' .. lock
                if notify(lock, prefix, client, grant) > 0 then
                    store_hold(lock, hold, now_ms, claim, limit)
                end
            end
        end
    end
end

-- Releases `hold` if it is live (and serves the queue). Returns 1 (released now, or by an earlier run of the same
-- request), 0 (gone: lapsed, or never granted), -2 (the key is not a set of holds).
local function release_hold(lock, queue, waiters, released, fence_key, hold, prefix, retention_ms, now, now_ms)
    local score = redis.pcall('ZSCORE', lock, hold)
    if type(score) == 'table' then
        return -2
    end
    if score and tonumber(score) >= now_ms then
        -- Remembered for the rest of its lease, so that a retried release is recognised. A mutex of the same name
        -- may have left its released token there (a string, for the rest of its lease): that record is of no use to
        -- this lock, and the script must not stop halfway on it.
        if type(redis.pcall('ZREMRANGEBYSCORE', released, 0, '(' .. now_ms)) ~= 'number' then
            redis.call('DEL', released)
        end
        redis.call('ZREM', lock, hold)
        redis.call('ZADD', released, score, hold)
        if redis.call('PTTL', released) < tonumber(score) - now_ms then
            redis.call('PEXPIRE', released, tonumber(score) - now_ms)
        end
        purge(lock, now_ms)
        serve(lock, fence_key, queue, waiters, prefix, retention_ms, now, now_ms, nil, 0)
        return 1
    end
    local again = redis.pcall('ZSCORE', released, hold)
    if type(again) == 'string' and tonumber(again) >= now_ms then
        return 1
    end
    return 0
end
