-- release: give the lock up only if we still own it, handing it to the oldest waiting client that still listens.
--
-- KEYS[1]  lock key
-- KEYS[2]  queue key (waiting client ids, oldest first)
-- ARGV[1]  owner token
-- ARGV[2]  wake-up channel prefix: client `id` listens on ARGV[2] .. id
-- ARGV[3]  reservation in milliseconds: how long the woken client has to claim the lock
--
-- Returns  1   released (the lock key deleted, or reserved for the woken client)
--          0   the key is gone (expired or force-released): nothing changed
--          -1  another owner holds the lock: nothing changed
local holder = redis.call('GET', KEYS[1])
if holder ~= ARGV[1] then
    if holder then
        return -1
    end
    return 0
end
if not wake_next(KEYS[2], KEYS[1], ARGV[2], ARGV[3]) then
    redis.call('DEL', KEYS[1])
end
return 1
