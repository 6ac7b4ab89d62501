"""How the Redis cache reads entries without letting their size reach the event loop unbounded.

An MGET brings back every value it names whole, however large: 40 lookups of a 60 MiB entry were
one 2.4 GB reply, parsed on the loop (issue 31, N8). Here a batch of lookups is one Lua script
(EVALSHA, one command as an MGET was) that returns each value whole only while it is small
(INLINE_BYTES) and the batch's reply stays under BATCH_BYTES; for every other key it returns the
value's length instead. A value left out for the budget's sake is asked for again in the next
batch; a large one is read by `read_large` in PIECE_BYTES pieces (GETRANGE), each a short reply
that the loop copies into one buffer, so no reply is ever larger than a piece. The caller decides
how many large reads run at once. A value read in pieces can change between two of them: its
digest (kernel.core.cache_redis_entry) tells.

Where scripting is refused (an ACL without @scripting, a server without Lua), each batch is a
pipeline of STRLEN and GETRANGE per key instead (twice the commands, the same bounds), chosen
once when the cache connects.

What a lookup gives for each key: the value (bytes), or its length when it was not sent (0: no
such key), or -1 when the key holds something other than a string.
"""

from __future__ import annotations

import logging
import mmap

log = logging.getLogger("kernel.core.cache")

INLINE_BYTES = 256 << 10  # values up to this size come back whole in a lookup batch
BATCH_BYTES = 4 << 20  # bytes of values one lookup batch may bring back
PIECE_BYTES = 1 << 20  # a large value is read this many bytes at a time
FALLBACK_BATCH = BATCH_BYTES // INLINE_BYTES  # keys per pipelined batch where scripting is refused

_SCRIPT_ARGS = (b"%d" % INLINE_BYTES, b"%d" % BATCH_BYTES)  # encoded once, not per call

# KEYS: the entries; ARGV[1]: INLINE_BYTES; ARGV[2]: BATCH_BYTES. A non-string key answers -1
# (redis.pcall returns its error as a table instead of failing the whole script).
LOOKUP_SCRIPT = """
local inline, budget = tonumber(ARGV[1]), tonumber(ARGV[2])
local out, used = {}, 0
for i, key in ipairs(KEYS) do
  local n = redis.pcall('STRLEN', key)
  if type(n) ~= 'number' then
    out[i] = -1
  elseif n > 0 and n <= inline and used + n <= budget then
    out[i] = redis.call('GET', key)
    used = used + n
  else
    out[i] = n
  end
end
return out
"""


class Reader:
    """The reads of one RedisCache (its redis-py client)."""

    def __init__(self, client):
        self.client = client
        self.script = client.register_script(LOOKUP_SCRIPT)
        self.scripted = True

    @property
    def batch_keys(self) -> int:
        """The most keys one lookup batch should carry."""
        return 256 if self.scripted else FALLBACK_BATCH

    async def choose(self) -> None:
        """Use the script where the server runs it (loads it now), else the pipeline."""
        try:
            await self.client.script_load(LOOKUP_SCRIPT)
        except Exception as exc:  # noqa: BLE001 - a refusal (NOPERM, unknown command): the pipeline it is
            if not _refused(exc):
                raise
            self.scripted = False
            log.info("response cache: redis refuses Lua scripts (%s); lookups use pipelined STRLEN/GETRANGE", exc)

    async def lookup(self, keys: list) -> list:
        if self.scripted:
            return await self.script(keys=keys, args=_SCRIPT_ARGS)
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.strlen(key)
            pipe.getrange(key, 0, INLINE_BYTES - 1)
        replies = await pipe.execute(raise_on_error=False)
        out = []
        for i in range(0, len(replies), 2):
            n, value = replies[i], replies[i + 1]
            if not isinstance(n, int):
                out.append(-1)
            elif 0 < n <= INLINE_BYTES and isinstance(value, bytes) and len(value) == n:
                out.append(value)
            else:
                out.append(n)  # large, missing, or changed between the two commands: read again
        return out

    async def read_large(self, key: bytes, size: int):
        """The `size` bytes of the value at `key`, read in pieces into one buffer; None when the value
        became shorter or went away meanwhile."""
        buffer = mmap.mmap(-1, size)  # pages appear as pieces fill them (a bytearray zeroes them all at once)
        offset = 0
        while offset < size:
            want = min(PIECE_BYTES, size - offset)
            piece = await self.client.getrange(key, offset, offset + want - 1)
            if len(piece) != want:
                return None
            buffer[offset:offset + want] = piece
            offset += want
        return buffer


def _refused(exc: Exception) -> bool:
    text = str(exc).lower()
    return type(exc).__name__ in ("ResponseError", "NoPermissionError") and (
        "noperm" in text or "unknown command" in text or "no permissions" in text or "scripting" in text)
