-- limiter's fleet: a node claims its share of one budget.
--
-- KEYS[1]: the budget, a hash: one field per node process holding a
--          share, "<node>.<incarnation>" = "<share> <in use> <demand>
--          <seq> <cap>": what the store counts for it (at least what it may
--          have in flight), its requests in flight, what it asked for
--          beyond what it was granted, its claim's sequence number, what
--          it may admit up to.
-- KEYS[2]: the epoch of the budget's group (one hash slot with it), a
--          hash: "id" (the run id of the server whose data this is),
--          "gen" (bumped whenever the store is found to have lost data),
--          "nonce" (drawn by the node that made the epoch: no two epochs
--          share one), "quiet" ("<nonce>.<gen>" while no share grows).
-- With one key, KEYS[1] is an epoch, and only the epoch is kept.
--
-- ARGV: [1] this process's field, [2] its claim's sequence number (its
-- claims only ever grow it), [3] the limit, [4] its requests in flight,
-- [5] keep: what it may admit up to until this answer (what it held, or
-- less), [6] need: what it needs now, [7] want: need and headroom,
-- [8] "<field> <seq> ..." fields this node has seen unchanged for a lease
-- (their nodes stopped renewing: gone unless renewed since), [9] the
-- quiet this node has seen for a lease (it ends) or "-", [10] the key's
-- time to live (ms; for the keys of nodes that all stopped at once), [11]
-- a nonce for an epoch this claim makes, [12] the channel that tells the
-- other nodes this budget is wanted (a claim left wanting publishes the
-- budget's key there: the nodes that hold what they do not use give it
-- back at once), [13] how long a budget whose every field is given back
-- keeps them (ms; 0: a field given back is deleted at once, as the live
-- nodes' hash does).
--
-- No clock is read here: a field ends when a node has seen it unchanged
-- for a lease by its own clock, a quiet gen when a node has seen it for
-- a lease. A store that lost writes (restarted, flushed, failed over to a
-- replica that missed them, evicted a key) is told by its epoch: absent,
-- or written by another server; or by a node holding a share the store
-- does not. Its group then goes quiet for a lease: shares are
-- republished, none grows.
--
-- Returns "ok|stale|epoch <seq> <cap> <share> <quiet or -> <gen> <others>
-- <others' demand> <had> <spare> [<field> <seq>]...", <had> 1 when the
-- budget held this node's field before, <spare> what the others hold beyond
-- what they had in flight at their last claim (theirs to give back).

local unquiet, fresh = ARGV[9], ARGV[11]
local nonce

local function epoch(key)
  local id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
  local e = redis.call('HMGET', key, 'id', 'gen', 'nonce', 'quiet')
  local gen, quiet = tonumber(e[2]) or 0, e[4] or '-'
  nonce = e[3] or fresh
  if e[1] ~= id then
    if not e[1] then nonce = fresh end
    gen = gen + 1
    quiet = nonce .. '.' .. gen
    redis.call('HSET', key, 'id', id, 'gen', gen, 'nonce', nonce, 'quiet', quiet)
  elseif quiet ~= '-' and unquiet == quiet then
    quiet = '-'
    redis.call('HDEL', key, 'quiet')
  end
  return gen, quiet
end

if #KEYS == 1 then
  local gen, quiet = epoch(KEYS[1])
  return 'epoch 0 0 0 ' .. quiet .. ' ' .. gen .. ' 0 0 0 0'
end

local me, seq, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local in_use, keep = tonumber(ARGV[4]), tonumber(ARGV[5])
local need, want = tonumber(ARGV[6]), tonumber(ARGV[7])
local gone = {}
for f, s in string.gmatch(ARGV[8], '(%S+) (%d+)') do gone[f] = s end

local gen, quiet = epoch(KEYS[2])
local fields = redis.call('HGETALL', KEYS[1])
local mine
local others, others_need, others_demand, spare = 0, 0, 0, 0
local seen = {}
for i = 1, #fields, 2 do
  local f, v = fields[i], fields[i + 1]
  local share, used, wants, s, cap = string.match(v, '^(%d+) (%d+) (%d+) (%d+) (%d+)$')
  if share == nil or (f ~= me and gone[f] == s) then
    redis.call('HDEL', KEYS[1], f)
  elseif f == me then
    mine = { tonumber(share), tonumber(s), tonumber(cap), tonumber(wants) }
  else
    others = others + tonumber(share)
    others_need = others_need + tonumber(used) + tonumber(wants)
    others_demand = others_demand + tonumber(wants)
    spare = spare + math.max(0, tonumber(share) - tonumber(used))
    seen[#seen + 1] = f
    seen[#seen + 1] = s
  end
end
-- A field given back (kept empty: no share, no demand) is no field.
local had = 0
if mine ~= nil and (mine[1] > 0 or mine[4] > 0) then had = 1 end
local function tail()
  return ' ' .. quiet .. ' ' .. gen .. ' ' .. others .. ' ' .. others_demand .. ' ' .. had .. ' ' .. spare .. ' '
    .. table.concat(seen, ' ')
end

-- A claim this store already has (sent again) is answered as it was; an
-- older one changes nothing.
if mine ~= nil and seq <= mine[2] then
  local status = 'stale'
  if seq == mine[2] then status = 'ok' end
  return status .. ' ' .. mine[2] .. ' ' .. mine[3] .. ' ' .. mine[1] .. tail()
end

-- This node holds a share the store does not, and the store had not
-- noticed: it lost it (a lease cannot have ended: the node's own ends
-- first). No share grows for a lease.
if had == 0 and keep > 0 and quiet == '-' then
  gen = gen + 1
  quiet = nonce .. '.' .. gen
  redis.call('HSET', KEYS[2], 'gen', gen, 'quiet', quiet)
end

-- What it may admit up to: while quiet, what it kept; else what it needs
-- within what the others leave, no more than its part of the limit in
-- proportion to what every node needs while the others want more than
-- they hold and it all does not fit, and headroom up to what it wants
-- only while the budget is less than half used.
local cap
if quiet ~= '-' then
  cap = math.min(keep, want)
else
  local room = math.max(0, limit - others)
  cap = math.min(need, room)
  if others_demand > 0 and need + others_need > limit then
    cap = math.min(cap, math.ceil(limit * need / (need + others_need)))
  end
  cap = cap + math.max(0, math.min(want - cap, room - cap, math.floor(limit / 2) - others - cap))
end
-- What the store counts for it: never less than it may have in flight.
local share = math.max(in_use, keep, cap)
local demand = math.max(0, need - cap)
if demand > 0 and others > 0 and ARGV[12] ~= nil and ARGV[12] ~= '' then
  redis.call('PUBLISH', ARGV[12], KEYS[1])
end
local tomb = tonumber(ARGV[13]) or 0
if share == 0 and demand == 0 and tomb == 0 then
  redis.call('HDEL', KEYS[1], me)
elseif share == 0 and demand == 0 then
  -- Given back: the field stays, empty, with its sequence number, so that
  -- an older claim of this node's still on its way (sent on a connection
  -- since replaced) is stale and cannot put back a share the node has
  -- forgotten. A budget of empty fields alone is gone after ARGV[13].
  redis.call('HSET', KEYS[1], me, '0 0 0 ' .. seq .. ' 0')
  if others == 0 and others_demand == 0 then
    redis.call('PEXPIRE', KEYS[1], tomb)
  end
else
  redis.call('HSET', KEYS[1], me, share .. ' ' .. in_use .. ' ' .. demand .. ' ' .. seq .. ' ' .. cap)
  redis.call('PEXPIRE', KEYS[1], ARGV[10])
end
return 'ok ' .. seq .. ' ' .. cap .. ' ' .. share .. tail()
