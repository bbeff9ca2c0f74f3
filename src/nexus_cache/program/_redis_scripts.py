"""The Lua scripts of :class:`RedisProgramCache`: each operation is one atomic call.

Keys of a namespace ``NS``:

* ``NS:e:<digest hex>``: one entry, a hash of ``b`` (the raw binary) and
  ``r`` (its integrity record, the FileStream record format);
* ``NS:lru`` (sorted set: digest hex -> tick of its last read or write),
  ``NS:sizes`` (hash: digest hex -> bytes), ``NS:bytes`` (the sum) and
  ``NS:tick`` (a counter the server increments, so every client's reads are
  ordered by one clock): the LRU index, kept only by capped objects.

Entry keys that the eviction loop derives from the index are not declared
in ``KEYS``: the scripts need a standalone server (or one shard).
"""

from __future__ import annotations

__all__ = ["DELETE", "READ", "WRITE"]

# KEYS: entry, lru, tick. ARGV: member, index (1/0), ttl in ms (0: none).
# Returns [binary, record] or nil.
READ = """
local v = redis.call('HMGET', KEYS[1], 'b', 'r')
if not v[1] then return false end
if ARGV[2] == '1' then
  redis.call('ZADD', KEYS[2], 'XX', redis.call('INCR', KEYS[3]), ARGV[1])
end
if ARGV[3] ~= '0' then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return {v[1], v[2] or ''}
"""

# KEYS: entry, lru, tick, sizes, bytes. ARGV: member, binary, record, ttl in
# ms (0: none), cap (0: none), entry key prefix. Returns the entries evicted.
WRITE = """
redis.call('HSET', KEYS[1], 'b', ARGV[2], 'r', ARGV[3])
if ARGV[4] ~= '0' then
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
else
  redis.call('PERSIST', KEYS[1])
end
local cap = tonumber(ARGV[5])
if cap == 0 then return 0 end
local size = string.len(ARGV[2])
local old = tonumber(redis.call('HGET', KEYS[4], ARGV[1]) or '0')
redis.call('HSET', KEYS[4], ARGV[1], size)
local total = redis.call('INCRBY', KEYS[5], size - old)
redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), ARGV[1])
local evicted = 0
while total > cap do
  local popped = redis.call('ZPOPMIN', KEYS[2])
  if #popped == 0 or popped[1] == ARGV[1] then
    -- Only this entry is left, so the sum drifted (index keys lost to the
    -- server's own eviction): restart it from this entry.
    redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), ARGV[1])
    redis.call('SET', KEYS[5], size)
    break
  end
  local m = popped[1]
  local s = tonumber(redis.call('HGET', KEYS[4], m) or '0')
  redis.call('HDEL', KEYS[4], m)
  total = redis.call('DECRBY', KEYS[5], s)
  evicted = evicted + redis.call('DEL', ARGV[6] .. m)
end
return evicted
"""

# KEYS: entry, lru, sizes, bytes. ARGV: member, only-if ('1'/'0'), record.
# Deletes the entry; with only-if '1', only while it still carries that
# record (a damaged value rewritten meanwhile stays). Returns 1 when deleted.
DELETE = """
if ARGV[2] == '1' and (redis.call('HGET', KEYS[1], 'r') or '') ~= ARGV[3] then return 0 end
local n = redis.call('DEL', KEYS[1])
local s = redis.call('HGET', KEYS[3], ARGV[1])
if s then
  redis.call('HDEL', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('DECRBY', KEYS[4], s)
end
return n
"""
