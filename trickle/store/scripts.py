"""Lua scripts for the job state transitions that must be atomic.

Each runs inside Redis as one step, so a claim, a cancel, a crash recovery and a token append
can never interleave halfway. Used only by ``store`` and ``leases`` (through ``script_runner``).

Every key and channel a script touches is passed in KEYS and shares the job's shard hash tag
(``keys``), so on a Redis Cluster each call lands on one slot. Scripts publish with the command
named in their ARGV: PUBLISH on a single Redis, SPUBLISH (sharded pub/sub) on a cluster.
"""

from __future__ import annotations

from trickle.jobs import READ_FIELDS

_READ_FIELDS_LUA = ", ".join(f"'{name}'" for name in READ_FIELDS)

# A job that ends without its worker's FINISH (canceled while queued, poisoned, recovered as
# canceled, expired): the text streamed so far becomes its output, so stream and result agree;
# then its done message goes to stream readers and waiters.
# kept(job, ttl): the job's own result TTL (``Job.result_ttl_seconds``) or the default;
# settle(job, tokens, output, ttl); announce(publish, events channel, done channel, message)
_ENDING = """
local function kept(job, ttl)
  return redis.call('HGET', job, 'result_ttl') or ttl
end
local function settle(job, tokens, output, ttl)
  ttl = kept(job, ttl)
  local text = redis.call('GET', output)
  if text then redis.call('HSET', job, 'output', text) end
  redis.call('HSET', job, 'completion_tokens', redis.call('LLEN', tokens))
  redis.call('DEL', output)
  redis.call('EXPIRE', job, ttl)
  redis.call('EXPIRE', tokens, ttl)
end
local function announce(publish, events, done, message)
  redis.call(publish, events, message)
  redis.call(publish, done, message)
end
"""

# KEYS: job, lease, running, queued, tokens, output, events channel, done channel
# ARGV: id, now, node, lease_ms, max_attempts, poisoned_error_json, result_ttl, publish, done_msg,
#       claimed_msg (announces the change to running), then the hash fields the worker needs
# Returns {outcome, attempts}, and when claimed also those fields' values, the replay log's
# length and the prompt if the worker needs it, so a worker starts a job in one round trip.
# Attempts count deaths during generation: a job whose replay log already holds every token (its
# max_tokens, or the token that ended it, marked "end" by its worker) was complete when its
# worker died before storing the result, so its claim counts no attempt and is never poisoned:
# the worker finalizes it as it stands (the fence's number is one past the attempts, unstored).
# And only deaths that made no progress count toward max_attempts ('stalled_attempts'): a claim
# notes the log's length ('claimed_tokens'); the next claim finds the log longer when the dead
# attempt logged a token, and that death is the machine's, not the job's. A job that kills its
# worker at one point stalls there on every resume, so it is still poisoned after max_attempts
# such deaths; a job that moves on each time is bounded by its tokens left. 'attempts' still
# counts every claim: it numbers the fence, which must never repeat.
# Nor does a lapse whose worker was alive: a starved worker (a saturated machine) that later
# finds its lease gone says so (FORGIVE_LAPSE), and a lapse forgiven before the next claim
# ('alive_fence' is the recovered 'lapsed_fence') counts no stall.
CLAIM = (
    _ENDING
    + """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'missing', 0} end
if status ~= 'queued' then return {status, 0} end
redis.call('ZREM', KEYS[4], ARGV[1])
local logged = redis.call('LLEN', KEYS[5])
local complete = false
if logged > 0 then
  local params = cjson.decode(redis.call('HGET', KEYS[1], 'params') or '{}')
  -- The end's key, unescaped: inside an entry's JSON strings every quote is escaped (and the
  -- entry may hold what cjson cannot read back, a -Infinity logprob).
  complete = logged >= tonumber(params['max_tokens'] or math.huge)
    or string.find(redis.call('LINDEX', KEYS[5], -1), '"end": "', 1, true) ~= nil
end
local attempts
local stalled = 0
if complete then
  attempts = tonumber(redis.call('HGET', KEYS[1], 'attempts') or '0') + 1
else
  attempts = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
  local before = redis.call('HGET', KEYS[1], 'claimed_tokens')
  local lapsed = redis.call('HGET', KEYS[1], 'lapsed_fence')
  local alive = lapsed and redis.call('HGET', KEYS[1], 'alive_fence') == lapsed
  if before and logged <= tonumber(before) and not alive then
    stalled = redis.call('HINCRBY', KEYS[1], 'stalled_attempts', 1)
    if lapsed then redis.call('HSET', KEYS[1], 'stall_fence', lapsed) end
  else
    stalled = tonumber(redis.call('HGET', KEYS[1], 'stalled_attempts') or '0')
  end
  redis.call('HSET', KEYS[1], 'claimed_tokens', logged)
end
if stalled >= tonumber(ARGV[5]) and not complete then
  redis.call('HSET', KEYS[1], 'status', 'failed', 'finish_reason', 'error',
             'completed_at', ARGV[2], 'error', ARGV[6])
  settle(KEYS[1], KEYS[5], KEYS[6], ARGV[7])
  announce(ARGV[8], KEYS[7], KEYS[8], ARGV[9])
  return {'poisoned', attempts}
end
local fence = ARGV[3] .. ':' .. attempts
redis.call('HSET', KEYS[1], 'status', 'running', 'owner', fence)
if redis.call('HEXISTS', KEYS[1], 'started_at') == 0 then
  redis.call('HSET', KEYS[1], 'started_at', ARGV[2])
end
redis.call('SET', KEYS[2], fence, 'PX', ARGV[4])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
redis.call(ARGV[8], KEYS[7], ARGV[10])
local fields = {}
for i = 11, #ARGV do table.insert(fields, ARGV[i]) end
-- The prompt only when the worker will tokenize it: no ids from the web tier, or a resume.
local prompt = false
if logged > 0 or redis.call('HEXISTS', KEYS[1], 'prompt_ids') == 0 then
  prompt = redis.call('HGET', KEYS[1], 'prompt')
end
return {'claimed', attempts, redis.call('HMGET', KEYS[1], unpack(fields)), logged, prompt}
"""
)

# KEYS: job, queued, tokens, output, events channel, done channel
# ARGV: id, now, result_ttl, publish, done_msg
CANCEL = (
    _ENDING
    + """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 'missing' end
if status == 'queued' then
  redis.call('HSET', KEYS[1], 'status', 'canceled', 'finish_reason', 'canceled',
             'completed_at', ARGV[2])
  redis.call('ZREM', KEYS[2], ARGV[1])
  settle(KEYS[1], KEYS[3], KEYS[4], ARGV[3])
  announce(ARGV[4], KEYS[5], KEYS[6], ARGV[5])
  return 'canceled'
end
if status == 'running' then
  redis.call('HSET', KEYS[1], 'cancel_requested', '1')
  return 'requested'
end
return 'finished'
"""
)

# KEYS: lease, job   ARGV: fence, lease_ms
# Returns 1 (renewed), 2 (no lease: this fence stored the job's final state, which deleted it)
# or 0 (lost: it lapsed, or another attempt holds it).
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if redis.call('HGET', KEYS[2], 'finished_fence') == ARGV[1] then return 2 end
return 0
"""

# A running job whose lease expired: its worker died. Requeue it (or finish it as canceled when
# a cancel was pending). KEYS: job, lease, running, queued, tokens, output, events, done
# ARGV: id, now, queue_deadline, result_ttl, publish, done_msg, status_msg
RECOVER = (
    _ENDING
    + """
if redis.call('EXISTS', KEYS[2]) == 1 then return 'alive' end
local status = redis.call('HGET', KEYS[1], 'status')
redis.call('ZREM', KEYS[3], ARGV[1])
if status ~= 'running' then return 'gone' end
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner then redis.call('HSET', KEYS[1], 'lapsed_fence', owner) end
redis.call('HDEL', KEYS[1], 'owner')
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then
  redis.call('HSET', KEYS[1], 'status', 'canceled', 'finish_reason', 'canceled',
             'completed_at', ARGV[2])
  settle(KEYS[1], KEYS[5], KEYS[6], ARGV[4])
  announce(ARGV[5], KEYS[7], KEYS[8], ARGV[6])
  return 'canceled'
end
redis.call('HSET', KEYS[1], 'status', 'queued')
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
redis.call(ARGV[5], KEYS[7], ARGV[7])
return 'requeued'
"""
)

# A worker that lost a lease while alive (its renewal came too late, or a write was fenced out)
# says so: that lapse was no death. Before the next claim, the claim sees it ('alive_fence');
# after it, the stall that claim counted for this fence is taken back. Past ARGV[2] forgiven
# lapses a job's lapses count again: one that starves every worker it runs on is still failed.
# KEYS: job; ARGV: fence, most lapses forgiven. Returns 1 when a counted stall was taken back.
FORGIVE_LAPSE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HINCRBY', KEYS[1], 'forgiven_lapses', 1) > tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'alive_fence', ARGV[1])
if redis.call('HGET', KEYS[1], 'stall_fence') == ARGV[1] then
  redis.call('HINCRBY', KEYS[1], 'stalled_attempts', -1)
  redis.call('HDEL', KEYS[1], 'stall_fence')
  return 1
end
return 0
"""

# Give a claimed job back without counting an attempt (graceful shutdown); one whose cancel is
# pending is canceled instead. KEYS: job, lease, running, queued, tokens, output, events, done
# ARGV: id, fence, queue_deadline, now, result_ttl, publish, done_msg, status_msg
RELEASE = (
    _ENDING
    + """
if redis.call('GET', KEYS[2]) ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[1], 'owner')
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then
  redis.call('HSET', KEYS[1], 'status', 'canceled', 'finish_reason', 'canceled',
             'completed_at', ARGV[4])
  settle(KEYS[1], KEYS[5], KEYS[6], ARGV[5])
  announce(ARGV[6], KEYS[7], KEYS[8], ARGV[7])
  return 2
end
redis.call('HSET', KEYS[1], 'status', 'queued')
redis.call('HINCRBY', KEYS[1], 'attempts', -1)
redis.call('HDEL', KEYS[1], 'claimed_tokens')  -- handed back, no death: the next claim counts none
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
redis.call(ARGV[6], KEYS[7], ARGV[8])
return 1
"""
)

# A queued job past its queue deadline. KEYS: job, queued, tokens, output, events, done
# ARGV: id, now, error_json, result_ttl, publish, done_msg
EXPIRE_QUEUED = (
    _ENDING
    + """
local status = redis.call('HGET', KEYS[1], 'status')
redis.call('ZREM', KEYS[2], ARGV[1])
if status ~= 'queued' then return 0 end
redis.call('HSET', KEYS[1], 'status', 'failed', 'finish_reason', 'error',
           'completed_at', ARGV[2], 'error', ARGV[3])
settle(KEYS[1], KEYS[3], KEYS[4], ARGV[4])
announce(ARGV[5], KEYS[5], KEYS[6], ARGV[6])
return 1
"""
)

# A queued job whose client's deadline passed before any worker claimed it: ended as a late
# claim ends it (``expired``, unrun), so its readers learn it then, served or not. One that
# logged tokens before its worker died is left to its next claim, which stops it with what it
# made. Atomic with CLAIM: a job is either claimed in time or expired, never both.
# KEYS: job, deadlines, queued, tokens, output, events, done
# ARGV: id, now, error_json, result_ttl, publish, done_msg
EXPIRE_AT_DEADLINE = (
    _ENDING
    + """
local status = redis.call('HGET', KEYS[1], 'status')
redis.call('ZREM', KEYS[2], ARGV[1])
if status ~= 'queued' or redis.call('LLEN', KEYS[4]) > 0 then return 0 end
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HSET', KEYS[1], 'status', 'expired', 'finish_reason', 'deadline',
           'completed_at', ARGV[2], 'error', ARGV[3])
settle(KEYS[1], KEYS[4], KEYS[5], ARGV[4])
announce(ARGV[5], KEYS[6], KEYS[7], ARGV[6])
return 1
"""
)

# One flush of token events, fenced per job: only the lease holder may append. Entries already
# in the log (a retried flush whose first reply was lost) are skipped, so a retry is harmless.
# Entries that would leave a gap (log position must equal token index) are refused and the log's
# length is returned: the log lost its newest entries (a Redis that restarted without its last
# writes, a failover that lost them), and the worker, which holds every token it sent, sends
# them again from there. Each accepted job's text is appended to its output so far, and its
# tokens go out on its own channel (nobody subscribed: Redis drops the message).
# KEYS: per job i: job hash, tokens list, lease, output, events channel
# ARGV[1] = publish command; ARGV[2] = number of jobs; then per job: fence, first_token_at
#           ('' if none), index of the first entry, k, k log entries, the text of the k entries,
#           the job's channel message
# Returns only the exceptions, so a normal step's reply is an empty list: -i for a job fenced
# out (its lease is not this worker's), +i for a job whose cancel was requested, {i, length} for
# a job whose log is shorter than its entries' first index.
APPEND_STEP = """
local publish = ARGV[1]
local jobs = tonumber(ARGV[2])
local a = 3
local result = {}
for i = 1, jobs do
  local base = 5 * (i - 1)
  local fence = ARGV[a]
  local first = ARGV[a + 1]
  local first_index = tonumber(ARGV[a + 2])
  local k = tonumber(ARGV[a + 3])
  a = a + 4
  local logged = redis.call('LLEN', KEYS[base + 2])
  local present = logged - first_index
  if redis.call('GET', KEYS[base + 3]) ~= fence then
    table.insert(result, -i)
  elseif present < 0 then
    table.insert(result, {i, logged})
  else
    if present < k then
      -- One RPUSH per job (pieces of 1,000: unpack's limit is about 8,000 values).
      for j = present, k - 1, 1000 do
        redis.call('RPUSH', KEYS[base + 2], unpack(ARGV, a + j, a + math.min(j + 999, k - 1)))
      end
      if present == 0 then
        redis.call('APPEND', KEYS[base + 4], ARGV[a + k])
      else  -- a retried flush, partly stored already: only the rest's text
        for j = present, k - 1 do
          redis.call('APPEND', KEYS[base + 4], cjson.decode(ARGV[a + j])['text'])
        end
      end
    end
    if first ~= '' then
      redis.call('HSET', KEYS[base + 1], 'first_token_at', first)
    end
    redis.call(publish, KEYS[base + 5], ARGV[a + k + 1])
  end
  if redis.call('HGET', KEYS[base + 1], 'cancel_requested') == '1' then
    table.insert(result, i)
  end
  a = a + k + 2
end
return result
"""

# Store a job's final state, fenced, and announce it with the record just stored (the log's
# length, then READ_FIELDS; ``trickle.events.RECORD_MESSAGE``): readers that heard every token end
# on it, where each read the job again (a round trip per stream and two per waiter). Never while
# the log is shorter than the tokens the worker sent (ARGV[6]): a reader would end without the
# ones Redis lost; the reply is then {length} and the worker repairs the log first.
# KEYS: job, tokens, lease, running, output, events, done
# ARGV: id, fence, result_ttl, publish, record message prefix, the log's least length, then
#       field/value pairs. Returns 1 (stored), 0 (not this worker's lease) or {log length}.
FINISH = (
    _ENDING
    + """
if redis.call('GET', KEYS[3]) ~= ARGV[2] then return 0 end
local logged = redis.call('LLEN', KEYS[2])
if logged < tonumber(ARGV[6]) then return {logged} end
local fields = {}
for i = 7, #ARGV do table.insert(fields, ARGV[i]) end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('HDEL', KEYS[1], 'owner')
redis.call('HSET', KEYS[1], 'finished_fence', ARGV[2])  -- its RENEW then says ended, not lost
local ttl = kept(KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
redis.call('DEL', KEYS[3])
redis.call('DEL', KEYS[5])
redis.call('ZREM', KEYS[4], ARGV[1])
local record = redis.call('HMGET', KEYS[1], """
    + _READ_FIELDS_LUA
    + """)
table.insert(record, 1, logged)
announce(ARGV[4], KEYS[6], KEYS[7], ARGV[5] .. cjson.encode(record))
return 1
"""
)

# The sum of one counting command (ZCARD, ZCOUNT) over every shard's index in one call (a single
# server only: a cluster's shards live in different slots). KEYS: the shard indexes.
# ARGV: the command, then its arguments after the key
SUM_PER_SHARD = """
local total = 0
for i = 1, #KEYS do total = total + redis.call(ARGV[1], KEYS[i], unpack(ARGV, 2)) end
return total
"""

# A queued job's position: the queued jobs, every shard, whose queue deadline is earlier (a
# single server only, as SUM_PER_SHARD). KEYS[1]: the job's shard index, then every shard's.
# ARGV[1]: the job id. Returns false when the job is not queued. One round trip, where reading
# the deadline and then counting took two for every stream that started while its job waited.
QUEUE_POSITION = """
local deadline = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not deadline then return false end
local before = '(' .. deadline
local total = 0
for i = 2, #KEYS do total = total + redis.call('ZCOUNT', KEYS[i], '-inf', before) end
return total
"""

# The oldest queued jobs of shards for the wait estimate (a single server only, as
# SUM_PER_SHARD): KEYS: shards' queue indexes; ARGV[1], ARGV[2]: the ranks from and to
# (inclusive). Returns, per shard, its job id, score, job id, score... One command where a
# pipeline of one ZRANGE a shard cost the web process 10 ms of CPU a read with nothing queued.
QUEUED_HEADS = """
local found = {}
for i = 1, #KEYS do
  found[i] = redis.call('ZRANGE', KEYS[i], ARGV[1], ARGV[2], 'WITHSCORES')
end
return found
"""

# What the wait estimate reads of each queued job (a single server only, as SUM_PER_SHARD):
# KEYS: the jobs' hashes. Returns their model, priority, tenant_digest, max_tokens and status
# in turn, false (HMGET's nil) for each one missing. One command for a chunk of jobs: a
# pipeline of one HMGET each cost the web process 35 us of CPU a job to write and parse (70 ms
# for 2,000).
QUEUED_FIELDS = """
local rows = {}
for i = 1, #KEYS do
  local found = redis.call('HMGET', KEYS[i], 'model', 'priority', 'tenant_digest', 'max_tokens',
                           'status')
  for j = 1, 5 do rows[#rows + 1] = found[j] end
end
return rows
"""

# Writes a request's records only if its idempotency key is new, in the same step as the key:
# two POSTs with one key can never both create. KEYS[1]: the idempotency key, then every key the
# writes touch. ARGV[1]: the key's record (JSON), ARGV[2]: its TTL (s), ARGV[3]: the writes, a
# JSON list of [command, index into KEYS, argument...]. Returns the existing record, or false.
CREATE_ONCE = """
local existing = redis.call('GET', KEYS[1])
if existing then return existing end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
for _, write in ipairs(cjson.decode(ARGV[3])) do
  write[2] = KEYS[write[2]]
  redis.call(unpack(write))
end
return false
"""

# A reader's view of a job, atomically: the record's fields, its output so far, the replay
# log's length and, from ARGV[1] on (-1: none), its entries. One command where a transaction of
# four took six replies to parse, on every stream's start and every read of a job.
# KEYS: job, output, tokens. ARGV: from index, then the record's fields.
# Returns {values, output or false, logged, entries or false}.
READ = """
local values = redis.call('HMGET', KEYS[1], unpack(ARGV, 2))
local logged = redis.call('LLEN', KEYS[3])
local from = tonumber(ARGV[1])
local entries = false
if from >= 0 and from < logged then entries = redis.call('LRANGE', KEYS[3], from, -1) end
return {values, redis.call('GET', KEYS[2]) or false, logged, entries}
"""
