"""Lua scripts for the job state transitions that must be atomic.

Each runs inside Redis as one step, so a claim, a cancel, a crash recovery and a token append
can never interleave halfway. Used only by ``store``.
"""

from __future__ import annotations

# KEYS: job, lease, running, queued, tokens
# ARGV: id, now, node, lease_ms, max_attempts, poisoned_error_json, result_ttl, channel, done_msg,
#       status_msg (announces the change to running)
# Returns {outcome, attempts}, and when claimed also the job hash and the replay log's length, so
# a worker starts a job in one round trip.
CLAIM = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'missing', 0} end
if status ~= 'queued' then return {status, 0} end
redis.call('ZREM', KEYS[4], ARGV[1])
local attempts = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
if attempts > tonumber(ARGV[5]) then
  redis.call('HSET', KEYS[1], 'status', 'failed', 'finish_reason', 'error',
             'completed_at', ARGV[2], 'error', ARGV[6])
  redis.call('EXPIRE', KEYS[1], ARGV[7])
  redis.call('EXPIRE', KEYS[5], ARGV[7])
  redis.call('PUBLISH', ARGV[8], ARGV[9])
  return {'poisoned', attempts}
end
local fence = ARGV[3] .. ':' .. attempts
redis.call('HSET', KEYS[1], 'status', 'running', 'owner', fence)
if redis.call('HEXISTS', KEYS[1], 'started_at') == 0 then
  redis.call('HSET', KEYS[1], 'started_at', ARGV[2])
end
redis.call('SET', KEYS[2], fence, 'PX', ARGV[4])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
redis.call('PUBLISH', ARGV[8], ARGV[10])
return {'claimed', attempts, redis.call('HGETALL', KEYS[1]), redis.call('LLEN', KEYS[5])}
"""

# KEYS: job, queued, tokens   ARGV: id, now, result_ttl, channel, done_msg
CANCEL = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 'missing' end
if status == 'queued' then
  redis.call('HSET', KEYS[1], 'status', 'canceled', 'finish_reason', 'canceled',
             'completed_at', ARGV[2])
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  redis.call('EXPIRE', KEYS[3], ARGV[3])
  redis.call('PUBLISH', ARGV[4], ARGV[5])
  return 'canceled'
end
if status == 'running' then
  redis.call('HSET', KEYS[1], 'cancel_requested', '1')
  return 'requested'
end
return 'finished'
"""

# KEYS: lease   ARGV: fence, lease_ms
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# A running job whose lease expired: its worker died. Requeue it (or finish it as canceled when
# a cancel was pending). KEYS: job, lease, running, queued, tokens
# ARGV: id, now, queue_deadline, result_ttl, channel, done_msg, status_msg
RECOVER = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 'alive' end
local status = redis.call('HGET', KEYS[1], 'status')
redis.call('ZREM', KEYS[3], ARGV[1])
if status ~= 'running' then return 'gone' end
redis.call('HDEL', KEYS[1], 'owner')
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then
  redis.call('HSET', KEYS[1], 'status', 'canceled', 'finish_reason', 'canceled',
             'completed_at', ARGV[2], 'completion_tokens', redis.call('LLEN', KEYS[5]))
  redis.call('EXPIRE', KEYS[1], ARGV[4])
  redis.call('EXPIRE', KEYS[5], ARGV[4])
  redis.call('PUBLISH', ARGV[5], ARGV[6])
  return 'canceled'
end
redis.call('HSET', KEYS[1], 'status', 'queued')
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
redis.call('PUBLISH', ARGV[5], ARGV[7])
return 'requeued'
"""

# Give a claimed job back without counting an attempt (graceful shutdown); one whose cancel is
# pending is canceled instead. KEYS: job, lease, running, queued
# ARGV: id, fence, queue_deadline, now, result_ttl, channel, done_msg, status_msg
RELEASE = """
if redis.call('GET', KEYS[2]) ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[1], 'owner')
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then
  redis.call('HSET', KEYS[1], 'status', 'canceled', 'finish_reason', 'canceled',
             'completed_at', ARGV[4])
  redis.call('EXPIRE', KEYS[1], ARGV[5])
  redis.call('PUBLISH', ARGV[6], ARGV[7])
  return 2
end
redis.call('HSET', KEYS[1], 'status', 'queued')
redis.call('HINCRBY', KEYS[1], 'attempts', -1)
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
redis.call('PUBLISH', ARGV[6], ARGV[8])
return 1
"""

# A queued job past its queue deadline. KEYS: job, queued, tokens
# ARGV: id, now, error_json, result_ttl, channel, done_msg
EXPIRE_QUEUED = """
local status = redis.call('HGET', KEYS[1], 'status')
redis.call('ZREM', KEYS[2], ARGV[1])
if status ~= 'queued' then return 0 end
redis.call('HSET', KEYS[1], 'status', 'failed', 'finish_reason', 'error',
           'completed_at', ARGV[2], 'error', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('EXPIRE', KEYS[3], ARGV[4])
redis.call('PUBLISH', ARGV[5], ARGV[6])
return 1
"""

# One flush of token events, fenced per job: only the lease holder may append. Entries already
# in the log (a retried flush whose first reply was lost) are skipped, so a retry is harmless;
# entries that would leave a gap (log position must equal token index) are refused like a lost
# fence.
# KEYS[1] = channel; then per job i: job hash, tokens list, lease
# ARGV[1] = number of jobs; then per job: fence, first_token_at ('' if none), index of the first
#           entry, k, k log entries, the job's fragment of the channel message
# Returns, per job, 1 if appended (0 if fenced out), then per job the cancel_requested flag.
APPEND_STEP = """
local jobs = tonumber(ARGV[1])
local a = 2
local parts = {}
local accepted = {}
local cancels = {}
for i = 1, jobs do
  local base = 1 + 3 * (i - 1)
  local fence = ARGV[a]
  local first = ARGV[a + 1]
  local first_index = tonumber(ARGV[a + 2])
  local k = tonumber(ARGV[a + 3])
  a = a + 4
  local present = redis.call('LLEN', KEYS[base + 2]) - first_index
  if redis.call('GET', KEYS[base + 3]) == fence and present >= 0 then
    for j = present, k - 1 do
      redis.call('RPUSH', KEYS[base + 2], ARGV[a + j])
    end
    if first ~= '' then
      redis.call('HSET', KEYS[base + 1], 'first_token_at', first)
    end
    table.insert(parts, ARGV[a + k])
    accepted[i] = 1
  else
    accepted[i] = 0
  end
  cancels[i] = redis.call('HGET', KEYS[base + 1], 'cancel_requested') or ''
  a = a + k + 1
end
if #parts > 0 then
  redis.call('PUBLISH', KEYS[1], '{"t":[' .. table.concat(parts, ',') .. '],"d":[]}')
end
local result = {}
for i = 1, jobs do table.insert(result, accepted[i]) end
for i = 1, jobs do table.insert(result, cancels[i]) end
return result
"""

# Store a job's final state, fenced. KEYS: job, tokens, lease, running
# ARGV: id, fence, result_ttl, channel, done_msg, then field/value pairs
FINISH = """
if redis.call('GET', KEYS[3]) ~= ARGV[2] then return 0 end
local fields = {}
for i = 6, #ARGV do table.insert(fields, ARGV[i]) end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('HDEL', KEYS[1], 'owner')
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('DEL', KEYS[3])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
"""
