-- grant: shared by the scripts that grant a lock (prepended to each of them when it is loaded).
--
-- clock_us()  the server time in microseconds, as a decimal string.
-- draw_fence(fence_key, now, retention_ms)
--             draws the fence of a grant made at `now` (a clock_us() string): max(last fence + 1, now), written
--             back in the same step. A counter that was lost (restart without persistence, failover, retention over,
--             deleted) or that came back stale (a restore from an older snapshot, a replica promoted before it caught
--             up) is overtaken by the clock, so fences keep increasing as long as the server clock does not step
--             back. Returns the fence (a decimal string), or nil when the counter holds something that is not a
--             fence (then nothing is granted and the counter is left as it was).
-- held_as(lock)
--             the kind of leasehold lock the key `lock` holds, as one byte for a reply: 'm' a mutex (a string),
--             otherwise the family of the first hold's tag ('x' fair mutex, 'r' read-write lock, 's' semaphore, 'e'
--             reentrant mutex); nil when the key holds something leasehold did not write. A script that refuses a key
--             says this in the same step, so the refusal cannot be explained by a later state (a lock of another
--             kind released in between reads as gone, or as what took its place).
--
-- The clock and the fence stay decimal strings: converting numbers (strtod, %.17g) costs more than the rest of a
-- grant. Decimal strings without leading zeros compare as numbers by length, then bytes.
local function held_as(lock)
    local kind = redis.call('TYPE', lock).ok
    if kind == 'string' then
        if string.sub(redis.call('GET', lock), 1, 4) == 'dl1:' then
            return string.byte('m')
        end
    elseif kind == 'zset' then
        local first = redis.call('ZRANGEBYSCORE', lock, 0, '+inf', 'LIMIT', 0, 1)[1]
        if first and string.find(first, ' dl1:', 1, true) then
            local c = string.sub(first, 1, 1)
            if c == 'w' then
                c = 'r'
            elseif c == 'n' then
                c = 'e'
            end
            return string.byte(c)
        end
    end
    return nil
end

local function clock_us()
    local t = redis.call('TIME')
    return t[1] .. string.sub('00000' .. t[2], -6)
end

local function draw_fence(fence_key, now, retention_ms)
    local last = redis.pcall('SET', fence_key, now, 'KEEPTTL', 'GET')
    if not last then
        redis.call('PEXPIRE', fence_key, retention_ms)
        return now
    end
    if type(last) ~= 'string' or not string.find(last, '^%d+$') then
        -- Another type (SET failed and changed nothing), or a string that is not a fence: put it back.
        if type(last) == 'string' then
            redis.call('SET', fence_key, last, 'KEEPTTL')
        end
        return nil
    end
    if #last < #now or (#last == #now and last < now) then
        return now
    end
    -- The counter is ahead of the clock (more than a grant per µs, or a clock that stepped back).
    local fence = string.format('%d', tonumber(last) + 1)
    redis.call('SET', fence_key, fence, 'KEEPTTL')
    return fence
end

-- touch(lock, pttl)
--             sets the lock key's expiry to what it is (`pttl`, just read): no change, but a write, which the
--             server replicates. An attempt that finds its own grant (a hand-off that another client's release made,
--             a request that ran before) writes nothing else, and since Redis 7.2 (and on Valkey) `WAIT` counts only
--             the connection's own writes: without this, the `WAIT` pipelined after the attempt would answer for an
--             older offset, one without the grant, and a grant no replica has would be reported replicated.
local function touch(lock, pttl)
    if pttl > 0 then
        redis.call('PEXPIRE', lock, pttl)
    end
end

-- notify(lock, prefix, id, message)
--             publishes a wake-up for the waiting client `id` of the lock whose key is `lock`, and returns whether the
--             grant it carries may be stored: a count of the subscribers that can act on it, or 1 when that count
--             cannot be trusted.
--             On one server `prefix` is `P:wake:` and the channel is the client's own, `P:wake:<id>` (PUBLISH): its
--             subscriber is connected to this very server, so a count of 0 proves the client gone.
--             With Sentinel `prefix` ends with `=` (`P:wake:=`): the channel is the client's own too, but after a
--             failover its subscriber may still sit on the demoted primary, which receives this message through
--             replication while this server counts 0.
--             An empty `prefix` means Redis Cluster: the channel is `P:{N}:wake:<id>`, in the lock's own slot,
--             published with SPUBLISH (it stays in the lock's shard: no broadcast over the cluster bus); replicas
--             deliver sharded messages too, so the same holds.
--             Where the count cannot be trusted, a published grant must always be stored (1 is returned), so that no
--             message ever names a grant that does not exist; a waiter that is in fact gone then holds the lock for
--             its claim at most, and liveness is judged by server time alone (the queue entry's deadline).
local function notify(lock, prefix, id, message)
    if prefix == '' then
        redis.call('SPUBLISH', lock .. ':wake:' .. id, message)
        return 1
    end
    local count = redis.call('PUBLISH', prefix .. id, message)
    if string.byte(prefix, -1) == 61 then
        return 1
    end
    return count
end
