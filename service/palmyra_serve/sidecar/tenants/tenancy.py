"""Tenants as the relay sees them: one narrow interface over the keys, the tenants file, the quotas
and the cache salts. The relay asks who a key belongs to, has the tenant's rules written into the
body, asks what the request will cost the tenant, takes a lease on its limits, and settles it when
the request ends; everything else about tenants stays in this folder.

- identify: the key (Authorization, or the Anthropic SDK's x-api-key) to a tenant, with the tenants
  view of that moment (a reload meanwhile does not change a request's tenant).
- rewrite: the tenant's cache salt (prefix-cache hits stay within it) and priority (when priority
  scheduling is on), on every generation; the Messages API, which carries neither on every engine,
  refuses a tenant it would misrepresent.
- demand and lease: the tokens it reserves (reservation.py) and the lease on its windows (quota.py),
  with the x-ratelimit-* headers every answer carries.
- settle: what the request cost, from the engine's usage when it reported it (spent()).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from palmyra_serve.settings import Settings
from palmyra_serve.sidecar.core import errors
from palmyra_serve.sidecar.core.record import RequestRecord
from palmyra_serve.sidecar.core.routes import Api
from palmyra_serve.sidecar.core.share import Share
from palmyra_serve.sidecar.tenants import reservation
from palmyra_serve.sidecar.tenants.config import Tenants, TenantSpec
from palmyra_serve.sidecar.tenants.keys import ApiKeys, credential
from palmyra_serve.sidecar.tenants.quota import Quotas, Reservation
from palmyra_serve.sidecar.tenants.reservation import Demand
from palmyra_serve.sidecar.tenants.salt import CacheSalts

# The engines whose Messages API carries cache_salt to the engine (vLLM 0.18.0's drops it).
MESSAGES_SALT_SINCE = (0, 32)


@dataclass(frozen=True, slots=True)
class Tenant:
    """A request's tenant: its spec, its share of the admission queue, and whether other tenants share
    the engine (then its prompts' privacy matters)."""

    spec: TenantSpec
    share: Share
    among_others: bool

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(slots=True)
class Lease:
    """What a request holds of its tenant's limits until it settles (None: the tenant has none)."""

    reservation: Reservation | None
    demand: Demand | None
    headers: list[tuple[bytes, bytes]] | None  # the tenant's x-ratelimit-*, on whatever answer it gets


class Tenancy:
    def __init__(self, settings: Settings, keys: ApiKeys, quotas: Quotas | None = None) -> None:
        self.settings = settings
        self.keys = keys
        self.quotas = quotas if quotas is not None else Quotas()
        self.salts = CacheSalts()

    def identify(self, authorization: bytes | None, api_key: bytes | None) -> Tenant | None:
        """The tenant whose key the request carries; None for a missing or unknown key."""
        name = self.keys.identify(credential(authorization, api_key))
        if name is None:
            return None
        tenants: Tenants = self.keys.tenants  # this request's view, whatever a reload does meanwhile
        return Tenant(tenants.spec(name), tenants.share(name), len(tenants.by_name) > 1)

    def rewrite(self, payload: dict[str, Any], tenant: Tenant, api: Api, engine_version: str | None) -> bool:
        """Write the tenant's cache salt and priority into a generation's body; True when it changed.
        Raise the client's 400 where the route cannot carry them for this tenant."""
        changed = False
        salt = self.salts.of(tenant.spec)
        if salt is not None:
            if api is Api.MESSAGES and tenant.among_others:
                _messages_keep_private(engine_version)
            payload["cache_salt"] = salt
            changed = True
        elif payload.pop("cache_salt", None) is not None:
            changed = True
        if api is Api.MESSAGES:
            self._messages_keep_order(tenant.spec)  # vLLM's Messages API has no priority to set
        elif self.settings.priority_scheduling:
            if payload.get("priority") != tenant.spec.priority:
                payload["priority"] = tenant.spec.priority
                changed = True
        elif payload.pop("priority", None) is not None:
            changed = True
        return changed

    def demand(
        self, payload: dict[str, Any], tenant: Tenant, api: Api, cap: int, extra_prompt_bytes: int
    ) -> Demand | None:
        """The tokens a generation reserves, for a tenant with a tokens limit (None otherwise)."""
        if not tenant.spec.tokens_per_minute:
            return None
        return reservation.demand(payload, api, self.settings.quota_reserve_tokens, cap, extra_prompt_bytes)

    async def lease(self, tenant: Tenant, demand: Demand | None) -> Lease:
        """A lease on the tenant's limits, or its refusal (429 with Retry-After and its headers)."""
        if not self.quotas.limited(tenant.spec):
            return Lease(None, demand, None)
        verdict = await self.quotas.admit(tenant.spec, demand.tokens if demand is not None else None)
        if verdict.reservation is None:
            assert verdict.refusal is not None
            raise verdict.refusal.with_headers(verdict.headers)
        return Lease(verdict.reservation, demand, verdict.headers)

    def release(self, lease: Lease | None) -> None:
        """The request's concurrency slot back (first, whatever fails after)."""
        if lease is not None and lease.reservation is not None:
            self.quotas.release(lease.reservation)

    async def settle(self, lease: Lease | None, record: RequestRecord) -> None:
        if lease is not None and lease.reservation is not None:
            await self.quotas.settle(lease.reservation, spent(record, lease.demand))

    def _messages_keep_order(self, spec: TenantSpec) -> None:
        """vLLM's Messages API sets no priority: with priority scheduling on, a tenant ranked below the
        engine's default would jump ahead of its rank there, so it is sent to the routes that carry it."""
        if not self.settings.priority_scheduling or spec.priority <= 0:
            return
        raise errors.ApiError.of(
            errors.ErrorCode.UNSUPPORTED_PARAMETER,
            "The Messages API cannot carry this tenant's scheduling priority: use /v1/chat/completions "
            "or /v1/responses.",
        )


def _messages_keep_private(engine_version: str | None) -> None:
    """Where several tenants share the engine, one whose prompts stay out of the others' prefix cache
    is served the Messages API only by an engine that carries cache_salt through it (vLLM 0.18.0's
    converts the request to a chat completion without it): elsewhere its prompts would share the
    cache after all."""
    if _version_at_least(engine_version, MESSAGES_SALT_SINCE):
        return
    raise errors.ApiError.of(
        errors.ErrorCode.UNSUPPORTED_PARAMETER,
        f"This engine (vLLM {engine_version or 'of unknown version'}) cannot keep a tenant's prompts out of "
        "the shared prefix cache on the Messages API, and this tenant's are kept private: use "
        "/v1/chat/completions, or ask the operator for `prefix_cache: shared`.",
    )


def _version_at_least(version: str | None, floor: tuple[int, int]) -> bool:
    """Whether a vLLM version string ("0.32.0", "0.18.0+ascend") is at least major.minor `floor`;
    an unknown or unreadable one is not."""
    if version is None:
        return False
    try:
        major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= floor


def spent(record: RequestRecord, demand: Demand | None) -> int:
    """What a request cost its tenant's tokens per minute: the engine's usage when it reported it;
    nothing for a request the engine never got or refused (its 4xx); for a client that left before
    the usage came, what it reserved, at least its estimated prompt and the tokens relayed (leaving
    just before the end must not make a generation free); for an engine that failed, the estimated
    prompt and the tokens relayed; for an API that always reports usage and did not (its report past
    the accounting's cap, relay/typed_events.py), at least the whole reservation."""
    if demand is None or not record.sent_at:
        return 0
    if record.usage_missing:
        return max(demand.tokens, demand.prompt_tokens + record.tokens_seen)
    if record.completion_tokens is not None:
        prompt = record.prompt_tokens if record.prompt_tokens is not None else demand.prompt_tokens
        return prompt + record.completion_tokens
    seen = demand.prompt_tokens + record.tokens_seen
    if record.client_disconnected:
        return max(demand.tokens, seen)
    if 400 <= record.status < 500:
        return 0
    return seen
