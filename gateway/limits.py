"""Per-tenant limits, shared by every gateway through Redis: a request is admitted within its
tenant's limits or refused at once with RESOURCE_EXHAUSTED (HTTP 429), naming the limit.

The limits come from the keys file (services.tenants); 0 is no limit:

- ``max_concurrency``: requests in flight, each of ``n``'s choices counting one. Held per gateway
  (a hash field under the gateway's id, which lives while the gateway renews it), so the holds of
  a gateway that died without releasing them lapse with it.
- ``tpm``: a token bucket of ``tpm`` tokens that refills at ``tpm``/60 a second (on Redis's
  clock). A request reserves its prompt (estimated) + ``max_tokens`` x ``n`` when admitted; when
  it ends the reservation is settled to the usage it was sent (services docs: the usage ledger).
- ``daily_tokens``: tokens a UTC day, reserved and settled as ``tpm``.

One Lua script checks every limit and takes them all, or none: two gateways cannot both take the
last unit. A tenant with none of these limits costs no Redis call.

Redis down (an error, or no answer within ``--limits-timeout-s``): the gateway decides alone,
for ``LOCAL_S`` before it asks Redis again, with its share (``--flow-fleet-share``, 1/N of N
gateways) of each limit, counted from when it began deciding alone; each such decision is
counted in ``meshserve_gateway_limits_local_total``. A request never waits on Redis longer than
the timeout. Settlements Redis could not take are kept (bounded) and made once it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc
import prometheus_client
import redis.asyncio as aioredis
import redis.exceptions

from meshserve.gateway.errors import GatewayError, invalid
from meshserve.services import validation
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.tenants import TenantSettings

log = logging.getLogger(__name__)

LIMIT_METADATA = "x-meshserve-limit"  # trailing metadata of a refusal: which limit it was
LOCAL_S = 1.0          # after a Redis failure, decide locally this long before asking Redis again
ALIVE_S = 5.0          # a gateway renews its id this often ...
ALIVE_TTL_S = 15       # ... and its holds lapse this long after it stops
MAX_PENDING = 100_000  # settlements kept while Redis is away
DAY_S = 86_400

REFUSED = prometheus_client.Counter(
    "meshserve_gateway_limits_refused_total", "Requests refused by a tenant's limit, by tenant and limit "
    "(concurrency, tpm, daily_tokens)", ["tenant", "limit"])
LOCAL = prometheus_client.Counter(
    "meshserve_gateway_limits_local_total", "Admissions this gateway decided alone, with its share of the "
    "tenant's limits, because Redis did not answer", ["tenant"])

# KEYS: the tenant's holds (hash: gateway id -> choices), token bucket (hash: level, at), and the
# prefix of its daily counters. ARGV: gateway id, choices, tokens, max_concurrency, tpm,
# daily_tokens, the prefix of the gateways' liveness keys, their time to live (the caller's is
# renewed: its holds count from its first). Returns {limit, retry_after_s, day}:
# limit '' when admitted (and everything taken), else the first limit it would exceed.
RESERVE = """
local gw, choices, tokens = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local max_conc, tpm, daily = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local day = tostring(math.floor(now / 86400))
redis.call('SET', ARGV[7] .. gw, '1', 'EX', ARGV[8])
if max_conc > 0 then
  local held = 0
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    if all[i] == gw or redis.call('EXISTS', ARGV[7] .. all[i]) == 1 then
      held = held + tonumber(all[i + 1])
    else
      redis.call('HDEL', KEYS[1], all[i])
    end
  end
  if held + choices > max_conc then return {'concurrency', '1', day} end
end
local level = 0
if tpm > 0 then
  local b = redis.call('HMGET', KEYS[2], 'level', 'at')
  level = math.max(0, (tonumber(b[1]) or 0) - (now - (tonumber(b[2]) or now)) * tpm / 60)
  if level + tokens > tpm then
    return {'tpm', tostring(math.ceil((level + tokens - tpm) * 60 / tpm)), day}
  end
end
local used = 0
if daily > 0 then
  used = tonumber(redis.call('GET', KEYS[3] .. day) or '0')
  if used + tokens > daily then return {'daily_tokens', tostring(math.ceil(86400 - now % 86400)), day} end
end
if max_conc > 0 then redis.call('HINCRBY', KEYS[1], gw, choices) end
if tpm > 0 then
  redis.call('HSET', KEYS[2], 'level', tostring(level + tokens), 'at', tostring(now))
  redis.call('EXPIRE', KEYS[2], 120)
end
if daily > 0 then
  redis.call('INCRBY', KEYS[3] .. day, tokens)
  redis.call('EXPIRE', KEYS[3] .. day, 2 * 86400)
end
return {'', '0', day}
"""

# The same KEYS (the daily counter's whole key); ARGV: gateway id, choices held, tokens to give
# back (reserved - used; negative: more was used), whether it held tpm, whether it held daily.
SETTLE = """
local gw, choices, back = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if choices > 0 and redis.call('HINCRBY', KEYS[1], gw, -choices) <= 0 then redis.call('HDEL', KEYS[1], gw) end
if ARGV[4] == '1' and redis.call('EXISTS', KEYS[2]) == 1 then
  local level = tonumber(redis.call('HGET', KEYS[2], 'level') or '0')
  redis.call('HSET', KEYS[2], 'level', tostring(math.max(0, level - back)))
end
if ARGV[5] == '1' and redis.call('EXISTS', KEYS[3]) == 1 then
  if redis.call('DECRBY', KEYS[3], back) < 0 then redis.call('SET', KEYS[3], '0', 'KEEPTTL') end
end
return 0
"""


@dataclass
class Reservation:
    """What one client request holds: ``choices`` places and ``tokens`` tokens, where."""

    tenant: str
    choices: int = 0     # held against max_concurrency (0: none)
    tokens: int = 0      # reserved against tpm and daily_tokens
    tpm: bool = False
    daily: bool = False
    where: str = ""      # "redis", "local", or "" (nothing held)
    day: str = ""        # the daily counter it counts in (Redis's day number)


def exceeded(tenant: str, limit: str, detail: str, retry_after_s: float) -> GatewayError:
    """RESOURCE_EXHAUSTED naming the tenant's ``limit``, with the seconds until it could pass."""
    seconds = max(1, math.ceil(retry_after_s))
    REFUSED.labels(tenant or "-", limit).inc()
    return GatewayError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"tenant {tenant or '(anonymous)'} is over its {limit} limit ({detail}); "
                        f"retry after {seconds}s", (("retry-after", str(seconds)), (LIMIT_METADATA, limit)))


def reserved_tokens(reqs: Sequence[pb.GenerateRequest], own: TenantSettings) -> int:
    """What a request reserves: its prompt (estimated) and each choice's ``max_tokens`` (the
    default within the tenant's cap)."""
    most = [validation.max_tokens(r) for r in reqs]
    if own.max_tokens:
        most = [min(m, own.max_tokens) for m in most]
    return validation.prompt_tokens_estimate(reqs[0]) + sum(max(0, m) for m in most)


def _detail(limit: str, own: TenantSettings, choices: int, tokens: int) -> str:
    if limit == "concurrency":
        return f"at most {own.max_concurrency} requests (each of n's choices counts) at once; this one has {choices}"
    if limit == "tpm":
        return f"{own.tpm} tokens a minute; this request reserves {tokens}"
    return f"{own.daily_tokens} tokens a day (UTC); this request reserves {tokens}"


@dataclass
class _Bucket:
    level: float = 0.0
    at: float = 0.0


@dataclass
class LocalLimits:
    """The same limits, scaled by ``share``, kept in this gateway alone (Redis away)."""

    share: float
    clock: Callable[[], float] = time.time
    held: dict[str, int] = field(default_factory=dict)
    buckets: dict[str, _Bucket] = field(default_factory=dict)
    days: dict[tuple[str, str], int] = field(default_factory=dict)

    def _scaled(self, limit: int) -> int:
        return max(1, math.floor(limit * self.share)) if limit else 0

    def reserve(self, tenant: str, own: TenantSettings, choices: int, tokens: int) -> tuple[str, float, str]:
        """(limit exceeded or '', retry-after seconds, day) as the Redis script answers; takes all
        when admitted."""
        now = self.clock()
        day = str(math.floor(now / DAY_S))
        max_conc, tpm, daily = (self._scaled(x) for x in (own.max_concurrency, own.tpm, own.daily_tokens))
        if max_conc and self.held.get(tenant, 0) + choices > max_conc:
            return "concurrency", 1.0, day
        bucket = self.buckets.setdefault(tenant, _Bucket(0.0, now))
        level = max(0.0, bucket.level - (now - bucket.at) * tpm / 60) if tpm else 0.0
        if tpm and level + tokens > tpm:
            return "tpm", (level + tokens - tpm) * 60 / tpm, day
        if daily and self.days.get((tenant, day), 0) + tokens > daily:
            return "daily_tokens", DAY_S - now % DAY_S, day
        if max_conc:
            self.held[tenant] = self.held.get(tenant, 0) + choices
        if tpm:
            bucket.level, bucket.at = level + tokens, now
        if daily:
            self.days[(tenant, day)] = self.days.get((tenant, day), 0) + tokens
        return "", 0.0, day

    def settle(self, r: Reservation, back: int) -> None:
        if r.choices:
            self.held[r.tenant] = max(0, self.held.get(r.tenant, 0) - r.choices)
        if r.tpm and (bucket := self.buckets.get(r.tenant)):
            bucket.level = max(0.0, bucket.level - back)
        if r.daily and (r.tenant, r.day) in self.days:
            self.days[(r.tenant, r.day)] = max(0, self.days[(r.tenant, r.day)] - back)


class Limits:
    """Reserves and settles tenants' limits. ``settings``: each tenant's; ``redis``: the mesh's
    (None: this gateway's limits are its own, at ``share``)."""

    def __init__(self, settings: Callable[[str], TenantSettings], redis: aioredis.Redis | None, key_prefix: str,
                 share: float, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._redis = redis
        self._prefix = key_prefix
        self._timeout_s = timeout_s
        self._clock = clock
        self._local = LocalLimits(share if redis is not None else 1.0)
        self._id = uuid.uuid4().hex
        self._local_until = 0.0           # Redis failed: decide locally until then
        self._holding = 0                 # choices this gateway holds in Redis: its id is renewed while > 0
        self._pending: list[tuple[Reservation, int]] = []  # settlements Redis could not take
        self._tasks: set[asyncio.Task[None]] = set()
        self._alive: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        if redis is not None:
            self._reserve = redis.register_script(RESERVE)
            self._settle = redis.register_script(SETTLE)

    def start(self) -> None:
        if self._redis is not None:
            self._alive = asyncio.get_running_loop().create_task(self._keep_alive())

    async def admit(self, reqs: Sequence[pb.GenerateRequest], tenant: str) -> Reservation:
        """Admits a client request of ``reqs`` choices within ``tenant``'s limits: its ``n`` within the
        tenant's cap (else INVALID_ARGUMENT naming 'n', as a ``max_tokens`` above its cap: asking
        again cannot help), then its places and tokens reserved (``reserve``)."""
        own = self._settings(tenant)
        if own.max_n and len(reqs) > own.max_n:
            raise invalid(grpc.StatusCode.INVALID_ARGUMENT, f"'n' is {len(reqs)}; tenant {tenant or '(anonymous)'} "
                          f"may ask for at most {own.max_n}", "n")
        return await self.reserve(tenant, len(reqs), reserved_tokens(reqs, own))

    async def reserve(self, tenant: str, choices: int, tokens: int) -> Reservation:
        """Holds ``choices`` places and ``tokens`` tokens of ``tenant``'s limits; GatewayError
        RESOURCE_EXHAUSTED naming the limit (and the tenant) when one would be exceeded."""
        own = self._settings(tenant)
        r = Reservation(tenant, choices if own.max_concurrency else 0, tokens, bool(own.tpm), bool(own.daily_tokens))
        if not (r.choices or r.tpm or r.daily):
            return r
        limit, retry_after, r.day, r.where = await self._take(tenant, own, r)
        if limit:
            raise exceeded(tenant, limit, _detail(limit, own, choices, tokens), retry_after)
        return r

    async def _take(self, tenant: str, own: TenantSettings, r: Reservation) -> tuple[str, float, str, str]:
        if self._redis is not None and self._clock() >= self._local_until:
            try:
                async with asyncio.timeout(self._timeout_s):
                    limit, retry_after, day = await self._reserve(
                        keys=self._keys(tenant, ""),
                        args=[self._id, r.choices, r.tokens, own.max_concurrency, own.tpm, own.daily_tokens,
                              self._prefix + "gateway:", ALIVE_TTL_S])
                if not _text(limit):
                    self._holding += r.choices
                return _text(limit), float(retry_after), _text(day), "redis"
            except (redis.exceptions.RedisError, OSError, TimeoutError) as e:
                self._went_away(e)
        if self._redis is not None:
            LOCAL.labels(tenant or "-").inc()
        limit, retry_after, day = self._local.reserve(tenant, own, r.choices, r.tokens)
        return limit, retry_after, day, "local"

    def settle(self, r: Reservation, used: int) -> None:
        """Gives back what ``r`` held, its tokens settled to the ``used`` ones; never waits."""
        back = r.tokens - used
        if r.where == "local":
            self._local.settle(r, back)
        elif r.where == "redis":
            self._holding -= r.choices
            task = asyncio.get_running_loop().create_task(self._settle_in_redis(r, back))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _settle_in_redis(self, r: Reservation, back: int) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._settle(keys=self._keys(r.tenant, r.day),
                                   args=[self._id, r.choices, back, int(r.tpm), int(r.daily)])
        except (redis.exceptions.RedisError, OSError, TimeoutError) as e:
            self._went_away(e)
            if len(self._pending) < MAX_PENDING:
                self._pending.append((r, back))

    def _keys(self, tenant: str, day: str) -> list[str]:
        return [f"{self._prefix}held:{tenant}", f"{self._prefix}tpm:{tenant}", f"{self._prefix}day:{tenant}:{day}"]

    def _went_away(self, e: BaseException) -> None:
        if self._clock() >= self._local_until:
            log.warning("tenant limits: Redis did not answer (%s); deciding locally with this gateway's share",
                        type(e).__name__)
        self._local_until = self._clock() + LOCAL_S

    async def _keep_alive(self) -> None:
        """Renews this gateway's id while it holds places (they live while it does) and makes the
        settlements that Redis missed."""
        assert self._redis is not None
        while not self._stop.is_set():
            try:
                if self._holding:
                    async with asyncio.timeout(self._timeout_s):
                        await self._redis.set(f"{self._prefix}gateway:{self._id}", 1, ex=ALIVE_TTL_S)
                pending, self._pending = self._pending, []
                for r, back in pending:
                    await self._settle_in_redis(r, back)
            except (redis.exceptions.RedisError, OSError, TimeoutError) as e:
                self._went_away(e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), ALIVE_S)

    async def close(self) -> None:
        """Lets Redis calls under way finish (bounded): one cancelled mid-way would leave its
        connection to the pool's close."""
        self._stop.set()
        running = [*self._tasks, *([self._alive] if self._alive is not None else [])]
        if running:
            await asyncio.wait(running, timeout=2 * self._timeout_s)
        if self._alive is not None:
            self._alive.cancel()
            await asyncio.gather(self._alive, return_exceptions=True)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
