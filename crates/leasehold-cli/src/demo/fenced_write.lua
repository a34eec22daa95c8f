-- The protected store's fenced write (leasehold demo, round 4): one sale, refused when a newer lock holder has
-- written already. A holder that stalled past its lease still carries its old fence, so its late write fails.
--
-- KEYS[1] the stock, KEYS[2] the sales counter, KEYS[3] the highest fence the store has accepted
-- ARGV[1] the writer's fence, ARGV[2] the new stock
-- Returns 1 when written, 0 when refused.
local seen = tonumber(redis.call('GET', KEYS[3]) or '0')
if tonumber(ARGV[1]) < seen then
  return 0
end
redis.call('SET', KEYS[3], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
redis.call('INCR', KEYS[2])
return 1
