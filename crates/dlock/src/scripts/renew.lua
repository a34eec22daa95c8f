-- renew: extend many leases in one call, each only if its owner still holds it. Never re-creates a lapsed lock.
--
-- KEYS[i]        lock key of lease i
-- ARGV[2i - 1]   owner token of lease i
-- ARGV[2i]       new lease of lease i, in milliseconds
--
-- Returns  one code per lease, in KEYS order:
--          1   renewed
--          0   the key is gone
--          -1  another owner holds the lock
local codes = {}
for i, key in ipairs(KEYS) do
    local holder = redis.call('GET', key)
    if holder == ARGV[2 * i - 1] then
        redis.call('PEXPIRE', key, ARGV[2 * i])
        codes[i] = 1
    elseif holder then
        codes[i] = -1
    else
        codes[i] = 0
    end
end
return codes
