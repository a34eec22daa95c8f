-- quorum_acquire: one node's vote in a quorum round (quorum.rs), for a quorum mutex or a share of a quorum read-write
-- lock. Takes the lock if it is free (a share: if it admits the share) and draws this node's fence as a single
-- server does (grant.lua); when the caller proposed a fence for the whole quorum, the node takes that instead if it
-- is at least what it would draw and not too far past its own clock. A round whose proposal a majority took in their
-- grants has its fence in one round trip; otherwise the caller writes back the largest fence it saw (fence_up.lua).
-- Idempotent per token: a re-sent request answers the grant of its first run.
--
-- KEYS[1]  lock key: a mutex's owner token with a millisecond expiry; a read-write lock's set of holds (set.lua)
-- KEYS[2]  its fence counter
-- KEYS[3]  a read-write lock's writer intent: the wait id of a waiting writer, which keeps new readers out (a
--          string with a short expiry; unused by the mutex)
-- KEYS[4]  the voided tokens (quorum_release.lua): a vote that runs after its round was given up is refused
-- ARGV[1]  the caller's new owner token (starts with "dl1:"), or its hold ("r <token>", "w <token>")
-- ARGV[2]  the lease, in milliseconds
-- ARGV[3]  the proposed fence (a decimal string), or "0" for none
-- ARGV[4]  how long a fence counter lives after the lock's last grant, in milliseconds
-- ARGV[5]  how far past this node's clock a proposal may be, in microseconds
-- ARGV[6]  for a waiting writer: its wait id (the same for every round of one wait; ids sort by the wait's start),
--          and ARGV[7] how long its intent lasts without another round, ms; "" otherwise. The oldest waiting writer's
--          intent wins on every node that it asks, so that writers waiting at once converge on one of them
--
-- Returns  {now, code, value, ms, took}, `now` being the server time in microseconds when the script ran (a decimal
--          string):
--          1, fence, ms, took   granted, with `ms` left on the lease (all of it, unless the request ran before);
--                               `took` is 1 when the fence is the proposal, else 0
--          0, ms, 0, 0          busy: held by another owner (or, for a reader, a writer waits); ms until the latest
--                               hold in the way ends (-1: no expiry)
--          -1, 0, 0, 0          the lock key holds something leasehold did not write (nothing changed)
--          -2, 0, 0, 0          the fence key holds something that is not a number (nothing was granted)
--          -3, 0, 0, 0          the token was voided: its round is over (nothing changed)
--          -4, kind, 0, 0       the lock key holds a lock of the other kind: kind 1 a mutex, 2 a read-write lock
--                               (nothing changed)
--
-- Decimal strings without leading zeros compare as numbers by length, then bytes.
local now = clock_us()
local now_ms = tonumber(string.sub(now, 1, -4))
local lock, fence_key, token, ttl, proposal = KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3]

local function below(a, b)
    return #a < #b or (#a == #b and a < b)
end

-- This node's own draw: max(counter + 1, server µs), as on one server, except for a counter that is missing (the
-- lock's first grant, or a counter lapsed, evicted, flushed or lost in a restart): that is floored at the clock plus
-- the proposal lead (ARGV[5]). Quorum fences run up to that lead ahead of the nodes' clocks, so a counter drawn
-- again from the bare clock could give a fence below one this node took from a proposal moments ago. Nil when the
-- counter is not a number.
local function draw()
    local last = redis.pcall('GET', fence_key)
    if not last then
        return string.format('%d', tonumber(now) + tonumber(ARGV[5]))
    end
    if type(last) ~= 'string' or not string.find(last, '^%d+$') then
        return nil
    end
    if below(last, now) then
        return now
    end
    return string.format('%d', tonumber(last) + 1)
end

-- The fence of a grant made now: this node's draw, or the proposal when it may take it. Written back at once, with
-- the counter's retention counted from this grant (ARGV[4]), so that a counter in use never lapses. Nil when the
-- counter is not a number (then nothing is written).
local function fence()
    local drawn = draw()
    if not drawn then
        return nil
    end
    local limit = string.format('%d', tonumber(now) + tonumber(ARGV[5]))
    local f, took = drawn, 0
    if proposal ~= '0' and not below(proposal, drawn) and not below(limit, proposal) then
        f, took = proposal, 1
    end
    redis.call('SET', fence_key, f, 'PX', ARGV[4])
    return f, took
end

-- The fence a re-sent request reports: the counter now, taken from the proposal when it equals it.
local function granted_before(ms)
    local counter = redis.call('GET', fence_key) or '0'
    local took = 0
    if counter == proposal then
        took = 1
    end
    return {now, 1, counter, ms, took}
end

local voided = redis.pcall('ZSCORE', KEYS[4], token)
if type(voided) == 'string' and tonumber(voided) > now_ms then
    return {now, -3, 0, 0, 0}
end

if string.sub(token, 1, 4) == 'dl1:' then
    if redis.call('SET', lock, token, 'NX', 'PX', ttl) then
        local f, took = fence()
        if not f then
            redis.call('DEL', lock)
            return {now, -2, 0, 0, 0}
        end
        return {now, 1, f, tonumber(ttl), took}
    end
    local holder = redis.pcall('GET', lock)
    if type(holder) ~= 'string' then
        if redis.call('TYPE', lock).ok == 'zset' then
            return {now, -4, 2, 0, 0}
        end
        return {now, -1, 0, 0, 0}
    end
    if holder == token then
        return granted_before(redis.call('PTTL', lock))
    end
    if string.sub(holder, 1, 4) ~= 'dl1:' then
        return {now, -1, 0, 0, 0}
    end
    return {now, 0, redis.call('PTTL', lock), 0, 0}
end

-- A share of a read-write lock.
local score = redis.pcall('ZSCORE', lock, token)
if type(score) == 'table' then
    local holder = redis.pcall('GET', lock)
    if type(holder) == 'string' and string.sub(holder, 1, 4) == 'dl1:' then
        return {now, -4, 1, 0, 0}
    end
    return {now, -1, 0, 0, 0}
end
if score and tonumber(score) >= now_ms then
    return granted_before(tonumber(score) - now_ms)
end
purge(lock, now_ms)
local tag = string.sub(token, 1, 1)
local intent = redis.pcall('GET', KEYS[3])
if type(intent) == 'table' then
    return {now, -1, 0, 0, 0}
end
local writer = ARGV[6]
if tag == 'w' and writer ~= '' and (not intent or writer <= intent) then
    -- The oldest waiting writer keeps new readers (and younger writers) out until it got in, withdrew, or stopped
    -- asking.
    redis.call('SET', KEYS[3], writer, 'PX', ARGV[7])
    intent = writer
end
local clear = not intent or (tag == 'w' and intent == writer)
if admits(lock, now_ms, tag, 0) and clear then
    local f, took = fence()
    if not f then
        return {now, -2, 0, 0, 0}
    end
    store_hold(lock, token, now_ms, tonumber(ttl))
    if intent then
        redis.call('DEL', KEYS[3])
    end
    return {now, 1, f, tonumber(ttl), took}
end
local last = redis.call('ZRANGE', lock, -1, -1, 'WITHSCORES')
local ms = -1
if last[2] then
    ms = tonumber(last[2]) - now_ms
end
if intent and ms < 0 then
    ms = redis.call('PTTL', KEYS[3])
end
return {now, 0, ms, 0, 0}
