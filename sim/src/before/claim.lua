-- limiter's fleet shares: a node claims its share of one budget.
--
-- KEYS[1]: the budget, a hash: one field per node holding a share,
--          "<share> <lease end> <demand>" (the lease on the store's clock,
--          ms; demand: what the node asked for beyond its share), and
--          "quiet" (ms): no share grows before it.
-- ARGV[1]: this node's field ("<identity>.<incarnation>.")
-- ARGV[2]: the limit
-- ARGV[3]: the lease (ms)
-- ARGV[4]: the node's requests of this budget in flight
-- ARGV[5]: the share it wants (more than it holds: a growth; less: it
--          gives back what it no longer uses)
-- ARGV[6]: "" or the node's prefix ("<identity>."): fields of its other
--          incarnations are a previous process's and go
-- ARGV[7]: what of ARGV[5] it needs now (the rest is headroom for rising
--          demand, granted only while the budget is less than half used)
--
-- The shares of the live fields never sum above the limit, except by what
-- nodes had in flight when their fields were lost (a store restarted
-- empty, a lease that lapsed): what is in flight is always held.
-- Returns {share, quiet (1/0), lapsed (1/0), others' shares, others' demand}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me, limit, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local in_use, wanted, prefix = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local needed = math.min(tonumber(ARGV[7]), wanted)
local fields = redis.call('HGETALL', KEYS[1])
local mine, found, quiet = 0, false, 0
local others, demand = 0, 0
for i = 1, #fields, 2 do
  local f, v = fields[i], fields[i + 1]
  if f == 'quiet' then
    quiet = tonumber(v)
  else
    local share, lease_end, wants = string.match(v, '^(%d+) (%d+) (%d+)$')
    share, lease_end, wants = tonumber(share), tonumber(lease_end), tonumber(wants)
    local stale = prefix ~= '' and f ~= me and string.sub(f, 1, #prefix) == prefix
    if share == nil or lease_end <= now or stale then
      redis.call('HDEL', KEYS[1], f)
    elseif f == me then
      mine, found = share, true
    else
      others = others + share
      demand = demand + wants
    end
  end
end
if quiet ~= 0 and quiet <= now then
  redis.call('HDEL', KEYS[1], 'quiet')
  quiet = 0
end
-- A budget this store does not hold, on a Redis that started less than a
-- lease ago, may be one it lost: for the rest of that lease no share of
-- it grows, so the nodes that held it republish first.
if #fields == 0 then
  local up = tonumber(string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)'))
  if up ~= nil and up * 1000 < lease then
    quiet = now + lease - up * 1000
    redis.call('HSET', KEYS[1], 'quiet', quiet)
    redis.call('PEXPIRE', KEYS[1], lease)
  end
end
local lapsed = 0
if not found and in_use > 0 then lapsed = 1 end
-- What this node may hold: what the others leave; while others want more
-- than they hold and all of it does not fit, its part of the limit in
-- proportion to what it wants; while quiet, no more than it holds.
local cap = limit - others
local total = needed + others + demand
if demand > 0 and total > limit then
  cap = math.min(cap, math.ceil(limit * needed / total))
end
if quiet > now then cap = math.min(cap, mine) end
local share = math.max(in_use, math.min(needed, cap))
-- Headroom only while the budget is less than half used: near its limit
-- every unit goes to a request that needs it.
share = share + math.max(0, math.min(wanted - needed, cap - share, math.floor(limit / 2) - others - share))
local short = math.max(0, needed - share)
if share == 0 and short == 0 then
  redis.call('HDEL', KEYS[1], me)
else
  redis.call('HSET', KEYS[1], me, share .. ' ' .. (now + lease) .. ' ' .. short)
  -- The key goes when its last lease would (never sooner: another
  -- node's lease may be longer).
  if redis.call('PTTL', KEYS[1]) < lease then redis.call('PEXPIRE', KEYS[1], lease) end
end
local q = 0
if quiet > now then q = 1 end
return {share, q, lapsed, others, demand}
