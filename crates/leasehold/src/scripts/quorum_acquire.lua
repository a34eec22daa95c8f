-- quorum_acquire: one node's vote in a quorum round (quorum.rs). Takes the lock if it is free and draws this node's
-- fence as a single server does (grant.lua); when the caller proposed a fence for the whole quorum, the node takes
-- that instead if it is at least what it would draw and not too far past its own clock. A round whose proposal a
-- majority took in their grants has its fence in one round trip; otherwise the caller writes back the largest fence
-- it saw (fence_up.lua). Idempotent per token: a re-sent request answers the grant of its first run.
--
-- KEYS[1]  lock key: the owner token with a millisecond expiry
-- KEYS[2]  its fence counter
-- ARGV[1]  the caller's new owner token (starts with "dl1:")
-- ARGV[2]  the lease, in milliseconds
-- ARGV[3]  the proposed fence (a decimal string), or "0" for none
-- ARGV[4]  how long a fence counter lives after it was created, in milliseconds
-- ARGV[5]  how far past this node's clock a proposal may be, in microseconds
--
-- Returns  {now, code, value, ms, took}, `now` being the server time in microseconds when the script ran (a decimal
--          string):
--          1, fence, ms, took   granted, with `ms` left on the lease (all of it, unless the request ran before);
--                               `took` is 1 when the fence is the proposal, else 0
--          0, pttl, 0, 0        held by another owner; pttl is its time left in ms (-1: no expiry)
--          -1, 0, 0, 0          the lock key holds something leasehold did not write (nothing changed)
--          -2, 0, 0, 0          the fence key holds something that is not a number (nothing was granted)
--
-- Decimal strings without leading zeros compare as numbers by length, then bytes.
local now = clock_us()
local token, proposal = ARGV[1], ARGV[3]

local function below(a, b)
    return #a < #b or (#a == #b and a < b)
end

if redis.call('SET', KEYS[1], token, 'NX', 'PX', ARGV[2]) then
    local fence = draw_fence(KEYS[2], now, ARGV[4])
    if not fence then
        redis.call('DEL', KEYS[1])
        return {now, -2, 0, 0, 0}
    end
    local limit = string.format('%d', tonumber(now) + tonumber(ARGV[5]))
    if proposal ~= '0' and not below(proposal, fence) and not below(limit, proposal) then
        if proposal ~= fence then
            redis.call('SET', KEYS[2], proposal, 'KEEPTTL')
        end
        return {now, 1, proposal, tonumber(ARGV[2]), 1}
    end
    return {now, 1, fence, tonumber(ARGV[2]), 0}
end
local holder = redis.pcall('GET', KEYS[1])
if type(holder) ~= 'string' then
    return {now, -1, 0, 0, 0}
end
if holder == token then
    -- A re-sent request: the grant of its first run, with the fence the counter holds now.
    local fence = redis.call('GET', KEYS[2]) or '0'
    local took = 0
    if fence == proposal then
        took = 1
    end
    return {now, 1, fence, redis.call('PTTL', KEYS[1]), took}
end
if string.sub(holder, 1, 4) ~= 'dl1:' then
    return {now, -1, 0, 0, 0}
end
return {now, 0, redis.call('PTTL', KEYS[1]), 0, 0}
