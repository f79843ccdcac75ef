"""Each tenant's prefix-cache salt: vLLM's `cache_salt`, set on every generation by the sidecar.

vLLM's prefix cache is shared by every request of an engine: a request whose prompt starts like an
earlier one's is answered faster, and that difference lets one tenant time its way through another
tenant's prompts, a block of 16 tokens at a time. vLLM mixes a request's `cache_salt` into the hash
of its first block, so requests with different salts never hit each other's blocks. The salt is an
HMAC of the tenant's name under a secret the process draws at start (never sent to clients, never
the same across restarts, which only cost a cold cache); a client's own salt is overwritten. Tenants
whose file entry says `prefix_cache: shared` get no salt: they share the cache with one another,
never with a salted tenant.
"""

from __future__ import annotations

import hashlib
import hmac
import os

from palmyra_serve.sidecar.tenants.config import TenantSpec


class CacheSalts:
    __slots__ = ("_by_name", "_secret")

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret if secret is not None else os.urandom(32)
        self._by_name: dict[str, str] = {}

    def of(self, tenant: TenantSpec) -> str | None:
        """The salt for `tenant`'s generations (None: it shares the unsalted cache)."""
        if tenant.prefix_cache == "shared":
            return None
        salt = self._by_name.get(tenant.name)
        if salt is None:
            salt = hmac.new(self._secret, tenant.name.encode(), hashlib.sha256).hexdigest()[:32]
            if len(self._by_name) < 4096:  # bounded whatever the reloads name
                self._by_name[tenant.name] = salt
        return salt
