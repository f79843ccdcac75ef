"""Quotas as the settings describe them: this replica's own windows, or Redis shared by all."""

from __future__ import annotations

from palmyra_serve.settings import Settings
from palmyra_serve.sidecar.tenants.quota import Quotas
from palmyra_serve.sidecar.tenants.redis_store import RedisStore, client


def build_quotas(settings: Settings) -> Quotas:
    """Connecting is lazy: a Redis that is down at start is the same as one that goes down later
    (this replica's share until it answers), never a reason not to start."""
    remote = None
    if settings.quota_redis_url:
        redis = client(
            settings.quota_redis_url,
            settings.quota_redis_password_file,
            settings.quota_redis_ca_file,
            settings.quota_redis_timeout_s,
        )
        remote = RedisStore(redis, settings.quota_redis_prefix, settings.quota_redis_timeout_s)
    return Quotas(remote, settings.quota_replicas, settings.retry_after_max_s)
