-- wake_next: shared by release, pass_on and force_release (prepended to each of them when it is loaded).
--
-- Pops waiting client ids, oldest first, until one is alive: its liveness deadline (kept in the waiters hash, renewed
-- by each of its attempts, in server time) has not passed, and PUBLISH of `payload` (the lock key) on its channel
-- (`prefix .. id`) reached at least one subscriber. Liveness is decided by the deadline, not by PUBLISH's count, which
-- pattern subscribers inflate (and which counts one node only on Redis Cluster); a count of 0 still proves a client
-- gone on a single server. The lock key then holds the reservation "dl1:rsv:<id>" for `reservation_ms`: only that
-- client can take the lock meanwhile, so a releaser that loops cannot barge ahead of it. Returns true when a client
-- was woken; the caller deletes the lock key otherwise.
--
-- Work: every id popped here was pushed by one acquire call and is popped once, so however many dead entries sit at
-- the head of the queue, the cost is paid once per entry, and no count of them can keep a live waiter from its turn.
local function wake_next(queue_key, waiters_key, lock_key, prefix)
    local now_ms = nil
    while true do
        local id = redis.call('LPOP', queue_key)
        if not id then
            return false
        end
        local alive = tonumber(redis.call('HGET', waiters_key, id))
        redis.call('HDEL', waiters_key, id)
        if alive then
            if not now_ms then
                local t = redis.call('TIME')
                now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
            end
            if alive >= now_ms and redis.call('PUBLISH', prefix .. id, lock_key) > 0 then
                redis.call('SET', lock_key, 'dl1:rsv:' .. id, 'PX', RESERVATION_MS)
                return true
            end
        end
    end
end
