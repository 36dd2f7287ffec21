"""The Lua scripts of the Redis batch queue (`redis_queue.py`): each is one atomic step across
every host sharing the queue.

Every script takes the queue's key prefix as ARGV[1] (`lanes:{<namespace>}:bq:`, or `lanes:bq:`)
and names its keys from it: a step touches the keys of the batches it finds (the open ones, a
lease's take-back), which it can not list in KEYS beforehand. lanes refuses a Redis Cluster, and a
namespace is a hash tag, so every key of a deployment is on one server (one slot).

The keys (none with an expiry: an eviction policy of `volatile-*` never takes one; an item's
staging keys while its batch is created are the one exception, made permanent in `CREATE`):

- `lead` — hash: the leader (`owner`) and until when (`until`, epoch s on the hosts' walls);
- `batch:<id>` — hash: `data` (the object as created), `client`, `status`, `<status>_at`,
  `endpoint`, `input_file_id`, `expires_at`, `last_line`, the output and error file ids, the
  kept counts (`total`, `pending`, `running`, `ok`, `error`, `expired`, `cancelled`, and the
  done lines' bytes `okbytes`, `errbytes`), and a budget's `max_paid`, `paid`, `held` (USD,
  `%.17g`: the same doubles as Python's);
- `items:<id>` — hash: line → `[start, length, custom_id]`; `pending:<id>` — sorted set of lines
  (10 digits) by when they may run; `running:<id>` — set of lines; `tries:<id>` — hash: line →
  tries; `done:<id>` — hash: line → its outcome's letter (`o`, `e`, `x`, `c`) and its line;
- `open` — sorted set of the batches running or cancelling, by their window's end; `open:<client>`
  — set of them; `ended` — sorted set of the ended ones, by when; `batches:<client>` — sorted set
  of a client's batches by creation; `held` — set of the batches a paid try holds now;
- `tally` — hash: `status:<status>` → batches, and the items' counts summed over every batch;
- `file:<id>` — hash: a file's record; `chunk:<id>:<n>` — an input file's bytes, in chunks;
  `inputs:<client>` — set of a client's input files kept; `files:<client>` — sorted set of its
  listed files (purpose `batch`) by creation.
"""

from __future__ import annotations

# The counts a step changes are a batch's and the tally's, together.
_HEAD = """
local P = ARGV[1]
local LETTER = {ok = 'o', error = 'e', expired = 'x', cancelled = 'c'}
local function bump(b, field, n)
  if n ~= 0 then
    redis.call('HINCRBY', P .. 'batch:' .. b, field, n)
    redis.call('HINCRBY', P .. 'tally', field, n)
  end
end
local function num(v) return tonumber(v or '0') or 0 end
"""

# ARGV: P, owner, now (s), ttl (s), the holder this host knows is gone (or ""). 1: leading.
# A new leader takes back the items the last one left running (due at once) and counts what a
# paid try of it held spent in full (`budget.py`: the upstream may have billed it).
LEAD = (
    _HEAD
    + """
local held = redis.call('HMGET', P .. 'lead', 'owner', 'until')
local owner, now = ARGV[2], tonumber(ARGV[3])
if held[1] and held[1] ~= owner and num(held[2]) > now and held[1] ~= ARGV[5] then return 0 end
redis.call('HSET', P .. 'lead', 'owner', owner,
           'until', string.format('%.17g', now + tonumber(ARGV[4])))
if held[1] == owner then return 1 end
for _, b in ipairs(redis.call('ZRANGE', P .. 'open', 0, -1)) do
  local lines = redis.call('SMEMBERS', P .. 'running:' .. b)
  for _, line in ipairs(lines) do redis.call('ZADD', P .. 'pending:' .. b, 0, line) end
  if #lines > 0 then
    redis.call('DEL', P .. 'running:' .. b)
    bump(b, 'running', -#lines)
    bump(b, 'pending', #lines)
  end
end
for _, b in ipairs(redis.call('SMEMBERS', P .. 'held')) do
  local f = redis.call('HMGET', P .. 'batch:' .. b, 'paid', 'held')
  if num(f[2]) > 0 then
    redis.call('HSET', P .. 'batch:' .. b, 'paid', string.format('%.17g', num(f[1]) + num(f[2])),
               'held', '0')
  end
end
redis.call('DEL', P .. 'held')
return 1
"""
)

# ARGV: P, now (s), limit. Up to `limit` items due now of running batches whose window has not
# ended and that are not held (`held_until`), the soonest window's end first (then the batch's
# id), marked running and their tries counted. Returns {batch, line, item, endpoint, client,
# input file, expires_at, tries, the batch's one model or ""} each.
TAKE = (
    _HEAD
    + """
local need, out = tonumber(ARGV[3]), {}
if need <= 0 then return out end
for _, b in ipairs(redis.call('ZRANGEBYSCORE', P .. 'open', '(' .. ARGV[2], '+inf')) do
  local meta = redis.call('HMGET', P .. 'batch:' .. b, 'status', 'endpoint', 'client',
                          'input_file_id', 'expires_at', 'held_until', 'model')
  local held = tonumber(meta[6] or '') or 0
  if meta[1] == 'in_progress' and not (held > tonumber(ARGV[2])) then
    local lines = redis.call('ZRANGEBYSCORE', P .. 'pending:' .. b, '-inf', ARGV[2],
                             'LIMIT', 0, need)
    for _, line in ipairs(lines) do
      redis.call('ZREM', P .. 'pending:' .. b, line)
      redis.call('SADD', P .. 'running:' .. b, line)
      local tries = redis.call('HINCRBY', P .. 'tries:' .. b, line, 1)
      out[#out + 1] = {b, line, redis.call('HGET', P .. 'items:' .. b, line), meta[2], meta[3],
                       meta[4], meta[5], tries, meta[7] or ''}
    end
    bump(b, 'pending', -#lines)
    bump(b, 'running', #lines)
    need = need - #lines
    if need <= 0 then break end
  end
end
return out
"""
)

# The item runs, taken by the run that asks (its tries then): a run of a leader that lost the
# queue (the item taken back, perhaps taken again) is told no.
_MINE = """
local function mine(b, line, tries)
  return redis.call('SISMEMBER', P .. 'running:' .. b, line) == 1
      and redis.call('HGET', P .. 'tries:' .. b, line) == tries
end
"""

# ARGV: P, batch, line, the run's tries, outcome (ok or error), the answer's line. Written only
# while this run has the item, in the step that marks it done: a late answer is not.
FINISH = (
    _HEAD
    + _MINE
    + """
if not mine(ARGV[2], ARGV[3], ARGV[4]) then return 0 end
redis.call('SREM', P .. 'running:' .. ARGV[2], ARGV[3])
redis.call('HSET', P .. 'done:' .. ARGV[2], ARGV[3], LETTER[ARGV[5]] .. ARGV[6])
bump(ARGV[2], 'running', -1)
bump(ARGV[2], ARGV[5], 1)
redis.call('HINCRBY', P .. 'batch:' .. ARGV[2], ARGV[5] == 'ok' and 'okbytes' or 'errbytes',
           #ARGV[6])
return 1
"""
)

# ARGV: P, batch, line, the run's tries, not before (s). A running item put back (by the run
# that has it).
LATER = (
    _HEAD
    + _MINE
    + """
if not mine(ARGV[2], ARGV[3], ARGV[4]) then return 0 end
redis.call('SREM', P .. 'running:' .. ARGV[2], ARGV[3])
redis.call('ZADD', P .. 'pending:' .. ARGV[2], ARGV[5], ARGV[3])
bump(ARGV[2], 'running', -1)
bump(ARGV[2], 'pending', 1)
return 1
"""
)

# ARGV: P, batch, why (expired or cancelled), then line and its closed line, pairs. The items
# still pending answered for; how many were.
CLOSE = (
    _HEAD
    + """
local b, why, n, bytes = ARGV[2], ARGV[3], 0, 0
for i = 4, #ARGV, 2 do
  if redis.call('ZREM', P .. 'pending:' .. b, ARGV[i]) == 1 then
    redis.call('HSET', P .. 'done:' .. b, ARGV[i], LETTER[why] .. ARGV[i + 1])
    n, bytes = n + 1, bytes + #ARGV[i + 1]
  end
end
bump(b, 'pending', -n)
bump(b, why, n)
redis.call('HINCRBY', P .. 'batch:' .. b, 'errbytes', bytes)
return n
"""
)

# ARGV: P, batch, its end (a status), now (s, whole), an output file id, an error file id. Ends a
# running or cancelling batch with no item left: its status, its files (those with lines), its
# place among the ended. 0 when it is not (any more) to end.
END = (
    _HEAD
    + """
local b, status, now = ARGV[2], ARGV[3], ARGV[4]
local key = P .. 'batch:' .. b
local f = redis.call('HMGET', key, 'status', 'client', 'ok', 'error', 'expired', 'cancelled',
                     'okbytes', 'errbytes', 'pending', 'running')
if (f[1] ~= 'in_progress' and f[1] ~= 'cancelling') or num(f[9]) > 0 or num(f[10]) > 0 then
  return 0
end
redis.call('HSET', key, 'status', status, status .. '_at', now, 'finalizing_at', now)
local files = {{'output', num(f[3]), num(f[7]), ARGV[5]},
               {'error', num(f[4]) + num(f[5]) + num(f[6]), num(f[8]), ARGV[6]}}
for _, kind in ipairs(files) do
  if kind[2] > 0 then
    redis.call('HSET', P .. 'file:' .. kind[4], 'client', f[2], 'purpose', 'batch_output',
               'filename', b .. '_' .. kind[1] .. '.jsonl', 'bytes', kind[3], 'lines', kind[2],
               'created_at', now, 'batch', b, 'kind', kind[1], 'deleted', '0')
    redis.call('HSET', key, kind[1] .. '_file_id', kind[4])
  end
end
redis.call('ZREM', P .. 'open', b)
redis.call('SREM', P .. 'open:' .. f[2], b)
redis.call('ZADD', P .. 'ended', now, b)
redis.call('HINCRBY', P .. 'tally', 'status:' .. f[1], -1)
redis.call('HINCRBY', P .. 'tally', 'status:' .. status, 1)
return 1
"""
)

# ARGV: P, batch, client, now (s). A running batch of this client's: cancelling. -1: not its.
CANCEL = (
    _HEAD
    + """
local key = P .. 'batch:' .. ARGV[2]
local f = redis.call('HMGET', key, 'client', 'status')
if f[1] ~= ARGV[3] then return -1 end
if f[2] == 'validating' or f[2] == 'in_progress' then
  redis.call('HSET', key, 'status', 'cancelling', 'cancelling_at', ARGV[4])
  redis.call('HINCRBY', P .. 'tally', 'status:' .. f[2], -1)
  redis.call('HINCRBY', P .. 'tally', 'status:cancelling', 1)
end
return 1
"""
)

# ARGV: P, batch, amount (USD). `budget.may_hold`: the batch runs, no try holds, and the amount
# is left (within 1e-12). 1: held.
HOLD = (
    _HEAD
    + """
local key = P .. 'batch:' .. ARGV[2]
local f = redis.call('HMGET', key, 'status', 'max_paid', 'paid', 'held')
local amount = tonumber(ARGV[3])
if f[1] ~= 'in_progress' or not (amount > 0) or num(f[4]) > 0 then return 0 end
if num(f[3]) + amount > num(f[2]) + 1e-12 then return 0 end
redis.call('HSET', key, 'held', ARGV[3])
redis.call('SADD', P .. 'held', ARGV[2])
return 1
"""
)

# ARGV: P, batch, what the try cost (USD, >= 0; "" when not known: all it held, as
# `budget.spent_of`). Counted spent, the hold released; returns what was counted.
SETTLE_PAID = (
    _HEAD
    + """
local key = P .. 'batch:' .. ARGV[2]
if redis.call('EXISTS', key) == 0 then return '0' end
local f = redis.call('HMGET', key, 'paid', 'held')
local spent = num(f[2])
if ARGV[3] ~= '' then spent = tonumber(ARGV[3]) end
redis.call('HSET', key, 'paid', string.format('%.17g', num(f[1]) + spent), 'held', '0')
redis.call('SREM', P .. 'held', ARGV[2])
return string.format('%.17g', spent)
"""
)

# ARGV: P, now (s). When the next pending item of a running batch may be taken, a held one's not
# before its `held_until` (false: none).
NEXT_DUE = (
    _HEAD
    + """
local now, best = tonumber(ARGV[2]), false
for _, b in ipairs(redis.call('ZRANGE', P .. 'open', 0, -1)) do
  local meta = redis.call('HMGET', P .. 'batch:' .. b, 'status', 'held_until')
  if meta[1] == 'in_progress' then
    local first = redis.call('ZRANGE', P .. 'pending:' .. b, 0, 0, 'WITHSCORES')
    if first[2] then
      local due = math.max(tonumber(first[2]), now, tonumber(meta[2] or '') or now)
      if not best or due < best then best = due end
    end
  end
end
return best and string.format('%.17g', best) or false
"""
)

# ARGV: P, batch, expiry (s), then line, custom_id and item, triples. A page of a batch's items
# written while it is created (its keys with an expiry until `CREATE`); the lines whose custom_id
# an earlier line has (`ids:<batch>`).
STAGE = """
local P, b, repeated = ARGV[1], ARGV[2], {}
for i = 4, #ARGV, 3 do
  if redis.call('HSETNX', P .. 'ids:' .. b, ARGV[i + 1], ARGV[i]) == 0 then
    repeated[#repeated + 1] = ARGV[i]
  end
  redis.call('HSET', P .. 'items:' .. b, ARGV[i], ARGV[i + 2])
  redis.call('ZADD', P .. 'pending:' .. b, 0, ARGV[i])
end
for _, name in ipairs({'ids:', 'items:', 'pending:'}) do
  redis.call('EXPIRE', P .. name .. b, ARGV[3])
end
return repeated
"""

# ARGV: P, batch, client, created_at, expires_at, status, the object (JSON), endpoint, input
# file id, items, the last line's number, the budget (USD, or ""), failed_at (or ""). The batch
# appears with its items at once: the staged items' keys (with an expiry while they were written)
# are checked whole and made permanent. 0: they are not whole (evicted while staged).
CREATE = (
    _HEAD
    + """
local b, client, status, total = ARGV[2], ARGV[3], ARGV[6], tonumber(ARGV[10])
local key = P .. 'batch:' .. b
if status == 'in_progress' then
  if redis.call('HLEN', P .. 'items:' .. b) ~= total
      or redis.call('ZCARD', P .. 'pending:' .. b) ~= total then
    return 0
  end
  redis.call('PERSIST', P .. 'items:' .. b)
  redis.call('PERSIST', P .. 'pending:' .. b)
  redis.call('ZADD', P .. 'open', ARGV[5], b)
  redis.call('SADD', P .. 'open:' .. client, b)
else
  redis.call('ZADD', P .. 'ended', ARGV[13], b)
end
redis.call('DEL', P .. 'ids:' .. b)
redis.call('HSET', key, 'data', ARGV[7], 'client', client, 'status', status, 'created_at',
           ARGV[4], 'expires_at', ARGV[5], 'endpoint', ARGV[8], 'input_file_id', ARGV[9],
           'total', total, 'last_line', ARGV[11], 'running', 0, 'ok', 0, 'error', 0,
           'expired', 0, 'cancelled', 0, 'okbytes', 0, 'errbytes', 0, 'pending', 0)
if ARGV[12] ~= '' then redis.call('HSET', key, 'max_paid', ARGV[12], 'paid', '0', 'held', '0') end
if status == 'in_progress' then bump(b, 'pending', total) end
redis.call('HINCRBY', P .. 'tally', 'status:' .. status, 1)
redis.call('ZADD', P .. 'batches:' .. client, ARGV[4], b)
return 1
"""
)

# ARGV: P, batch, client, chunk size (bytes), 1 when another batch still runs from its input
# file. An ended batch of this client's deleted with its items, its output and error files and
# its input file (its chunks too; marked deleted only, while another batch runs from it, and gone
# when that one ends). -1: not its; 0: not ended.
DELETE_BATCH = (
    _HEAD
    + """
local b, client = ARGV[2], ARGV[3]
local key = P .. 'batch:' .. b
local f = redis.call('HMGET', key, 'client', 'status', 'input_file_id', 'output_file_id',
                     'error_file_id')
if f[1] ~= client then return -1 end
if f[2] ~= 'completed' and f[2] ~= 'failed' and f[2] ~= 'expired' and f[2] ~= 'cancelled' then
  return 0
end
redis.call('HINCRBY', P .. 'tally', 'status:' .. f[2], -1)
for _, name in ipairs({'pending', 'running', 'ok', 'error', 'expired', 'cancelled'}) do
  bump(b, name, -num(redis.call('HGET', key, name)))
end
for _, name in ipairs({'batch:', 'items:', 'pending:', 'running:', 'tries:', 'done:', 'ids:'}) do
  redis.call('UNLINK', P .. name .. b)
end
redis.call('ZREM', P .. 'batches:' .. client, b)
redis.call('ZREM', P .. 'ended', b)
redis.call('SREM', P .. 'held', b)
for i = 3, 5 do
  if f[i] then
    local size = num(redis.call('HGET', P .. 'file:' .. f[i], 'bytes'))
    if i == 3 and ARGV[5] == '1' then
      redis.call('HSET', P .. 'file:' .. f[i], 'deleted', '1')
    else
      if i == 3 then
        for n = 0, math.ceil(size / tonumber(ARGV[4])) - 1 do
          redis.call('UNLINK', P .. 'chunk:' .. f[i] .. ':' .. n)
        end
      end
      redis.call('UNLINK', P .. 'file:' .. f[i])
    end
    redis.call('SREM', P .. 'inputs:' .. client, f[i])
    redis.call('ZREM', P .. 'files:' .. client, f[i])
  end
end
return 1
"""
)

# ARGV: P, file id, client, purpose, filename, bytes, lines, created_at, at most this many input
# files kept by the client, 1 when it is listed (purpose `batch`). 0: the client keeps enough.
ADD_FILE = """
local P = ARGV[1]
if redis.call('SCARD', P .. 'inputs:' .. ARGV[3]) >= tonumber(ARGV[9]) then return 0 end
redis.call('HSET', P .. 'file:' .. ARGV[2], 'client', ARGV[3], 'purpose', ARGV[4], 'filename',
           ARGV[5], 'bytes', ARGV[6], 'lines', ARGV[7], 'created_at', ARGV[8], 'kind', 'input',
           'deleted', '0')
redis.call('SADD', P .. 'inputs:' .. ARGV[3], ARGV[2])
if ARGV[10] == '1' then redis.call('ZADD', P .. 'files:' .. ARGV[3], ARGV[8], ARGV[2]) end
return 1
"""

# ARGV: P, file id, client. A file of this client's marked deleted: {kind, batch, bytes}, or false.
DELETE_FILE = """
local P = ARGV[1]
local key = P .. 'file:' .. ARGV[2]
local f = redis.call('HMGET', key, 'client', 'deleted', 'kind', 'batch', 'bytes')
if f[1] ~= ARGV[3] or f[2] == '1' then return false end
redis.call('HSET', key, 'deleted', '1')
redis.call('SREM', P .. 'inputs:' .. ARGV[3], ARGV[2])
redis.call('ZREM', P .. 'files:' .. ARGV[3], ARGV[2])
return {f[3], f[4] or '', f[5]}
"""

# ARGV: P, batch, until (s). None of a batch's items is taken before `until`; a batch gone (ended
# and deleted) is left so.
HOLD_BATCH = """
local P = ARGV[1]
if redis.call('EXISTS', P .. 'batch:' .. ARGV[2]) == 1 then
  redis.call('HSET', P .. 'batch:' .. ARGV[2], 'held_until', ARGV[3])
end
"""

# ARGV: P, batch, model. The one model a batch's items name (`take` gives it with each item).
HOLD_BATCH_MODEL = """
local P = ARGV[1]
if redis.call('EXISTS', P .. 'batch:' .. ARGV[2]) == 1 then
  redis.call('HSET', P .. 'batch:' .. ARGV[2], 'model', ARGV[3])
end
"""
