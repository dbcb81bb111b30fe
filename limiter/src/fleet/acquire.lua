-- limiter's fleet permits: take one of KEYS[1]'s, or say it is full.
--
-- KEYS[1]: a sorted set of permits, one member per request in flight,
--          each scored by when its lease ends (the store's clock, ms).
-- ARGV[1]: the member to add; ARGV[2]: the limit; ARGV[3]: the lease (ms);
-- ARGV[4]: "" or the node's prefix ("<identity>."): its members under
--          another incarnation than ARGV[5] ("<identity>.<incarnation>.")
--          are a previous process's and go.
-- Returns {1, count after} when taken, {0, count} when full.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[4] ~= '' then
  local node, me = ARGV[4], ARGV[5]
  for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    if string.sub(m, 1, #node) == node and string.sub(m, 1, #me) ~= me then
      redis.call('ZREM', KEYS[1], m)
    end
  end
end
local n = redis.call('ZCARD', KEYS[1])
if n >= tonumber(ARGV[2]) then
  return {0, n}
end
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
-- The key goes when its last lease would (never sooner: another node's
-- lease may be longer).
if redis.call('PTTL', KEYS[1]) < lease then redis.call('PEXPIRE', KEYS[1], lease) end
return {1, n + 1}
