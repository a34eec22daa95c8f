-- wake_next: shared by release, pass_on and force_release (prepended to each of them when it is loaded).
--
-- Pops waiting client ids, oldest first, and publishes `payload` (the lock key) on each one's channel
-- (`prefix .. id`) until a client is still listening: PUBLISH answers how many subscribers got the message, and 0
-- means that client is gone. The lock key then holds the reservation "dl1:rsv:<id>" for `reservation_ms`: only
-- that client can take the lock meanwhile, so a releaser that loops cannot barge ahead of it. Returns true when a
-- client was woken; the caller deletes the lock key otherwise.
local function wake_next(queue_key, lock_key, prefix, reservation_ms)
    for _ = 1, 16 do
        local id = redis.call('LPOP', queue_key)
        if not id then
            return false
        end
        if redis.call('PUBLISH', prefix .. id, lock_key) > 0 then
            redis.call('SET', lock_key, 'dl1:rsv:' .. id, 'PX', reservation_ms)
            return true
        end
    end
    return false
end

