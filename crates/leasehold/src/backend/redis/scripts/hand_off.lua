-- hand_off: shared by release and force_release (prepended when they are loaded, after grant.lua).
--
-- Grants a just-freed lock to the oldest live waiting client, in the same atomic step as the release: the waiter's
-- registered token becomes the owner with a short claim lease, the fence is drawn as for any grant, and the grant is
-- published on the waiter's channel (`prefix .. id`) as
--     "g <fence> <server µs now> <claim ms> <token>\n<lock key>"
-- so that the waiter starts at once, without another round trip. The waiters hash holds, per waiting client id,
-- "<alive until, server ms> <claim ms> <token>", written by that client's latest busy attempt; an entry of another
-- format (a queued kind's waiter, left from when the name was used as that kind) is dropped, never granted.
--
-- Liveness is decided by server time (each attempt of a waiting client renews its entry), never by PUBLISH's count,
-- which pattern subscribers inflate. A count of 0 still proves the client gone on one server: the entry is skipped (on
-- Redis Cluster, where no count proves anything, `notify` reports 1 and the live waiter is granted: see grant.lua). A waiter that died less than a liveness window ago is granted
-- a claim lease it never extends: the lock is then held for at most that claim (2 s), never for a whole lease.
--
-- Work: every id popped here was pushed by one acquire call and is popped once, so however many dead entries sit at
-- the head of the queue, the cost is paid once per entry, and no count of them can keep a live waiter from its turn.
-- Returns true when the lock was handed over; false when nobody live waits (the lock stays free), or when the fence
-- counter is not a number (nothing is granted: the waiters' own attempts report it).
local function hand_off(lock_key, fence_key, queue_key, waiters_key, prefix, retention_ms)
    local now, now_ms, fence
    while true do
        local id = redis.call('LPOP', queue_key)
        if not id then
            return false
        end
        local entry = redis.call('HGET', waiters_key, id)
        redis.call('HDEL', waiters_key, id)
        local alive, claim, token
        if entry then
            -- Only a mutex waiter's entry: a queued kind's waiters (set.lua) may still be listed when the name
            -- changed kinds, and the tail of their entry is no owner token.
            alive, claim, token = string.match(entry, '^(%d+) (%d+) (dl1:.+)$')
        end
        if alive then
            if not now then
                now = clock_us()
                now_ms = tonumber(string.sub(now, 1, -4))
            end
            if tonumber(alive) >= now_ms then
                if not fence then
                    fence = draw_fence(fence_key, now, retention_ms)
                    if not fence then
                        return false
                    end
                end
                local grant = 'g ' .. fence .. ' ' .. now .. ' ' .. claim .. ' ' .. token .. '\n' .. lock_key
                if notify(lock_key, prefix, id, grant) > 0 then
                    redis.call('SET', lock_key, token, 'PX', claim)
                    return true
                end
            end
        end
    end
end
