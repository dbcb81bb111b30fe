-- limiter's fleet permits: extend the lease of a node's members of
-- KEYS[1], adding those the store lost (a restart), and drop every
-- member whose lease ended.
--
-- ARGV[1]: the lease (ms); ARGV[2..]: the node's members of the key.
-- Returns the key's count after.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local args = {}
for i = 2, #ARGV do
  args[#args + 1] = now + lease
  args[#args + 1] = ARGV[i]
end
if #args > 0 then
  redis.call('ZADD', KEYS[1], unpack(args))
  -- The key goes when its last lease would (never sooner: another node's
  -- lease may be longer).
  if redis.call('PTTL', KEYS[1]) < lease then redis.call('PEXPIRE', KEYS[1], lease) end
end
return redis.call('ZCARD', KEYS[1])
