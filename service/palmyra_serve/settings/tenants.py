"""The tenants settings, one group of palmyra_serve.settings.Settings."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings

from palmyra_serve.settings.basics import BASIC


class TenantsSettings(BaseSettings):
    """Tenants: named clients, their quotas and the Redis the replicas share them through
    (docs/tenants.md)."""

    tenants_file: Path | None = Field(
        None,
        description="YAML file of named tenants: their keys as sha256 digests, their limits, weight and priority; "
        "re-read when it changes (an invalid new file is logged and the previous one kept). Keys from api_keys "
        "and api_keys_file belong to the tenant `default`.",
        json_schema_extra=BASIC,
    )
    quota_reserve_tokens: int = Field(
        256,
        ge=0,
        description="Completion tokens a generation that sets no max_tokens reserves against its tenant's "
        "tokens per minute until its real usage is known.",
    )
    quota_redis_url: str | None = Field(
        None,
        description="Redis that holds every tenant's quota windows, shared by all replicas (redis:// or rediss:// "
        "for TLS; no password in it); unset: each replica counts alone (right for one replica).",
    )
    quota_redis_password_file: Path | None = Field(
        None, description="File holding the Redis password (a mounted secret)."
    )
    quota_redis_ca_file: Path | None = Field(None, description="CA bundle that verifies a rediss:// server.")
    quota_redis_timeout_s: float = Field(
        0.25, gt=0, description="Longest a quota call to Redis may take before this replica counts alone."
    )
    quota_redis_prefix: str = Field(
        "palmyra", description="Prefix of the Redis keys (one per deployment sharing a Redis)."
    )
    quota_replicas: int = Field(
        1,
        ge=1,
        description="Replicas sharing the limits: while Redis is unreachable each enforces 1/replicas of every "
        "tenant limit (set it to the replica count, or an autoscaler's maximum).",
    )
    priority_scheduling: bool = Field(
        False,
        description="Run the engine with --scheduling-policy priority and set every generation's priority to "
        "its tenant's (a client's own priority is replaced).",
    )
