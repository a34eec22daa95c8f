-- release: for each lock of the call, give it up only if this token still owns it, and hand it to the oldest live
-- waiting client (hand_off.lua); for a lock of a queued kind (a hold "<tag> <token>", see set.lua), give up that hold
-- and serve the queue. One call carries the releases of one client for many locks (coalesced requests);
-- each lock's outcome is its own. Idempotent per token: a release that ran before (a retry after a lost reply) answers
-- 1 again, without touching anything, for as long as the lease it released would have lasted and until the lock's
-- next release.
--
-- KEYS[5i-4]  lock key of release i
-- KEYS[5i-3]  its queue key (waiting client ids, oldest first)
-- KEYS[5i-2]  its waiters key (client id -> "<alive until> <claim ms> <token>")
-- KEYS[5i-1]  its released key: the token of the last release, for the rest of its lease, so that a retry is
--             recognised
-- KEYS[5i]    its fence key (a hand-off draws the next owner's fence)
-- ARGV[1]     wake-up channel prefix: client `id` listens on ARGV[1] .. id (empty on Redis Cluster:
--             see `notify` in grant.lua)
-- ARGV[2]     how long a fence counter lives after it was created, in milliseconds
-- ARGV[i+2]   release i's owner token, or its hold for a queued kind
--
-- Returns  "code_1 code_2 ...", one string (as acquire.lua), per release:
--          1   released (and handed to the next waiting client, if one is live), now or by an earlier run
--          0   the key is gone (expired, force-released, or lost by Redis): nothing changed
--          -1  another owner holds the lock: nothing changed
--          -2  the lock key holds another Redis type, which leasehold did not write: nothing changed
local reply = {}
local now, now_ms
for i = 1, #KEYS / 5 do
    local lock, released, token = KEYS[5 * i - 4], KEYS[5 * i - 1], ARGV[i + 2]
    local holder = false
    if string.sub(token, 1, 4) ~= 'dl1:' then
        if not now then
            now = clock_us()
            now_ms = tonumber(string.sub(now, 1, -4))
        end
        holder = release_hold(lock, KEYS[5 * i - 3], KEYS[5 * i - 2], released, KEYS[5 * i], token, ARGV[1], ARGV[2],
            now, now_ms)
    else
        holder = redis.pcall('GET', lock)
    end
    if type(holder) == 'number' then
        reply[i] = holder
    elseif holder == token then
        -- One command frees the lock and remembers the release: the released key takes the token and the rest of
        -- its lease.
        redis.call('RENAME', lock, released)
        hand_off(lock, KEYS[5 * i], KEYS[5 * i - 3], KEYS[5 * i - 2], ARGV[1], ARGV[2])
        reply[i] = 1
    elseif type(holder) == 'table' then
        reply[i] = -2
    elseif redis.pcall('GET', released) == token then
        reply[i] = 1
    elseif holder then
        reply[i] = -1
    else
        reply[i] = 0
    end
end
return table.concat(reply, ' ')
