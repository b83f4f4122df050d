"""The batch runner's Redis scripts (api/batches/runner.py).

Every write that changes a batch's state is one of these scripts, and each first checks that the
lease is still the writer's (KEYS[1] = the lease, ARGV[1] = the holder; -1 when it is not): a
runner that lost its batch (stalled past the lease) can no longer change it, whatever it was in
the middle of.
"""

from __future__ import annotations

HELD = "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end\n"
# 1: held by ARGV[1] (taken or renewed), 0: someone else's. ARGV[2]=ms.
LEASE = """
local v = redis.call('GET', KEYS[1])
if not v then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
return 0
"""
RELEASE = HELD + "return redis.call('DEL', KEYS[1])"
# KEYS: lease, batch. ARGV: holder, record JSON.
SAVE = HELD + "redis.call('HSET', KEYS[2], 'record', ARGV[2]) return 1"
# KEYS: lease, batch, lines, staged lines. ARGV: holder, record JSON. The lines, written to the
# staged key first, become the batch's (none: an empty batch).
VALIDATED = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then redis.call('DEL', KEYS[4]) return -1 end
redis.call('DEL', KEYS[3])
if redis.call('EXISTS', KEYS[4]) == 1 then redis.call('RENAME', KEYS[4], KEYS[3]) end
redis.call('HSET', KEYS[2], 'record', ARGV[2], 'next', 0)
return 1
"""
# KEYS: lease, running, batch. ARGV: holder, line index, entry JSON. The line's jobs are queued.
RUN = HELD + """
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
if tonumber(redis.call('HGET', KEYS[3], 'next') or '0') <= tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[3], 'next', tonumber(ARGV[2]) + 1)
end
return 1
"""
# KEYS: lease, results, running, batch, stats. ARGV: holder, line index, output line, counter
# (ok|err), stats field. Stores the line's answer once (0: it had one): counted once, however
# often a runner gets here.
ANSWER = HELD + """
redis.call('HDEL', KEYS[3], ARGV[2])
if tonumber(redis.call('HGET', KEYS[4], 'next') or '0') <= tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[4], 'next', tonumber(ARGV[2]) + 1)
end
if redis.call('HSETNX', KEYS[2], ARGV[2], ARGV[3]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[4], ARGV[4], 1)
redis.call('HINCRBY', KEYS[5], ARGV[5], 1)
return 1
"""
# KEYS: lease, batch, lines, running, results, active set. ARGV: holder, record JSON, batch id.
END = HELD + """
redis.call('HSET', KEYS[2], 'record', ARGV[2])
redis.call('DEL', KEYS[3], KEYS[4], KEYS[5], KEYS[1])
redis.call('SREM', KEYS[6], ARGV[3])
return 1
"""
