"""The quota windows in Redis, shared by every replica: tenants/window.py's rules, run atomically.

One hash per tenant and limit (`<prefix>:quota:{<tenant>}:requests|tokens`, field: the second,
value: the amount taken in it; the braces keep a tenant's two hashes in one Redis Cluster slot).
take is one Lua script over both hashes: it drops seconds older than the window, checks that the
amount fits each (the rule of SlidingMinute.fits), adds it to the current second of every one or
of none, and returns the seconds it kept, so that this process computes the headers and Retry-After
with the same code as the local windows (quota.standing). The time is Redis's own (TIME), so
replicas whose clocks differ still count one minute.

A call that takes longer than PALMYRA_QUOTA_REDIS_TIMEOUT_S raises, and tenants/quota.py falls back
to this replica's share.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from redis.credentials import CredentialProvider

from palmyra_serve.sidecar.tenants.quota import Taken, standing
from palmyra_serve.sidecar.tenants.window import WINDOW_S, SlidingMinute

# KEYS: one hash per limit. ARGV: the window, then a (limit, amount) pair per key.
# Returns {admitted (1/0), now, refused key index (0: none), flat [second, amount, ...] per key}.
TAKE = """
local now = tonumber(redis.call('TIME')[1])
local window = tonumber(ARGV[1])
local kept = {}
local refused = 0
for i, key in ipairs(KEYS) do
  local flat = redis.call('HGETALL', key)
  local used = 0
  local slots = {}
  for j = 1, #flat, 2 do
    local second = tonumber(flat[j])
    if second <= now - window then
      redis.call('HDEL', key, flat[j])
    else
      used = used + tonumber(flat[j + 1])
      slots[#slots + 1] = flat[j]
      slots[#slots + 1] = flat[j + 1]
    end
  end
  kept[i] = slots
  local limit = tonumber(ARGV[2 * i])
  local amount = tonumber(ARGV[2 * i + 1])
  if refused == 0 and used > 0 and used + amount > limit then
    refused = i
  end
end
if refused == 0 then
  for i, key in ipairs(KEYS) do
    local amount = tonumber(ARGV[2 * i + 1])
    redis.call('HINCRBY', key, now, amount)
    redis.call('EXPIRE', key, window + 5)
    local slots = kept[i]
    local found = false
    for j = 1, #slots, 2 do
      if tonumber(slots[j]) == now then
        slots[j + 1] = tostring(tonumber(slots[j + 1]) + amount)
        found = true
      end
    end
    if not found then
      slots[#slots + 1] = tostring(now)
      slots[#slots + 1] = tostring(amount)
    end
  end
end
local out = {refused == 0 and 1 or 0, now, refused}
for i = 1, #KEYS do out[#out + 1] = kept[i] end
return out
"""

# KEYS[1]: the tokens hash. ARGV: the window, the reservation's second, the correction.
SETTLE = """
local now = tonumber(redis.call('TIME')[1])
local window = tonumber(ARGV[1])
local slot = tonumber(ARGV[2])
local delta = tonumber(ARGV[3])
if slot > now - window and redis.call('HEXISTS', KEYS[1], ARGV[2]) == 1 then
  redis.call('HINCRBY', KEYS[1], ARGV[2], delta)
elseif delta > 0 then
  redis.call('HINCRBY', KEYS[1], now, delta)
  redis.call('EXPIRE', KEYS[1], window + 5)
end
return 1
"""


class PasswordFile(CredentialProvider):
    """The password read from its file (a mounted Secret) for every new connection: a rotated
    Secret is used from the next connection on, without a restart; the URL itself is no secret."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def get_credentials(self) -> tuple[str]:
        return (self.path.read_text(encoding="utf-8").strip(),)

    async def get_credentials_async(self) -> tuple[str]:
        return self.get_credentials()


# Connections to Redis at once. Past it a call waits for one (a blocking pool, within the call's
# timeout) rather than failing at once: a burst of requests is not an unreachable Redis.
MAX_CONNECTIONS = 64


def client(url: str, password_file: Path | None, ca_file: Path | None, timeout_s: float) -> Redis:
    """A client for `url` (redis:// or rediss:// for TLS), its password from a file (PasswordFile)."""
    options: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "health_check_interval": 30,
        "max_connections": MAX_CONNECTIONS,
        "timeout": timeout_s,
    }
    if password_file is not None:
        options["credential_provider"] = PasswordFile(password_file)
    if ca_file is not None:
        options["ssl_ca_certs"] = str(ca_file)
    return Redis.from_pool(BlockingConnectionPool.from_url(url, **options))  # the client owns it: aclose() closes it


class RedisStore:
    def __init__(self, redis: Redis, prefix: str = "palmyra", timeout_s: float = 0.25) -> None:
        self.redis = redis
        self.prefix = prefix
        self.timeout_s = timeout_s
        self._take = redis.register_script(TAKE)
        self._settle = redis.register_script(SETTLE)

    def key(self, tenant: str, kind: str) -> str:
        return f"{self.prefix}:quota:{{{tenant}}}:{kind}"

    async def take(self, tenant: str, limits: dict[str, int], amounts: dict[str, int]) -> Taken:
        kinds = list(limits)
        args: list[int] = [WINDOW_S]
        for kind in kinds:
            args += [limits[kind], min(amounts[kind], limits[kind])]
        async with asyncio.timeout(self.timeout_s):
            reply = await self._take(keys=[self.key(tenant, kind) for kind in kinds], args=args)
        admitted, now, refused = bool(int(reply[0])), int(reply[1]), int(reply[2])
        states = {}
        for i, kind in enumerate(kinds):
            flat = reply[3 + i]
            window = SlidingMinute({int(flat[j]): int(flat[j + 1]) for j in range(0, len(flat), 2)})
            amount = min(amounts[kind], limits[kind])
            states[kind] = standing(window, now, limits[kind], amount, refused != i + 1)
        return Taken(admitted, now, states, kinds[refused - 1] if refused else None)

    async def settle(self, tenant: str, slot: int, delta: int) -> None:
        async with asyncio.timeout(self.timeout_s):
            await self._settle(keys=[self.key(tenant, "tokens")], args=[WINDOW_S, slot, delta])

    async def ping(self) -> None:
        async with asyncio.timeout(self.timeout_s):
            await self.redis.ping()

    async def close(self) -> None:
        await self.redis.aclose()
